#include "agent/hooks/native_callers.h"

#include <errno.h>
#include <link.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <unordered_map>
#include <vector>

namespace tidemark::agent::native_callers {
namespace {

struct Range {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive
  uint32_t nameIid = 0;
  bool tensorAllocator = false;
};

// Published once built and never changed; a newer one replaces it. Old ones are kept (a hook may
// still read one): at most a few per process, one per identification.
struct CallerMap {
  std::vector<Range> ranges;  // sorted by begin, disjoint
  uint32_t laterIid = 0;      // objects loaded after the map was made
};
std::atomic<const CallerMap*> g_map{nullptr};

// The early log: (address, caller) of the first kEarlyCallers allocations recorded before
// identification. In .bss: pages are touched only as entries are written.
struct EarlyCaller {
  std::atomic<uint64_t> address{0};  // written last (release): 0 until the entry is whole
  uint64_t caller = 0;
};
EarlyCaller g_early[kEarlyCallers];
std::atomic<uint32_t> g_earlyTaken{0};  // may run past kEarlyCallers: the log overflowed

void noteEarly(uint64_t address, const void* caller) noexcept {
  // A load first: once full, the log costs a shared read, not a contended increment.
  if (g_earlyTaken.load(std::memory_order_relaxed) > kEarlyCallers) return;
  const uint32_t i = g_earlyTaken.fetch_add(1, std::memory_order_relaxed);
  if (i >= kEarlyCallers) return;
  g_early[i].caller = reinterpret_cast<uint64_t>(caller);
  g_early[i].address.store(address, std::memory_order_release);
}

uint32_t nameIn(const CallerMap& map, uint64_t at) noexcept {
  const auto& ranges = map.ranges;
  // The last range beginning at or before the caller.
  size_t lo = 0, hi = ranges.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (ranges[mid].begin <= at) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo == 0 || at >= ranges[lo - 1].end) return map.laterIid;
  const Range& r = ranges[lo - 1];
  return r.tensorAllocator ? 0 : r.nameIid;
}

std::string baseName(const char* path) {
  const std::string p = path != nullptr ? path : "";
  const size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

struct Scan {
  std::string_view prefix;
  std::vector<std::pair<Range, std::string>> ranges;  // with each object's file name
  bool found = false;
};

int visitObject(dl_phdr_info* info, size_t, void* data) {
  auto* scan = static_cast<Scan*>(data);
  // The main program has an empty name here; the vDSO's is "linux-vdso.so.1".
  std::string name = baseName(info->dlpi_name);
  if (name.empty()) name = baseName(program_invocation_name);
  const bool tensor = !scan->prefix.empty() && name.rfind(scan->prefix, 0) == 0;
  scan->found = scan->found || tensor;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD || (ph.p_flags & PF_X) == 0 || ph.p_memsz == 0) continue;
    Range r;
    r.begin = info->dlpi_addr + ph.p_vaddr;
    r.end = r.begin + ph.p_memsz;
    r.tensorAllocator = tensor;
    scan->ranges.emplace_back(r, name);
  }
  return 0;
}

}  // namespace

bool identifyTensorAllocator(std::string_view libraryPrefix,
                             const std::function<uint32_t(std::string_view)>& intern,
                             const std::function<void(uint64_t, uint32_t)>& earlyBlock) {
  Scan scan;
  scan.prefix = libraryPrefix;
  dl_iterate_phdr(visitObject, &scan);
  if (!scan.found) return false;
  auto* map = new CallerMap;
  for (auto& [range, name] : scan.ranges) {
    Range r = range;
    if (!r.tensorAllocator) r.nameIid = intern("[native] " + name);
    map->ranges.push_back(r);
  }
  std::sort(map->ranges.begin(), map->ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  map->laterIid = intern("[native] (a library loaded later)");
  const bool first = g_map.load(std::memory_order_acquire) == nullptr;
  g_map.store(map, std::memory_order_release);  // the old map stays readable (see CallerMap)
  // The early log, once: hooks stop writing it now (an allocation that read no map a moment ago
  // may still note itself, and stays untagged).
  const uint32_t taken = g_earlyTaken.load(std::memory_order_acquire);
  if (first && taken <= kEarlyCallers) {
    std::unordered_map<uint64_t, uint64_t> lastCaller;
    for (uint32_t i = 0; i < taken; ++i) {
      const uint64_t address = g_early[i].address.load(std::memory_order_acquire);
      if (address != 0) lastCaller[address] = g_early[i].caller;
    }
    for (const auto& [address, caller] : lastCaller) {
      if (const uint32_t name = nameIn(*map, caller); name != 0) earlyBlock(address, name);
    }
  }
  return true;
}

uint32_t nativeNameOf(uint64_t address, const void* caller) noexcept {
  const CallerMap* map = g_map.load(std::memory_order_acquire);
  if (map == nullptr) {
    noteEarly(address, caller);
    return 0;
  }
  return nameIn(*map, reinterpret_cast<uint64_t>(caller));
}

void reset() noexcept {
  g_map.store(nullptr, std::memory_order_release);
  const uint32_t taken = std::min(g_earlyTaken.load(std::memory_order_acquire), kEarlyCallers);
  for (uint32_t i = 0; i < taken; ++i) g_early[i].address.store(0, std::memory_order_relaxed);
  g_earlyTaken.store(0, std::memory_order_release);
}

}  // namespace tidemark::agent::native_callers
