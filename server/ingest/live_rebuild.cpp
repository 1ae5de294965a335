#include "server/ingest/live_rebuild.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <queue>
#include <semaphore>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "server/store/recording_stream.h"
#include "src/core/external_sort.h"
#include "src/core/scope_sweep.h"

namespace tidemark::server {

namespace {

constexpr std::ptrdiff_t kRebuildsAtOnce = 2;
std::counting_semaphore<kRebuildsAtOnce> g_rebuildSlots(kRebuildsAtOnce);

using core::kOpenSeq;
using core::LiveCall;

struct ByAllocSeq {
  bool operator()(const core::Block& a, const core::Block& b) const {
    return a.allocSeq < b.allocSeq;
  }
};

// Intervals as the ingest stood at the cut: the stored ones that ended before it, and those the
// checkpoint holds open, in begin order.
template <typename T>
class AtCut : public core::Cursor<T> {
 public:
  AtCut(std::unique_ptr<core::Cursor<T>> stored, uint64_t cut, std::vector<T> open)
      : m_stored(std::move(stored)), m_cut(cut), m_open(std::move(open)) {
    std::sort(m_open.begin(), m_open.end(),
              [](const T& a, const T& b) { return a.beginSeq < b.beginSeq; });
    m_have = advance();
  }
  bool next(T& out) override {
    if (m_have && (m_next >= m_open.size() || m_row.beginSeq < m_open[m_next].beginSeq)) {
      out = m_row;
      m_have = advance();
      return true;
    }
    if (m_next < m_open.size()) {
      out = m_open[m_next++];
      return true;
    }
    return false;
  }

 private:
  bool advance() {
    while (m_stored->next(m_row)) {
      if (m_row.endSeq < m_cut) return true;  // later ends: open at the cut, or after it
    }
    return false;
  }
  std::unique_ptr<core::Cursor<T>> m_stored;
  uint64_t m_cut;
  std::vector<T> m_open;
  size_t m_next = 0;
  T m_row{};
  bool m_have = false;
};

// Begins of intervals in order with their ends from a heap, innermost (begun last) first at one
// sequence number, as the ingest closes them.
template <typename T>
class BeginsAndEnds {
 public:
  explicit BeginsAndEnds(std::unique_ptr<core::Cursor<T>> cursor) : m_cursor(std::move(cursor)) {
    m_have = m_cursor->next(m_row);
  }
  uint64_t nextBegin() const { return m_have ? m_row.beginSeq : kOpenSeq; }
  uint64_t nextEnd() const { return m_ends.empty() ? kOpenSeq : m_ends.top().endSeq; }
  T takeBegin() {
    T out = m_row;
    if (out.endSeq != kOpenSeq) m_ends.push(out);
    m_have = m_cursor->next(m_row);
    return out;
  }
  T takeEnd() {
    T out = m_ends.top();
    m_ends.pop();
    return out;
  }

 private:
  struct Later {
    bool operator()(const T& a, const T& b) const {
      return std::tie(a.endSeq, b.beginSeq) > std::tie(b.endSeq, a.beginSeq);
    }
  };
  std::unique_ptr<core::Cursor<T>> m_cursor;
  T m_row{};
  bool m_have = false;
  std::priority_queue<T, std::vector<T>, Later> m_ends;
};

class VectorCursor : public core::Cursor<core::StepInterval> {
 public:
  explicit VectorCursor(std::vector<core::StepInterval> v) : m_v(std::move(v)) {}
  bool next(core::StepInterval& out) override {
    if (m_i >= m_v.size()) return false;
    out = m_v[m_i++];
    return true;
  }

 private:
  std::vector<core::StepInterval> m_v;
  size_t m_i = 0;
};

}  // namespace

LiveRebuild::LiveRebuild(Options options, v1::IngestCheckpoint state, std::vector<BlockRow> open)
    : m_options(std::move(options)), m_state(std::move(state)), m_open(std::move(open)) {
  m_thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "td-rebuild");
    run();
  });
}

LiveRebuild::~LiveRebuild() {
  m_cancel = true;
  if (m_thread.joinable()) m_thread.join();
  if (m_spillFd >= 0) ::close(m_spillFd);
}

bool LiveRebuild::spillLocked() {
  if (m_spillFd < 0) m_spillFd = core::openScratchFile(m_options.tempDir);
  if (m_spillFd < 0) return false;
  const std::vector<LiveCall> calls(m_log.begin(), m_log.end());
  if (!core::writeAllAt(m_spillFd, calls.data(), calls.size() * sizeof(LiveCall),
                        m_spilled * sizeof(LiveCall)))
    return false;
  m_spilled += calls.size();
  m_log.clear();
  return true;
}

std::vector<LiveCall> LiveRebuild::readSpilledLocked(size_t max) {
  std::vector<LiveCall> calls(std::min<uint64_t>(max, m_spilled - m_spillRead));
  if (!core::readAllAt(m_spillFd, calls.data(), calls.size() * sizeof(LiveCall),
                       m_spillRead * sizeof(LiveCall)))
    return {};
  m_spillRead += calls.size();
  return calls;
}

void LiveRebuild::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!m_error.empty()) return;
  m_error = why;
  m_cancel = true;
  m_log.clear();
  m_names.clear();
  m_built.reset();
  if (!m_options.quiet) {
    std::fprintf(stderr, "tidemarkd: session %lld: its live analysis is not built again (%s)\n",
                 static_cast<long long>(m_options.sessionId), why.c_str());
  }
}

bool LiveRebuild::log(const core::LiveCall& call) {
  std::unique_lock<std::mutex> lock(m_mutex);
  if (!m_error.empty()) return false;
  std::string why;
  if (m_spilled - m_spillRead + m_log.size() >= m_options.maxLogCalls) {
    why = "the session went on faster than the store could be read: " +
          std::to_string(m_options.maxLogCalls) + " events waited";
  } else {
    m_log.push_back(call);
    if (m_log.size() < m_options.memoryLogCalls || spillLocked()) return true;
    why = "what came meanwhile could not be written to " + m_options.tempDir + ": " +
          std::strerror(errno);
  }
  lock.unlock();
  fail(why);
  return false;
}

void LiveRebuild::logName(uint32_t iid, std::string text) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (m_error.empty()) m_names.emplace_back(iid, std::move(text));
}

std::unique_ptr<core::LiveAnalysis> LiveRebuild::takeIfCaughtUp() {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!m_caughtUp || !m_built) return nullptr;
  for (auto& [iid, text] : m_names) m_built->name(iid, std::move(text));
  m_names.clear();
  while (m_spillRead < m_spilled) {  // spilled since the hand-over
    const std::vector<LiveCall> calls = readSpilledLocked(kReadCalls);
    if (calls.empty()) return nullptr;  // unreadable: never taken on
    for (const LiveCall& c : calls) c.applyTo(*m_built);
  }
  for (const LiveCall& c : m_log) c.applyTo(*m_built);
  m_log.clear();
  return std::move(m_built);
}

bool LiveRebuild::failed() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return !m_error.empty();
}

std::string LiveRebuild::error() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_error;
}

void LiveRebuild::run() {
  // Sessions resumed together after a restart are read one after another, kRebuildsAtOnce at a
  // time: their sorts' memory stays that many shares whatever their number.
  while (!g_rebuildSlots.try_acquire_for(std::chrono::milliseconds(50))) {
    if (m_cancel) return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto live = std::make_unique<core::LiveAnalysis>(m_options.windowEdges);
  live->answerOnly("its live analysis was built again after a restart of the daemon");
  const bool replayed = replayStore(*live);
  g_rebuildSlots.release();
  if (!replayed) return;
  // The log, until what is left of it is small enough for the ingest to apply under its lock.
  for (;;) {
    std::vector<LiveCall> calls;
    std::vector<std::pair<uint32_t, std::string>> names;
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      if (!m_error.empty()) return;
      if (m_cancel) return;
      if (m_spillRead < m_spilled) {  // the file first: its calls came before the memory's
        calls = readSpilledLocked(kReadCalls);
      } else if (m_log.size() <= kHandOverCalls) {
        m_built = std::move(live);
        m_caughtUp = true;
        break;
      } else {
        calls.assign(m_log.begin(), m_log.end());
        m_log.clear();
      }
      std::swap(names, m_names);
    }
    if (calls.empty()) {  // the file's part could not be read
      fail("what came meanwhile could not be read back from " + m_options.tempDir);
      return;
    }
    for (auto& [iid, text] : names) live->name(iid, std::move(text));
    for (const LiveCall& c : calls) c.applyTo(*live);
  }
  if (!m_options.quiet) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr,
                 "tidemarkd: session %lld: its live analysis was built again from the store "
                 "(%lld events in %.1f s)\n",
                 static_cast<long long>(m_options.sessionId),
                 static_cast<long long>(m_replayed.load()), s);
  }
}

bool LiveRebuild::replayStore(core::LiveAnalysis& live) {
  const uint64_t cut = m_state.next_seq();
  auto opened = StoredRecordingStream::open(m_options.dbPath, m_options.sessionId);
  if (!opened.ok()) {
    fail("the store could not be read: " + std::string(opened.status().message()));
    return false;
  }
  StoredRecordingStream& in = **opened;
  for (const auto& [iid, text] : in.names()) live.name(iid, text);

  // The blocks by allocation: those the checkpoint holds open, and the stored ones that were
  // freed (or allocated over) before the cut. A row written since (the session goes on) is
  // either after the cut or one of the open ones.
  using OpenKey = std::tuple<int, int32_t, uint64_t, uint64_t>;  // kind, device, address, alloc
  absl::flat_hash_set<OpenKey> openAtCut;
  core::ExternalSorter<core::Block, ByAllocSeq> blocks(m_options.tempDir, m_options.sortBytes);
  for (const BlockRow& r : m_open) {
    core::Block b = r.toBlock();
    openAtCut.insert({static_cast<int>(b.kind), b.device, b.address, b.allocSeq});
    b.freeSeq = kOpenSeq;
    if (!blocks.add(b)) break;
  }
  {
    auto cursor = in.blocks();
    core::Block b;
    for (int64_t n = 0; cursor->next(b); ++n) {
      if ((n & 0xffff) == 0 && m_cancel) return false;
      const bool keep =
          b.freeSeq != kOpenSeq
              ? b.freeSeq < cut
              : b.allocSeq < cut && !openAtCut.contains(OpenKey{static_cast<int>(b.kind), b.device,
                                                                b.address, b.allocSeq});
      if (keep && !blocks.add(b)) break;
    }
  }
  if (!in.error().empty() || !blocks.finish()) {
    fail(in.error().empty() ? blocks.error() : in.error());
    return false;
  }

  // What the checkpoint holds open: scopes by kind and thread, phases by thread, steps.
  std::vector<core::ScopeRef> openModules, openOps;
  for (const v1::CheckpointStack& s : m_state.scope_stacks()) {
    const auto kind = static_cast<int>(s.key() >> 32);
    for (const v1::CheckpointInterval& r : s.open()) {
      core::ScopeRef ref;
      ref.beginSeq = r.begin_seq();
      ref.threadId = r.thread_id();
      ref.nameId = r.name_iid();
      if (kind == v1::SCOPE_KIND_MODULE) openModules.push_back(ref);
      if (kind == v1::SCOPE_KIND_OP) openOps.push_back(ref);
    }
  }
  std::vector<core::PhaseInterval> openPhases;
  for (const v1::CheckpointStack& s : m_state.phase_stacks()) {
    for (const v1::CheckpointInterval& r : s.open()) {
      core::PhaseInterval p;
      p.beginSeq = r.begin_seq();
      p.beginTsNs = r.begin_ts_ns();
      p.threadId = r.thread_id();
      p.phase = core::phaseFromWire(r.phase()).value_or(core::Phase::kNone);
      openPhases.push_back(p);
    }
  }
  std::vector<core::StepInterval> steps;
  for (const core::StepInterval& s : in.steps())
    if (s.endSeq < cut) steps.push_back(s);
  for (const v1::CheckpointStep& p : m_state.open_steps()) {
    core::StepInterval s;
    s.step = p.step();
    s.beginSeq = p.begin_seq();
    s.beginTsNs = p.begin_ts_ns();
    steps.push_back(s);
  }
  std::sort(steps.begin(), steps.end(),
            [](const auto& a, const auto& b) { return a.beginSeq < b.beginSeq; });

  using ScopesAtCut = AtCut<core::ScopeRef>;
  core::ThreadScopeSweep moduleAt(
      std::make_unique<ScopesAtCut>(in.scopes(false), cut, openModules));
  core::ThreadScopeSweep opAt(std::make_unique<ScopesAtCut>(in.scopes(true), cut, openOps));
  if (opAt.any()) live.opScopeSeen();
  BeginsAndEnds<core::ScopeRef> modules(
      std::make_unique<ScopesAtCut>(in.scopes(false), cut, std::move(openModules)));
  BeginsAndEnds<core::PhaseInterval> phases(
      std::make_unique<AtCut<core::PhaseInterval>>(in.phases(), cut, std::move(openPhases)));
  BeginsAndEnds<core::StepInterval> stepMarks(std::make_unique<VectorCursor>(std::move(steps)));
  auto tags = in.tags();
  core::TagRef tag;
  bool haveTag = tags->next(tag) && tag.seq < cut;
  auto reader = blocks.read();
  core::Block block;
  bool haveBlock = reader.next(block);
  struct Free {
    uint64_t seq;
    int64_t tsNs;
    uint64_t address;
    int32_t device;
    core::MemoryKind kind;
    bool operator>(const Free& o) const { return seq > o.seq; }
  };
  std::priority_queue<Free, std::vector<Free>, std::greater<>> frees;

  for (int64_t n = 1;; ++n) {
    if ((n & 0xffff) == 0) {
      if (m_cancel) return false;
      m_replayed.store(n);
    }
    const uint64_t next[] = {haveBlock ? block.allocSeq : kOpenSeq,
                             frees.empty() ? kOpenSeq : frees.top().seq,
                             haveTag ? tag.seq : kOpenSeq,
                             phases.nextBegin(),
                             phases.nextEnd(),
                             modules.nextBegin(),
                             modules.nextEnd(),
                             stepMarks.nextBegin(),
                             stepMarks.nextEnd()};
    const auto first = std::min_element(std::begin(next), std::end(next));
    if (*first == kOpenSeq) {
      m_replayed.store(n - 1);
      break;
    }
    switch (first - std::begin(next)) {
      case 0: {
        const core::ScopeRef* module = moduleAt.innermostAt(block.threadId, block.allocSeq);
        const core::ScopeRef* op = opAt.innermostAt(block.threadId, block.allocSeq);
        live.alloc(block, module ? module->nameId : 0, op ? op->nameId : 0);
        if (block.freeSeq != kOpenSeq)
          frees.push({block.freeSeq, block.freeTsNs, block.address, block.device, block.kind});
        haveBlock = reader.next(block);
        break;
      }
      case 1: {
        const Free f = frees.top();
        frees.pop();
        live.free(f.kind, f.device, f.address, f.seq, f.tsNs);
        break;
      }
      case 2:
        live.tag(tag.seq, tag.address, tag.category, tag.nameId);
        haveTag = tags->next(tag) && tag.seq < cut;
        break;
      case 3: {
        const core::PhaseInterval p = phases.takeBegin();
        live.phaseBegin(p.beginSeq, p.phase);
        break;
      }
      case 4: {
        const core::PhaseInterval p = phases.takeEnd();
        live.phaseEnd(p.beginSeq, p.endSeq);
        break;
      }
      case 5: {
        const core::ScopeRef s = modules.takeBegin();
        live.moduleBegin(s.beginSeq, s.nameId);
        break;
      }
      case 6:
        live.moduleEnd(modules.takeEnd().beginSeq);
        break;
      case 7: {
        const core::StepInterval s = stepMarks.takeBegin();
        live.stepBegin(s.step, s.beginSeq, s.beginTsNs);
        break;
      }
      case 8: {
        const core::StepInterval s = stepMarks.takeEnd();
        live.stepEnd(s.step, s.endSeq, s.endTsNs);
        break;
      }
    }
  }
  if (!reader.error().empty() || !in.error().empty()) {
    fail(reader.error().empty() ? in.error() : reader.error());
    return false;
  }
  return true;
}

}  // namespace tidemark::server
