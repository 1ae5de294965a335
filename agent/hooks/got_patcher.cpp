#include "agent/hooks/got_patcher.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>

namespace tidemark::agent {
namespace {

struct Mapping {
  uintptr_t begin, end;
  int prot;
};

std::vector<Mapping> readMappings() {
  std::vector<Mapping> out;
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long begin = 0, end = 0;
    char perms[5] = {};
    if (std::sscanf(line, "%lx-%lx %4s", &begin, &end, perms) != 3) continue;
    int prot = 0;
    if (perms[0] == 'r') prot |= PROT_READ;
    if (perms[1] == 'w') prot |= PROT_WRITE;
    if (perms[2] == 'x') prot |= PROT_EXEC;
    out.push_back({begin, end, prot});
  }
  std::fclose(f);
  return out;
}

int protectionOf(const std::vector<Mapping>& maps, uintptr_t address) {
  for (const Mapping& m : maps)
    if (address >= m.begin && address < m.end) return m.prot;
  return -1;
}

// Writes one GOT entry, making its page writable for the write when it is not.
bool writeSlot(const std::vector<Mapping>& maps, uintptr_t slot, uintptr_t value) {
  const int prot = protectionOf(maps, slot);
  if (prot < 0) return false;
  const long page = sysconf(_SC_PAGESIZE);
  void* pageStart = reinterpret_cast<void*>(slot & ~static_cast<uintptr_t>(page - 1));
  if (!(prot & PROT_WRITE) &&
      mprotect(pageStart, static_cast<size_t>(page), prot | PROT_WRITE) != 0)
    return false;
  // An aligned 8-byte store: a thread calling through the entry sees the old or the new value.
  reinterpret_cast<std::atomic<uintptr_t>*>(slot)->store(value, std::memory_order_release);
  if (!(prot & PROT_WRITE)) mprotect(pageStart, static_cast<size_t>(page), prot);
  return true;
}

struct Visit {
  const std::vector<GotPatcher::Hook>* hooks;
  const std::vector<Mapping>* maps;
  uintptr_t self;  // an address inside the agent
  std::vector<GotPatcher::Patch>* patches;
  std::vector<std::string>* objects;
};

bool skipObject(const dl_phdr_info* info, uintptr_t self) {
  const char* name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  if (std::strstr(name, "linux-vdso") != nullptr || std::strstr(name, "/ld-linux") != nullptr ||
      std::strstr(name, "/libc.so") != nullptr)
    return true;
  // The agent itself: its calls to the allocator must reach the real functions.
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t begin = info->dlpi_addr + ph.p_vaddr;
    if (self >= begin && self < begin + ph.p_memsz) return true;
  }
  return false;
}

int visitObject(dl_phdr_info* info, size_t, void* data) {
  auto* v = static_cast<Visit*>(data);
  if (skipObject(info, v->self)) return 0;
  const uintptr_t bias = info->dlpi_addr;
  const ElfW(Dyn)* dyn = nullptr;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
      dyn = reinterpret_cast<const ElfW(Dyn)*>(bias + info->dlpi_phdr[i].p_vaddr);
  if (dyn == nullptr) return 0;
  // The dynamic linker relocates these entries in place on x86-64; an unrelocated one (below
  // the bias) is relative.
  auto address = [bias](ElfW(Addr) a) -> uintptr_t { return a < bias ? a + bias : a; };
  const ElfW(Sym)* symtab = nullptr;
  const char* strtab = nullptr;
  const ElfW(Rela)* jmprel = nullptr;
  const ElfW(Rela)* rela = nullptr;
  size_t jmprelSize = 0, relaSize = 0;
  for (const ElfW(Dyn)* d = dyn; d->d_tag != DT_NULL; ++d) {
    switch (d->d_tag) {
      case DT_SYMTAB:
        symtab = reinterpret_cast<const ElfW(Sym)*>(address(d->d_un.d_ptr));
        break;
      case DT_STRTAB:
        strtab = reinterpret_cast<const char*>(address(d->d_un.d_ptr));
        break;
      case DT_JMPREL:
        jmprel = reinterpret_cast<const ElfW(Rela)*>(address(d->d_un.d_ptr));
        break;
      case DT_PLTRELSZ:
        jmprelSize = d->d_un.d_val;
        break;
      case DT_RELA:
        rela = reinterpret_cast<const ElfW(Rela)*>(address(d->d_un.d_ptr));
        break;
      case DT_RELASZ:
        relaSize = d->d_un.d_val;
        break;
      default:
        break;
    }
  }
  if (symtab == nullptr || strtab == nullptr) return 0;
  size_t patched = 0;
  auto scan = [&](const ElfW(Rela) * table, size_t bytes) {
    if (table == nullptr) return;
    for (size_t i = 0; i < bytes / sizeof(ElfW(Rela)); ++i) {
      const auto type = ELF64_R_TYPE(table[i].r_info);
      if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
      const char* name = strtab + symtab[ELF64_R_SYM(table[i].r_info)].st_name;
      for (const GotPatcher::Hook& h : *v->hooks) {
        if (std::strcmp(name, h.symbol) != 0) continue;
        const uintptr_t slot = bias + table[i].r_offset;
        const uintptr_t original = *reinterpret_cast<const uintptr_t*>(slot);
        if (writeSlot(*v->maps, slot, reinterpret_cast<uintptr_t>(h.replacement))) {
          v->patches->push_back({slot, original});
          ++patched;
        }
      }
    }
  };
  scan(jmprel, jmprelSize);
  scan(rela, relaSize);
  const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
  if (patched > 0 && std::find(v->objects->begin(), v->objects->end(), name) == v->objects->end())
    v->objects->push_back(name);
  return 0;
}

}  // namespace

void* firstDefinition(const char* symbol) {
  void* self = dlopen(nullptr, RTLD_LAZY | RTLD_NOLOAD);
  link_map* map = nullptr;
  if (self == nullptr || dlinfo(self, RTLD_DI_LINKMAP, &map) != 0) return nullptr;
  Dl_info mine{};
  dladdr(reinterpret_cast<void*>(&readMappings), &mine);
  void* found = nullptr;
  // The first entry is the main program.
  for (link_map* l = map != nullptr ? map->l_next : nullptr; l != nullptr && found == nullptr;
       l = l->l_next) {
    if (l->l_name == nullptr || l->l_name[0] == '\0') continue;
    if (mine.dli_fname != nullptr && std::strcmp(l->l_name, mine.dli_fname) == 0) continue;
    void* h = dlopen(l->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) continue;
    void* p = dlsym(h, symbol);
    Dl_info where{};
    // Defined in this object itself, not in one of its dependencies.
    if (p != nullptr && dladdr(p, &where) != 0 && where.dli_fname != nullptr &&
        std::strcmp(where.dli_fname, l->l_name) == 0)
      found = p;
    dlclose(h);
  }
  dlclose(self);
  return found;
}

size_t GotPatcher::patchAll(const std::vector<Hook>& hooks) {
  const std::vector<Mapping> maps = readMappings();
  const size_t before = m_patches.size();
  Visit v{&hooks, &maps, reinterpret_cast<uintptr_t>(&readMappings), &m_patches, &m_objects};
  dl_iterate_phdr(&visitObject, &v);
  return m_patches.size() - before;
}

void GotPatcher::restore() {
  const std::vector<Mapping> maps = readMappings();
  for (auto it = m_patches.rbegin(); it != m_patches.rend(); ++it)
    writeSlot(maps, it->slot, it->original);
  m_patches.clear();
  m_objects.clear();
}

}  // namespace tidemark::agent
