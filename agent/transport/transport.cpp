#include "agent/transport/transport.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include <absl/synchronization/mutex.h>

#include "agent/transport/batch_encoder.h"
#include "client/channel.h"
#include "src/base/clock.h"
#include "src/base/daemon_address.h"
#include "src/base/private_dir.h"

namespace tidemark::agent {

namespace {
// What the process must be able to map before the sender calls into gRPC. gRPC's core ends the
// process when an allocation fails inside it (the exception crosses its C interface), so while
// the job is at its memory limit (`ulimit -v`, strict overcommit) the sender leaves the link
// alone: records wait in the buffer (memory, then its file) until memory is back.
constexpr size_t kLinkHeadroomBytes = 64u << 20;

// Whether kLinkHeadroomBytes could be mapped now (mapped and given back at once: a probe).
bool roomForTheLink() noexcept {
  void* p = ::mmap(nullptr, kLinkHeadroomBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  ::munmap(p, kLinkHeadroomBytes);
  return true;
}

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "2 s", "0.5 s": a duration in milliseconds for a message.
std::string seconds(int ms) {
  char text[32];
  std::snprintf(text, sizeof text, ms % 1000 == 0 ? "%.0f s" : "%.1f s", ms / 1000.0);
  return text;
}

constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kHandshakeMagic = 0x54444D4B;  // "TDMK"

// The Ingest stream's method name (the stream is written with AgentMessages already serialized:
// the agent encodes its batches itself, batch_encoder.h).
const std::string& streamMethodName() {
  static const std::string name = std::string("/") + v1::Ingest::service_full_name() + "/Stream";
  return name;
}

// A number no other session of this user is likely to have drawn (never 0: none).
uint64_t drawInstance() {
  uint64_t n = 0;
  if (::getrandom(&n, sizeof n, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof n)) {
    n = static_cast<uint64_t>(base::monotonicNs()) * 0x9E3779B97F4A7C15ull ^
        (static_cast<uint64_t>(::getpid()) << 32);
  }
  return n != 0 ? n : 1;
}
}  // namespace

Transport::Transport(Recorder& recorder, Interner& interner, TransportConfig config)
    : m_recorder(recorder),
      m_interner(interner),
      m_config(std::move(config)),
      m_log(m_config.bufferMemoryBytes, m_config.bufferDir, m_config.bufferFileBytes) {
  m_config.handshake.set_magic(kHandshakeMagic);
  m_config.handshake.set_protocol_version(kProtocolVersion);
  m_nextEventSeq = std::max<uint64_t>(1, m_config.firstEventSeq);
  m_instance = drawInstance();
  if (m_config.schedule) {
    m_filter = std::make_unique<CaptureFilter>(
        *m_config.schedule, [this](uint64_t n) { return m_recorder.reserveSeqs(n); },
        m_interner.intern("reserved_bytes"));
  }
}

Transport::~Transport() = default;

void Transport::start() {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (m_started) return;
  m_started = true;
  spawnThreads();
}

void Transport::spawnThreads() {
  // The agent's threads (and gRPC's, which they create) take no signals: the job's handlers
  // keep running on the job's own threads.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  // abseil's check of lock order (on where abseil is built without NDEBUG, as Debian's is) keeps
  // a graph of every mutex gRPC locks, grown by mmap, and ends the process when an mmap fails:
  // a daemon killed while the job sat at its memory limit ended the job this way, from the
  // gRPC threads' reaction to the broken connection, in 3 runs of 4. A debugging aid that the
  // agent's calls into gRPC do not need: off (for the process: a job's own use of this abseil
  // loses the check too).
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // The channel now, and with it gRPC's own threads (its timers): a job that reaches its memory
  // limit before the first connection would leave gRPC without them, and its waits without an
  // end. (A channel that cannot be made now is tried again at each connection.)
  survive([this] { openChannel(); });
  m_recorder.collectorStarted();
  m_collector = std::thread([this] { collect(); });
  m_thread = std::thread([this] { run(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void Transport::collect() {
  t_recursionGuard = true;
  pthread_setname_np(pthread_self(), "tidemark-drain");  // as top, gdb and py-spy show it
  std::vector<Record> records;
  std::vector<Record> kept;
  for (;;) {
    const uint32_t requests = m_recorder.drainRequests();
    const uint64_t takes = m_log.takes();
    const bool last = m_collectorStop.load(std::memory_order_acquire);
    // The lossy and the degraded modes drop what the buffer has no room for, counted. Lossless,
    // a full buffer (the stream slower than the job for as long as both caps last) is not
    // added to: the rings are left full, and the job's threads wait for room in them (bounded
    // by the recorder's deadline) until the sender took some out. A pass is then kept whole,
    // past the caps by at most what the rings hold; so is the exit's last.
    const bool dropping = m_recorder.lossy() || m_recorder.degraded();
    if (!last && !dropping && m_log.full()) {
      m_heldBack.store(true, std::memory_order_relaxed);
      m_log.awaitTake(takes, m_config.flushIntervalMs);  // stopCollector wakes it too
      watchdog();
      continue;
    }
    const RecordLog::Overflow overflow =
        dropping && !last ? RecordLog::Overflow::kRefuse : RecordLog::Overflow::kKeep;
    // In the order things happened, numbered (Recorder::drainAll): into the log in one copy,
    // or through the capture filter.
    // (Nothing in a pass throws: an append that finds no memory goes to the file or counts.)
    const auto toLog = [&](const Record* taken, size_t n) {
      if (!m_filter) {
        m_log.append(taken, n, overflow);  // never throws: no memory, the file or counted
        return;
      }
      try {
        records.assign(taken, taken + n);
        kept.clear();
        m_filter->process(records, kept);
      } catch (const std::bad_alloc&) {
        // The job at its memory limit: what the filter could not sort is counted as lost
        // (an exception here would end the job).
        m_log.refuse(n);
        return;
      }
      m_log.append(kept.data(), kept.size(), overflow);
    };
    // The exit's last drain takes everything, in passes (Recorder::drainAll).
    m_recorder.drainAll(toLog, last);
    if (m_filter && last) {
      // Nothing is left waiting for a record that can no longer come.
      kept.clear();
      survive([&] { m_filter->finish(kept); });
      m_log.append(kept.data(), kept.size(), overflow);
    }
    m_recorder.notifyDrained();
    if (!m_toldShortage.load(std::memory_order_relaxed) && m_log.memoryRefusals() != 0) {
      noteShortage("its buffer's memory", false);  // counted by the buffer
    }
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      ++m_collectPasses;
    }
    watchdog();
    m_progress.notify_all();
    if (last) break;
    m_recorder.awaitDrainRequest(requests, m_config.flushIntervalMs);
  }
}

void Transport::watchdog() {
  // The hung-daemon watchdog (the sender may be blocked in a write).
  const int64_t since = m_waitingSinceNs.load(std::memory_order_acquire);
  const int64_t bound = (static_cast<int64_t>(m_config.ackTimeoutMs) + 1000) * 1000000;
  if (since != 0 && steadyNs() - since > bound && !m_watchdogFired.exchange(true)) {
    std::lock_guard<std::mutex> lock(m_contextMutex);
    if (m_context) m_context->TryCancel();
  }
}

void Transport::stopCollector() {
  // Once, from the sender's exit or from a shutdown that gave up on the sender (the others wait
  // for the first to finish).
  std::call_once(m_collectorStopped, [this] {
    m_collectorStop.store(true, std::memory_order_release);
    m_recorder.requestDrain();
    m_log.wake();
    if (m_collector.joinable()) m_collector.join();
    // This one no longer empties the rings (with none left, a full ring drops, counted).
    m_recorder.collectorStopped();
  });
}

void Transport::run() {
  // The agent's own allocations are never recorded.
  t_recursionGuard = true;
  pthread_setname_np(pthread_self(), "tidemark-send");
  // (Every step here survives the job's memory limit: tryConnect and survive() keep what a step
  // that found no memory held, and the next pass tries it again.)
  std::unique_lock<std::mutex> lock(m_mutex);
  while (!m_stopRequested) {
    lock.unlock();
    if (m_link == LinkState::kDown && std::chrono::steady_clock::now() >= m_nextConnect) {
      tryConnect();
    }
    // A stop asked meanwhile (a handshake answered late, the job already exiting): the exit's
    // own path at once — a pump here would write the window at the daemon's pace first, where
    // the exit may hand it over in a file instead.
    if (m_stopRequested.load()) {
      lock.lock();
      break;
    }
    survive([this] { pump(); });
    lock.lock();
    ++m_passes;
    m_progress.notify_all();
    // (A stop asked while this thread was busy — connecting, writing — ends the wait at once: a
    // plain wait slept a whole interval more at every exit.)
    m_wake.wait_for(lock, std::chrono::milliseconds(m_config.flushIntervalMs),
                    [this] { return m_stopRequested.load(); });
  }
  lock.unlock();

  // The exit: everything recorded until now, then the goodbye, acknowledged by the server
  // closing the stream. A broken link is retried while the exit's time allows; what no server
  // took then goes to the spool file.
  stopCollector();
  // (A step of the exit that found no memory: a pass is tried again, the handoff or the spool
  // is not — what is left is then counted as dropped.)
  if (!survive([this] { deliverRest(); })) abandonRest();
  lock.lock();
  ++m_passes;
  m_stopped = true;
  m_progress.notify_all();
}

void Transport::deliverRest() {
  // A daemon seen during the run may be restarting: retried while the exit's time allows. One
  // never seen gets one more try (the job's exit is not held up for nothing) — and the whole
  // time once it answers (a short job on a loaded machine may end before its first handshake).
  // (Asked of the kernel: a loaded machine may not have let gRPC connect yet.)
  // Nobody listening on this host's socket or port (the kernel says so at once): no try at all,
  // the run goes to the spool file without waiting.
  bool nobody = false;
  if (!m_daemonSeen) {
    m_daemonSeen = base::daemonListening(m_config.server);
    nobody = !m_daemonSeen && base::isProbedTarget(m_config.server);
  }
  const auto now = std::chrono::steady_clock::now();
  m_exitFullDeadline =
      now + std::chrono::milliseconds(std::max(500, m_config.exitTimeoutMs - 1500));
  m_exitDeadline = m_daemonSeen ? m_exitFullDeadline
                   : nobody     ? now
                                : now + std::chrono::milliseconds(300);
  const auto& deadline = m_exitDeadline;  // extended by tryConnect when a daemon answers
  if (m_link == LinkState::kDown) m_nextConnect = now;
  // Much not confirmed yet (shutdown ended the stream for it): the rest goes to the daemon in a
  // file instead of at its pace. Or decided later: once connected (a handshake still unanswered
  // at shutdown has no session yet), or by shutdown when the exit's delivery takes too long.
  bool handoffTried = false;
  const auto exitBegan = now;
  // Offered by its size, or (as shutdown decides while it waits) by an exit still delivering
  // after kHandoffAfterMs: a handshake answered that late (a loaded machine) is followed by a
  // handoff at once, not by writing the rest at the daemon's pace.
  const auto late = [&] {
    return std::chrono::steady_clock::now() - exitBegan >=
           std::chrono::milliseconds(kHandoffAfterMs);
  };
  auto tryHandoff = [&] {
    if (handoffTried || m_sessionId.load() == 0 ||
        !(m_handingOff || handoffOffered() || (late() && handoffPossible())))
      return;
    handoffTried = true;
    m_handingOff = true;
    handOff(deadline);
  };
  tryHandoff();
  while (m_link != LinkState::kRefused && m_ending == Ending::kRunning && !m_outOfTime &&
         std::chrono::steady_clock::now() < deadline) {
    if (m_handingOff) {  // shutdown decided it meanwhile
      tryHandoff();
      if (m_ending != Ending::kRunning) break;
    }
    if (m_link == LinkState::kDown) {
      if (std::chrono::steady_clock::now() < m_nextConnect) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (!tryConnect()) continue;
      tryHandoff();
      if (m_ending != Ending::kRunning) break;
    }
    if (!survive([this] { pump(); })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // memory may come back
      continue;
    }
    if (m_link != LinkState::kLive) continue;
    const bool everythingWritten =
        m_log.empty() && m_batchRecords.empty() &&
        std::all_of(m_window.begin(), m_window.end(), [](const Unacked& u) { return u.written; });
    if (!everythingWritten) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the window waits for acks
      continue;
    }
    if (closeStream(deadline)) m_ending = Ending::kDelivered;
  }
  if (m_ending == Ending::kRunning && m_link == LinkState::kLive) {
    // Connected, but the exit's time ran out before everything was acknowledged.
    endStream();
    m_linkError = "not everything was acknowledged within TIDEMARK_EXIT_TIMEOUT_MS";
  }
  if (m_ending == Ending::kRunning && m_link != LinkState::kRefused && !handoffTried &&
      handoffPossible()) {
    // Out of the exit's time with a session the daemon answered for: the rest goes to it in a
    // file, its answer given a fifth of the spool's grace (a hung daemon's silence costs the
    // exit a second), before the spool (which needs an upload).
    handoffTried = true;
    m_handingOff = true;
    handOff(std::chrono::steady_clock::now() + std::chrono::milliseconds(kSpoolGraceMs / 5));
  }
  if (m_ending == Ending::kRunning) {
    if (m_link == LinkState::kRefused) {
      // Refused for good (another protocol, not a tidemarkd): what was not delivered is lost.
      m_ending = Ending::kRefused;
      uint64_t batched = 0;
      for (const Unacked& u : m_window) batched += u.events;
      m_eventsSent -= std::min<uint64_t>(m_eventsSent.load(), batched);
      uint64_t left = batched + m_batchRecords.size();
      m_batchRecords.clear();
      std::vector<Record> records;
      while (m_log.take(records, kMaxEventsPerBatch) > 0) {
        left += records.size();
        records.clear();
      }
      m_droppedDisconnected += left;
    } else {
      spoolRest();
    }
  }
}

void Transport::pump() {
  if (!roomForTheLink()) {
    noteShortage("room for the stream");
    return;
  }
  if (m_recorder.degraded() && !m_toldDegraded && !m_config.quiet) {
    m_toldDegraded = true;
    std::fprintf(stderr,
                 "tidemark: a thread waited %d ms for the agent to make room%s; recording goes "
                 "on in degraded mode (full rings drop, counted) for the rest of the run\n",
                 m_config.ringWaitDeadlineMs,
                 m_heldBack.load(std::memory_order_relaxed)
                     ? " (its buffer had filled: the daemon took less than the job made)"
                     : "");
  }
  // Committed by the server: forgotten.
  const uint64_t acked = m_ackedSeq.load(std::memory_order_acquire);
  while (!m_window.empty() && m_window.front().batchSeq <= acked) {
    m_windowBytes -= m_window.front().cost;
    m_window.pop_front();
  }
  if (m_link == LinkState::kLive) {
    const auto now = std::chrono::steady_clock::now();
    if (m_readerDone) {
      loseLink("the server ended the stream");
    } else if (!m_window.empty() && m_window.front().written &&
               now - m_window.front().writtenAt >
                   std::chrono::milliseconds(m_config.ackTimeoutMs)) {
      loseLink("no acknowledgement for " + seconds(m_config.ackTimeoutMs) +
               ": the daemon is hung or overloaded");
    }
  }
  // Nothing else to send and every batch acknowledged: a loss or a failure counted since the
  // last report is sent alone (once: the window holds it until it is acknowledged). A job that
  // records nothing more would else tell it only in its goodbye, which a killed job never sends.
  // (Not at the exit: its goodbye carries the counters.)
  if (!fillWindow() && m_window.empty()) {
    const std::string counters = countersToReport(0, /*onlyOnTrouble=*/true);
    if (!counters.empty()) addBatch({}, counters);
  }
  uint64_t waiting = 0;  // for shutdown's handoff decision
  for (const Unacked& u : m_window) waiting += u.batchSeq > acked ? u.events : 0;
  m_windowEvents.store(waiting, std::memory_order_release);
  if (m_link != LinkState::kLive) return;
  noteWaiting();
  writeWindow();
  sendOutbox();
  // Nothing new to send and batches waiting for their acknowledgement: ask for it.
  const auto now = std::chrono::steady_clock::now();
  const bool full = m_windowBytes >= m_config.windowBytes;
  if (m_link == LinkState::kLive && !m_window.empty() &&
      now - m_lastWrite >= std::chrono::milliseconds(full ? 20 : 100)) {
    v1::AgentMessage ask;
    ask.mutable_ack_request();
    if (!write(ask)) {
      loseLink("the stream broke");
      return;
    }
    m_lastWrite = now;
  }
  noteWaiting();
}

bool Transport::fillWindow(bool unbounded) {
  // Strings first: every string a record names was interned before the record was pushed.
  // Whatever was taken (strings, records) stays the sender's until its batch is in the window:
  // an encoding that finds no memory (the job at its limit) throws with nothing lost, and the
  // next pass tries the same batch again.
  std::vector<std::pair<uint32_t, std::string>> fresh = m_interner.takeNew();
  if (m_carriedStrings.empty()) {
    m_carriedStrings.swap(fresh);
  } else if (!fresh.empty()) {
    try {
      m_carriedStrings.insert(m_carriedStrings.end(), std::make_move_iterator(fresh.begin()),
                              std::make_move_iterator(fresh.end()));
    } catch (const std::bad_alloc&) {
      m_interner.giveBack(std::move(fresh));
      throw;
    }
  }
  std::vector<Record>& records = m_batchRecords;
  bool added = false;
  for (;;) {
    if (records.empty() && (unbounded || m_windowBytes < m_config.windowBytes)) {
      m_log.take(records, kMaxEventsPerBatch);
    }
    // Records older than the session (pushed while a re-attached agent was dormant) belong to
    // none: the server would refuse them as already seen.
    if (m_config.firstEventSeq > 1 && !records.empty()) {
      records.erase(std::remove_if(records.begin(), records.end(),
                                   [&](const Record& r) { return r.seq < m_config.firstEventSeq; }),
                    records.end());
      if (records.empty() && m_carriedStrings.empty() && !m_log.empty()) continue;
    }
    if (records.empty() && m_carriedStrings.empty()) break;
    addBatch(records, countersToReport(records.size()));
    added = true;
    const bool none = records.empty();
    records.clear();
    if (none) break;
  }
  return added;
}

void Transport::addBatch(const std::vector<Record>& records, const std::string& counters) {
  Unacked u;
  u.batchSeq = m_nextBatchSeq;
  u.firstEventSeq = m_nextEventSeq;
  // Kept serialized (about 20 bytes an event, an eighth of a parsed message): the window holds
  // more events in flight for its memory, and they are written as they are.
  u.bytes = encodeBatchMessage(u.batchSeq, m_carriedStrings, records, counters);
  u.events = records.size();
  u.cost = 64 + u.bytes.size();
  m_window.push_back(std::move(u));
  // In the window: the batch is made.
  ++m_nextBatchSeq;
  m_carriedStrings.clear();
  if (!records.empty()) m_nextEventSeq = records.back().seq + 1;
  m_windowBytes += m_window.back().cost;
  m_eventsSent += m_window.back().events;
}

void Transport::noteWaiting() {
  const bool waiting = m_link == LinkState::kLive && !m_window.empty() && m_window.front().written;
  m_waitingSinceNs.store(waiting ? std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       m_window.front().writtenAt.time_since_epoch())
                                       .count()
                                 : 0,
                         std::memory_order_release);
}

void Transport::writeWindow() {
  for (Unacked& u : m_window) {
    // The exit's time is up: what is not written goes to the handoff file or the spool (on a
    // loaded machine writing the rest at the daemon's pace took longer than the exit's grace).
    if (m_outOfTime) return;
    if (u.written) continue;
    if (!write(u.bytes)) {
      loseLink("the stream broke");
      return;
    }
    u.written = true;
    u.writtenAt = m_lastWrite = std::chrono::steady_clock::now();
  }
}

void Transport::sendOutbox() {
  // Read by the daemon: a batch made after it was written is committed (the daemon reads a
  // stream in order and stores a result before the rows that follow it).
  const uint64_t acked = m_ackedSeq.load(std::memory_order_acquire);
  std::vector<std::pair<uint64_t, std::string>> unwritten;  // (number, bytes)
  {
    std::lock_guard<std::mutex> lock(m_controlMutex);
    std::erase_if(m_outbox, [acked](const Outgoing& o) {
      return o.readOnceAcked != 0 && o.readOnceAcked <= acked;
    });
    for (const Outgoing& o : m_outbox)
      if (o.readOnceAcked == 0) unwritten.emplace_back(o.number, o.message.SerializeAsString());
  }
  // Written without the lock (a write may wait for the stream; the job queues results meanwhile).
  for (const auto& [number, bytes] : unwritten) {
    if (m_link != LinkState::kLive || !write(bytes)) {
      if (m_link == LinkState::kLive) loseLink("the stream broke");
      return;
    }
    std::lock_guard<std::mutex> lock(m_controlMutex);
    for (Outgoing& o : m_outbox)
      if (o.number == number) o.readOnceAcked = m_nextBatchSeq;
  }
}

void Transport::queueOutgoing(v1::AgentMessage message) {
  if (m_outbox.size() >= kMaxOutgoing) {
    m_outbox.pop_front();
    if (!m_toldOutboxFull && !m_config.quiet) {
      m_toldOutboxFull = true;
      std::fprintf(stderr,
                   "tidemark: more than %zu plan results wait for the daemon; the oldest are "
                   "not kept\n",
                   kMaxOutgoing);
    }
  }
  m_outbox.push_back(Outgoing{std::move(message), ++m_outgoingNumbers, 0});
}

std::vector<v1::AgentMessage> Transport::outgoingForFile() {
  std::lock_guard<std::mutex> lock(m_controlMutex);
  std::vector<v1::AgentMessage> out;
  for (const Outgoing& o : m_outbox) out.push_back(o.message);
  return out;
}

bool Transport::takePlan(uint64_t* planId, std::string* json) {
  std::lock_guard<std::mutex> lock(m_controlMutex);
  if (m_plans.empty()) return false;
  *planId = m_plans.front().first;
  *json = std::move(m_plans.front().second);
  m_plans.pop_front();
  return true;
}

void Transport::returnPlan(uint64_t planId, std::string json) {
  std::lock_guard<std::mutex> lock(m_controlMutex);
  m_plans.emplace_front(planId, std::move(json));
}

void Transport::reportPlanResult(uint64_t planId, bool applied, std::string message, int64_t step,
                                 std::string planJson) {
  v1::AgentMessage m;
  v1::PlanResult* r = m.mutable_plan_result();
  r->set_plan_id(planId);
  r->set_applied(applied);
  r->set_message(std::move(message));
  r->set_step(step);
  if (planId == 0) r->set_plan_json(std::move(planJson));
  {
    std::lock_guard<std::mutex> lock(m_controlMutex);
    if (auto it = m_planAnswers.find(planId); it != m_planAnswers.end()) it->second = *r;
    queueOutgoing(std::move(m));
  }
  m_wake.notify_one();
}

void Transport::scheduleReconnect() {
  // 100 ms, doubling to 2 s: a daemon restarted at once is back within a tenth of a second.
  m_backoffMs = m_backoffMs == 0 ? 100 : std::min(2000, m_backoffMs * 2);
  m_nextConnect = std::chrono::steady_clock::now() + std::chrono::milliseconds(m_backoffMs);
}

bool Transport::tryConnect() {
  if (!roomForTheLink()) {
    noteShortage("room to connect");
    scheduleReconnect();
    return false;
  }
  try {
    return connect();
  } catch (const std::exception& e) {
    // No memory for the stream, its reader thread or the handshake (the job at its limit): the
    // stream begun is ended, and tried again later.
    noteShortage(e.what());
  }
  if (m_stream) survive([this] { endStream(); });
  m_link = LinkState::kDown;
  scheduleReconnect();
  return false;
}

void Transport::noteShortage(const char* what, bool count) noexcept {
  if (count) m_shortages.fetch_add(1, std::memory_order_relaxed);
  if (!m_toldShortage.exchange(true) && !m_config.quiet) {
    // (Unbuffered stderr, a fixed format: no memory needed to say it.)
    std::fprintf(stderr,
                 "tidemark: the agent could not get memory (%s; the job is at its memory limit?); "
                 "it keeps its events and tries again\n",
                 what);
  }
}

void Transport::abandonRest() noexcept {
  // Batches the daemon acknowledged were delivered; the others, and what was not batched, not.
  uint64_t left = m_batchRecords.size() + m_log.size();
  const uint64_t acked = m_ackedSeq.load(std::memory_order_acquire);
  for (const Unacked& u : m_window) {
    if (u.batchSeq <= acked) continue;
    left += u.events;
    m_eventsSent -= std::min<uint64_t>(m_eventsSent.load(), u.events);
  }
  m_window.clear();
  m_windowBytes = 0;
  m_batchRecords.clear();
  m_log.discard(m_log.size());
  m_droppedDisconnected += left;
  m_ending = Ending::kNoMemory;
}

void Transport::openChannel() {
  if (m_channel) return;
  client::ChannelOptions o;
  o.target = m_config.server;
  o.token = m_config.token;
  o.tlsCa = m_config.tlsCa;
  o.tlsCert = m_config.tlsCert;
  o.tlsKey = m_config.tlsKey;
  m_channel = client::makeChannel(o, &m_untrusted);
  // Registered with this channel: a method registered with an earlier transport's channel
  // (an attach after a detach) would point into a channel that is gone.
  if (m_channel)
    m_streamMethod = std::make_unique<grpc::internal::RpcMethod>(
        streamMethodName().c_str(), grpc::internal::RpcMethod::BIDI_STREAMING, m_channel);
}

bool Transport::connect() {
  if (!m_channel) {
    openChannel();
    if (!m_channel) {
      // Nothing is sent (tried again later: the file may appear); the exit spools the run.
      m_linkError = m_untrusted;
      if (!m_toldUntrusted && !m_config.quiet) {
        m_toldUntrusted = true;
        std::fprintf(stderr, "tidemark: not connecting to %s: %s; the agent keeps the events\n",
                     m_config.server.c_str(), m_untrusted.c_str());
      }
      scheduleReconnect();
      return false;
    }
  }
  // Nobody listening on this host's socket or port: not waited for (a stop would wait for it).
  // At the exit, a daemon that listens is waited for up to a second at a time, and asked again
  // at once: on a loaded machine (24 jobs on 2 cores) gRPC took seconds to connect, and the
  // backoff's sleeps between 200 ms waits noticed the connection up to 1.8 s late.
  const bool exiting = m_exitDeadline != std::chrono::steady_clock::time_point::max();
  auto connectWait = std::chrono::milliseconds(200);
  if (exiting) {
    connectWait = std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 m_exitDeadline - std::chrono::steady_clock::now()),
                             std::chrono::milliseconds(200), std::chrono::milliseconds(1000));
  }
  if (base::isProbedTarget(m_config.server) && !base::daemonListening(m_config.server)) {
    scheduleReconnect();
    return false;
  }
  if (!m_channel->WaitForConnected(std::chrono::system_clock::now() + connectWait)) {
    scheduleReconnect();
    if (exiting) m_nextConnect = std::chrono::steady_clock::now();
    return false;
  }
  // A daemon is there: an exit gives it its whole time.
  m_daemonSeen = true;
  m_exitDeadline = std::max(m_exitDeadline, m_exitFullDeadline);
  // Someone answers: sent nothing unless it runs as this user or root (checked at every
  // connection: whoever listens there may change).
  m_untrusted = base::untrustedDaemon(m_config.server, !m_config.tlsCa.empty());
  if (!m_untrusted.empty()) {
    m_linkError = m_untrusted;
    if (!m_toldUntrusted && !m_config.quiet) {
      m_toldUntrusted = true;
      std::fprintf(stderr,
                   "tidemark: not sending anything to the daemon at %s: %s; the agent keeps the "
                   "events\n",
                   m_config.server.c_str(), m_untrusted.c_str());
    }
    scheduleReconnect();
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(m_contextMutex);
    m_context = std::make_unique<grpc::ClientContext>();
  }
  m_watchdogFired = false;
  m_stream.reset(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, v1::ServerMessage>::Create(
          m_channel.get(), *m_streamMethod, m_context.get()));
  {
    std::lock_guard<std::mutex> lock(m_replyMutex);
    m_gotReply = false;
  }
  m_readerDone = false;
  m_reader = std::thread([this] { readCommands(); });
  v1::AgentMessage hello;
  *hello.mutable_handshake() = m_config.handshake;
  v1::Handshake* h = hello.mutable_handshake();
  h->set_first_batch_seq(m_window.empty() ? m_nextBatchSeq : m_window.front().batchSeq);
  h->set_first_event_seq(m_window.empty() ? m_nextEventSeq : m_window.front().firstEventSeq);
  const uint64_t resuming = m_sessionId.load();
  h->set_resume_session_id(resuming);
  h->set_agent_instance(m_instance);
  bool replied = false;
  if (write(hello)) {
    // A hung daemon may take the connection and never answer: the wait is bounded, at the
    // exit by the exit's deadline too.
    auto wait = std::chrono::milliseconds(std::min(3000, m_config.ackTimeoutMs));
    const auto now = std::chrono::steady_clock::now();
    if (m_exitDeadline != std::chrono::steady_clock::time_point::max()) {
      wait =
          std::min(wait, std::chrono::duration_cast<std::chrono::milliseconds>(std::max(
                             m_exitDeadline - now,
                             std::chrono::steady_clock::duration(std::chrono::milliseconds(50)))));
    }
    std::unique_lock<std::mutex> lock(m_replyMutex);
    m_replyCv.wait_for(lock, wait, [this] { return m_gotReply || m_readerDone.load(); });
    replied = m_gotReply;
  }
  if (!replied) {
    const grpc::Status status = endStream();
    m_linkError = status.ok() ? "no answer to the handshake" : status.error_message();
    const grpc::StatusCode code = status.error_code();
    if (resuming != 0 && (code == grpc::StatusCode::ALREADY_EXISTS ||
                          (m_goodbyeWritten && code == grpc::StatusCode::FAILED_PRECONDITION))) {
      // The goodbye went out before the link broke — on the stream, or in a file handed over
      // whose answer came too late — and the server ended the session with it, every event
      // stored (ALREADY_EXISTS): everything was delivered, only the confirmation was lost.
      m_confirmationLost = code == grpc::StatusCode::ALREADY_EXISTS;
      m_ending = Ending::kDelivered;
      return false;
    }
    if (resuming != 0 &&
        (code == grpc::StatusCode::NOT_FOUND || code == grpc::StatusCode::FAILED_PRECONDITION)) {
      // The session cannot be continued (closed meanwhile, or another store): the rest of the
      // run becomes a new session at once.
      if (!m_config.quiet) {
        std::fprintf(stderr,
                     "tidemark: session %llu could not be resumed (%s); the rest of the run is "
                     "recorded as a new session\n",
                     static_cast<unsigned long long>(resuming), m_linkError.c_str());
      }
      m_sessionId = 0;
      m_instance = drawInstance();
      m_resendStrings = true;
      m_nextConnect = std::chrono::steady_clock::now();
      return false;
    }
    if (code == grpc::StatusCode::FAILED_PRECONDITION ||
        code == grpc::StatusCode::INVALID_ARGUMENT || code == grpc::StatusCode::UNIMPLEMENTED ||
        code == grpc::StatusCode::PERMISSION_DENIED || code == grpc::StatusCode::UNAUTHENTICATED) {
      m_link = LinkState::kRefused;
      return false;
    }
    scheduleReconnect();
    return false;
  }
  const uint64_t next = m_reply.next_batch_seq() != 0 ? m_reply.next_batch_seq() : 1;
  // Batches the server committed before the link broke are not sent again.
  while (!m_window.empty() && m_window.front().batchSeq < next) {
    m_windowBytes -= m_window.front().cost;
    m_window.pop_front();
  }
  for (Unacked& u : m_window) u.written = false;
  m_nextBatchSeq = std::max(m_nextBatchSeq, next);
  if (m_resendStrings) {
    // A new session in place of one that could not be resumed: every string the records may
    // name goes with its first batch.
    m_resendStrings = false;
    std::vector<std::pair<uint32_t, std::string>> strings = m_interner.all();
    if (m_window.empty()) {
      m_carriedStrings = std::move(strings);
    } else {
      Unacked& u = m_window.front();
      v1::AgentMessage message;
      message.ParseFromString(u.bytes);
      for (auto& [iid, value] : strings) {
        auto* str = message.mutable_batch()->add_strings();
        str->set_iid(iid);
        str->set_value(std::move(value));
      }
      m_windowBytes -= u.cost;
      u.bytes = message.SerializeAsString();
      u.cost = 64 + u.bytes.size();
      m_windowBytes += u.cost;
    }
  }
  if (m_everConnected) {
    ++m_reconnects;
    if (m_toldLost && !m_config.quiet && m_reconnects == 1) {
      std::fprintf(stderr, "tidemark: reconnected to %s; session %llu goes on\n",
                   m_config.server.c_str(), static_cast<unsigned long long>(m_reply.session_id()));
    }
  }
  m_everConnected = true;
  m_sessionId = m_reply.session_id();
  m_takesRaw = m_reply.takes_raw_records();
  m_link = LinkState::kLive;
  m_backoffMs = 0;
  m_lastWrite = std::chrono::steady_clock::now();
  return true;
}

void Transport::loseLink(const std::string& why) {
  if (m_link != LinkState::kLive) return;
  const grpc::Status status = endStream();
  m_linkError =
      m_outOfTime ? "it took nothing more within TIDEMARK_EXIT_TIMEOUT_MS (" +
                        seconds(m_config.exitTimeoutMs) + ")"
      : m_watchdogFired ? "no acknowledgement for " + seconds(m_config.ackTimeoutMs + 1000) +
                              ": the daemon is hung or overloaded"
      : status.ok() || status.error_code() == grpc::StatusCode::CANCELLED ? why
                                                                          : status.error_message();
  // At the exit the summary says it (and a stream ended for a handoff is no loss).
  if (!m_outOfTime && !m_handingOff) ++m_streamBreaks;
  if (!m_toldLost && !m_config.quiet && !m_outOfTime && !m_handingOff) {
    m_toldLost = true;
    std::fprintf(stderr,
                 "tidemark: connection to %s lost (%s); the agent keeps the events and "
                 "reconnects\n",
                 m_config.server.c_str(), m_linkError.c_str());
  }
  m_backoffMs = 0;
  scheduleReconnect();
  // Results the daemon may not have read go again on the next stream.
  std::lock_guard<std::mutex> lock(m_controlMutex);
  for (Outgoing& o : m_outbox) o.readOnceAcked = 0;
}

void Transport::readCommands() {
  t_recursionGuard = true;
  pthread_setname_np(pthread_self(), "tidemark-read");
  v1::ServerMessage message;
  // A message that finds no memory (the job at its limit) ends the stream, cancelled (its
  // reading cannot go on), as a broken link does: the sender reconnects and resumes.
  if (!survive([&] { readMessages(message); })) {
    std::lock_guard<std::mutex> lock(m_contextMutex);
    if (m_context) m_context->TryCancel();
  }
  {
    std::lock_guard<std::mutex> lock(m_replyMutex);
    m_readerDone = true;
  }
  m_replyCv.notify_all();
}

void Transport::readMessages(v1::ServerMessage& message) {
  while (m_stream->Read(&message)) {
    if (message.has_handshake_reply()) {
      std::lock_guard<std::mutex> lock(m_replyMutex);
      m_reply = message.handshake_reply();
      m_gotReply = true;
      m_replyCv.notify_all();
      continue;
    }
    if (message.has_ack()) {
      uint64_t seen = m_ackedSeq.load();
      while (message.ack().batch_seq() > seen &&
             !m_ackedSeq.compare_exchange_weak(seen, message.ack().batch_seq())) {
      }
      continue;
    }
    if (!message.has_command()) continue;
    const v1::Command& cmd = message.command();
    if (cmd.has_start_capture()) m_recorder.setRecording(true);
    if (cmd.has_stop_capture()) m_recorder.setRecording(false);
    bool answeredAgain = false;
    if (cmd.has_apply_plan()) {
      std::lock_guard<std::mutex> lock(m_controlMutex);
      // Delivery is at least once (a daemon that sent a plan and died before it wrote so sends
      // it again after its restart, on a shared store): a plan this process took is not
      // taken twice.
      const uint64_t id = cmd.apply_plan().plan_id();
      auto [known, added] = m_planAnswers.try_emplace(id);
      if (added) {
        m_planIdsInOrder.push_back(id);
        if (m_planIdsInOrder.size() > kPlanIdsKept) {
          m_planAnswers.erase(m_planIdsInOrder.front());
          m_planIdsInOrder.pop_front();
        }
        m_plans.emplace_back(id, cmd.apply_plan().plan_json());
      } else if (known->second) {
        // Sent again by a daemon that has no answer (it went with a stream that broke).
        v1::AgentMessage again;
        *again.mutable_plan_result() = *known->second;
        queueOutgoing(std::move(again));
        answeredAgain = true;
      }
    }
    if (answeredAgain) m_wake.notify_one();
  }
}

template <typename Call>
bool Transport::streamCall(Call&& call) {
  m_senderState.store(kSenderInStreamCall, std::memory_order_release);
  const bool ok = call();
  uint32_t inside = kSenderInStreamCall;
  if (!m_senderState.compare_exchange_strong(inside, kSenderOutside, std::memory_order_acq_rel)) {
    // Taken over by the exit, which spooled what this thread held: nothing here is this
    // thread's any more. (Its signals are blocked: the pause is for ever.)
    for (;;) ::pause();
  }
  return ok;
}

bool Transport::takeOverStuckSender() {
  uint32_t inside = kSenderInStreamCall;
  if (!m_senderState.compare_exchange_strong(inside, kSenderTakenOver, std::memory_order_acq_rel))
    return false;
  if (m_thread.joinable()) m_thread.detach();
  stopCollector();  // its last pass into the buffer
  m_linkError = "its stream did not end once cancelled: it read nothing";
  m_outOfTime = true;
  // What the sender's exit would spool (the window's batches not confirmed, the buffer, the
  // strings), written by this thread: the sender holds nothing while inside a stream call.
  if (!survive([this] { spoolRest(); })) abandonRest();
  std::lock_guard<std::mutex> lock(m_mutex);
  m_stopped = true;
  m_progress.notify_all();
  return true;
}

bool Transport::write(const std::string& bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());  // a copy: gRPC holds none of the window's
  grpc::ByteBuffer buffer(&slice, 1);
  return streamCall([&] { return m_stream->Write(buffer); });
}

bool Transport::write(const v1::AgentMessage& message) {
  return write(message.SerializeAsString());
}

bool Transport::closeStream(std::chrono::steady_clock::time_point deadline) {
  if (!roomForTheLink()) return false;  // tried again at the exit's next pass
  sendOutbox();  // a result queued since the last pass goes before the goodbye
  if (m_link != LinkState::kLive) return false;
  v1::AgentMessage bye;
  *bye.mutable_goodbye()->mutable_counters() = counters();
  bye.mutable_goodbye()->set_end_ts_ns(base::monotonicNs());
  bye.mutable_goodbye()->set_exit_code(-1);
  if (!write(bye) || !streamCall([this] { return m_stream->WritesDone(); })) {
    loseLink("the stream broke at the goodbye");
    return false;
  }
  m_goodbyeWritten = true;
  // The server closes the stream once everything is committed.
  while (!m_readerDone && !m_outOfTime && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  // Not confirmed in time: cancelled; a retry or the spool takes over (the server skips what
  // it committed).
  const bool confirmed = m_readerDone;
  const grpc::Status status = endStream();
  if (status.ok() && confirmed) return true;
  m_linkError = !status.ok() ? status.error_message() : "the goodbye was not confirmed in time";
  scheduleReconnect();
  return false;
}

grpc::Status Transport::endStream() {
  // The server's own status when it ended the stream (a refusal, a full store); else ours.
  if (!m_readerDone) m_context->TryCancel();
  // (Waits on gRPC: a stream call, that the exit may take the sender over in.)
  grpc::Status status;
  streamCall([this, &status] {
    if (m_reader.joinable()) m_reader.join();
    status = m_stream->Finish();
    return true;
  });
  m_stream.reset();
  m_link = LinkState::kDown;
  m_waitingSinceNs = 0;
  for (Unacked& u : m_window) u.written = false;
  return status;
}

bool Transport::handoffPossible() const {
  // A daemon on this host that knows this user from the kernel (a token's word is not enough to
  // read a file of this user's): a Unix socket, or loopback TCP without TLS.
  const std::string& target = m_config.server;
  const bool local = target.rfind("unix:", 0) == 0 || target.rfind("127.0.0.1:", 0) == 0 ||
                     target.rfind("localhost:", 0) == 0 || target.rfind("[::1]:", 0) == 0;
  return m_config.handoffMinEvents != 0 &&
         !(m_config.handoffPath.empty() && m_config.handoffMemoryPath.empty()) &&
         m_config.token.empty() && m_config.tlsCa.empty() && local && m_sessionId != 0;
}

bool Transport::spoolInUsersDirectory() const {
  return m_config.token.empty() && m_config.tlsCa.empty() &&
         base::isProbedTarget(m_config.server) &&
         std::filesystem::path(m_config.spoolPath).parent_path() ==
             std::filesystem::path(base::defaultSpoolDirectory());
}

bool Transport::daemonTakesSpool() const {
  return spoolInUsersDirectory() &&
         base::daemonOwner(m_config.server) == std::optional<uid_t>(::geteuid());
}

bool Transport::handoffOffered() const {
  return handoffPossible() &&
         m_windowEvents.load(std::memory_order_acquire) + m_log.size() >= m_config.handoffMinEvents;
}

bool Transport::handOff(std::chrono::steady_clock::time_point deadline) {
  // What the buffer holds goes as it lies, raw (RawRecords), to a daemon that reads it: the
  // reader encodes it, not the job's exit (at the burst program's exit: 600,000 records, 35 to
  // 65 ms of encoding). Not for records a re-attached agent must leave out (firstEventSeq).
  if (!roomForTheLink()) return false;  // the exit delivers or spools the rest its usual way
  // (A batch whose encoding found no memory is encoded first: its records precede the buffer's.)
  const bool raw = m_takesRaw && m_config.firstEventSeq <= 1 && m_batchRecords.empty();
  if (!raw) fillWindow(true);
  const uint64_t acked = m_ackedSeq.load(std::memory_order_acquire);
  while (!m_window.empty() && m_window.front().batchSeq <= acked) {
    m_windowBytes -= m_window.front().cost;
    m_window.pop_front();
  }
  // Strings interned since the last batch (raw: they go with the first raw records; given back
  // to the sender if the daemon says no).
  std::vector<std::pair<uint32_t, std::string>> strings;
  if (raw) {
    strings = std::move(m_carriedStrings);
    m_carriedStrings.clear();
    std::vector<std::pair<uint32_t, std::string>> fresh = m_interner.takeNew();
    strings.insert(strings.end(), std::make_move_iterator(fresh.begin()),
                   std::make_move_iterator(fresh.end()));
  }
  if (m_window.empty() && (!raw || (m_log.empty() && strings.empty()))) {
    m_carriedStrings = std::move(strings);
    return false;
  }
  // The file: the session resumed where the server has not confirmed, every batch from there
  // (it skips those it has), the raw rest, the goodbye with the counters this agent ends with.
  uint64_t handed = 0;  // not acknowledged: the daemon takes them from the file
  for (const Unacked& u : m_window) handed += u.events;
  const uint64_t firstBatch = m_window.empty() ? m_nextBatchSeq : m_window.front().batchSeq;
  const uint64_t firstEvent = m_window.empty() ? m_nextEventSeq : m_window.front().firstEventSeq;
  uint64_t rawEvents = 0;
  uint64_t nextBatch = m_nextBatchSeq;
  uint64_t nextEvent = m_nextEventSeq;
  // Undoes a file written or refused: removed, what it took counted as still held (sent, or
  // spooled, by the exit's usual path).
  const auto unwrite = [&] {
    ::unlink(m_handoffPath.c_str());
    m_eventsHandedOff = 0;
    m_eventsSent -= rawEvents;
    rawEvents = 0;
  };
  // Writes the file at m_handoffPath, at most capBytes; false (undone) when it could not.
  const auto writeTo = [&](uint64_t capBytes) {
    rawEvents = 0;
    nextBatch = m_nextBatchSeq;
    nextEvent = m_nextEventSeq;
    SpoolWriter file(m_handoffPath, capBytes);
    v1::AgentMessage hello;
    *hello.mutable_handshake() = m_config.handshake;
    hello.mutable_handshake()->set_first_batch_seq(firstBatch);
    hello.mutable_handshake()->set_first_event_seq(firstEvent);
    hello.mutable_handshake()->set_resume_session_id(m_sessionId.load());
    bool ok = file.append(hello);
    // The plans' results first: a few small messages, never squeezed out by the records.
    for (const v1::AgentMessage& result : outgoingForFile()) ok = ok && file.append(result);
    for (const Unacked& u : m_window) ok = ok && file.appendSerialized(u.bytes);
    if (raw && ok) {
      std::vector<std::pair<uint32_t, std::string>> pending = strings;
      const auto put = [&](const Record* records, size_t n) {
        ok = file.appendSerialized(rawRecordsHead(nextBatch, pending, n * sizeof(Record)), records,
                                   n * sizeof(Record));
        pending.clear();
        nextBatch += rawBatchCount(n);
        rawEvents += n;
        if (n > 0) nextEvent = records[n - 1].seq + 1;
        return ok;
      };
      ok = m_log.visit(put) && ok && (pending.empty() || put(nullptr, 0));
    }
    m_eventsSent += rawEvents;
    m_eventsHandedOff = handed + rawEvents;
    v1::AgentMessage bye;
    *bye.mutable_goodbye()->mutable_counters() = counters();
    bye.mutable_goodbye()->set_end_ts_ns(base::monotonicNs());
    bye.mutable_goodbye()->set_exit_code(-1);
    ok = ok && file.append(bye);
    if (!ok) unwrite();
    return ok;
  };
  // In memory (a memory file system) when the daemon runs as this user (it removes the file once
  // stored; a daemon of another user, root serving several, leaves it to its owner), the file
  // holds no more than the agent's memory did (the window and the buffer's memory, not its
  // file) and it takes at most a quarter of what is free there (a container's small /dev/shm,
  // which DataLoader workers share, is never filled). Else — or when that write fails (the file
  // system full after all), or the daemon cannot open it (one that does not see this /dev/shm: a
  // container of its own) — in the spool directory, room made for everything the agent may hold
  // (the window, the buffer's memory and its file, the strings): a handoff never fails for its
  // size (with the spool's cap it did past 256 MiB, and the exit then went at the daemon's pace,
  // into a spool as capped). The daemon removes the file once stored.
  const uint64_t stringBytes = 64ull << 20;
  const uint64_t inMemory = m_windowBytes + (raw ? m_log.size() * sizeof(Record) : 0);
  std::vector<std::pair<std::string, uint64_t>> places;  // (path, cap), tried in order
  if (!m_config.handoffMemoryPath.empty() &&
      base::daemonOwner(m_config.server) == std::optional<uid_t>(::geteuid()) &&
      inMemory <= m_config.windowBytes + m_config.bufferMemoryBytes &&
      inMemory <= freeBytesFor(m_config.handoffMemoryPath) / 4) {
    places.emplace_back(m_config.handoffMemoryPath,
                        m_config.windowBytes + m_config.bufferMemoryBytes + stringBytes);
  }
  if (!m_config.handoffPath.empty()) {
    places.emplace_back(m_config.handoffPath, m_config.windowBytes + m_config.bufferMemoryBytes +
                                                  m_config.bufferFileBytes + stringBytes);
  }
  bool accepted = false;
  for (const auto& [path, cap] : places) {
    m_handoffPath = path;
    if (!writeTo(cap)) continue;
    // Asked on a call of its own, which the data in flight on the stream does not hold up.
    v1::HandoffRequest request;
    request.set_session_id(m_sessionId.load());
    request.set_path(m_handoffPath);
    v1::HandoffReply reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(
        std::min(std::chrono::system_clock::now() + std::chrono::seconds(3),
                 std::chrono::system_clock::now() + (deadline - std::chrono::steady_clock::now())));
    const grpc::Status status = v1::Ingest::NewStub(m_channel)->Handoff(&ctx, request, &reply);
    accepted = status.ok() && reply.accepted();
    if (accepted) break;
    unwrite();
    // Offered from elsewhere only when the daemon could not open it where it lay; unanswered
    // (a hung daemon) or refused for its session: not asked again.
    if (!status.ok() || !reply.cannot_open()) break;
  }
  if (!accepted) {
    m_carriedStrings = std::move(strings);
    return false;  // the exit goes on as without: a new stream, or the spool
  }
  m_log.discard(rawEvents);
  m_nextBatchSeq = nextBatch;
  m_nextEventSeq = nextEvent;
  m_ending = Ending::kHandedOff;
  if (m_link == LinkState::kLive) endStream();
  m_window.clear();
  m_windowBytes = 0;
  return true;
}

void Transport::spoolRest() {
  m_spooling = true;
  SpoolWriter spool(m_config.spoolPath, m_config.spoolCapBytes);
  v1::AgentMessage hello;
  *hello.mutable_handshake() = m_config.handshake;
  v1::Handshake* h = hello.mutable_handshake();
  h->set_first_batch_seq(m_window.empty() ? m_nextBatchSeq : m_window.front().batchSeq);
  h->set_first_event_seq(m_window.empty() ? m_nextEventSeq : m_window.front().firstEventSeq);
  h->set_resume_session_id(m_sessionId.load());
  h->set_agent_instance(m_instance);
  bool ok = spool.append(hello);
  // The plans' results first: a few small messages that a spool capped by the records' bytes
  // still holds.
  for (const v1::AgentMessage& result : outgoingForFile()) ok = ok && spool.append(result);
  // Everything the window holds (the server skips what it committed) and what the buffer holds.
  auto put = [&](const std::string& bytes, uint64_t events) {
    ok = ok && spool.appendSerialized(bytes);
    if (ok) {
      m_eventsSpooled += events;
    } else {
      m_droppedSpoolFull += events;
      m_eventsSent -= std::min<uint64_t>(m_eventsSent.load(), events);
    }
  };
  for (;;) {
    for (const Unacked& u : m_window) put(u.bytes, u.events);
    m_window.clear();
    m_windowBytes = 0;
    if (!fillWindow()) break;
  }
  v1::AgentMessage bye;
  *bye.mutable_goodbye()->mutable_counters() = counters();
  bye.mutable_goodbye()->set_end_ts_ns(base::monotonicNs());
  bye.mutable_goodbye()->set_exit_code(-1);
  ok = ok && spool.append(bye);
  m_spoolFailure = spool.failure();
  m_ending = Ending::kSpooled;
}

void Transport::shutdown(int timeoutMs) {
  std::unique_lock<std::mutex> lock(m_mutex);
  if (!m_started) {
    // Never started (no adapter called start): do the whole job here, synchronously.
    m_started = true;
    m_stopRequested = true;
    lock.unlock();
    spawnThreads();
    lock.lock();
  }
  m_stopRequested = true;
  // Much not confirmed yet — at once, or still after kHandoffAfterMs of the exit (a daemon
  // slower than it looked: many jobs ending together) —: the stream is ended (a write may be
  // waiting on the daemon's pace) and the rest goes to the daemon in a file (handOff, in the
  // sender's exit).
  const auto handOver = [this] {
    m_handingOff = true;
    std::lock_guard<std::mutex> contextLock(m_contextMutex);
    if (m_context) m_context->TryCancel();
  };
  if (handoffOffered()) handOver();
  m_wake.notify_all();
  const auto stopped = [this] { return m_stopped; };
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  const auto handoverFrom =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(kHandoffAfterMs);
  bool done = false;
  while (!done && std::chrono::steady_clock::now() < end) {
    // In slices: the session may become known (a late handshake) at any moment.
    done = m_progress.wait_until(
        lock, std::min(end, std::chrono::steady_clock::now() + std::chrono::milliseconds(20)),
        stopped);
    // Offered once the session is known (a handshake answered after the exit began), or
    // possible and the exit slower than kHandoffAfterMs.
    if (!done && !m_handingOff &&
        (handoffOffered() ||
         (std::chrono::steady_clock::now() >= handoverFrom && handoffPossible()))) {
      handOver();
    }
  }
  lock.unlock();
  if (done) {
    if (m_thread.joinable()) m_thread.join();
  } else {
    // Out of time: most likely blocked writing to a daemon that reads slowly (gRPC's flow
    // control) or waiting for one that does not answer. The stream is cancelled, which frees the
    // sender, and it writes what the daemon did not confirm to the spool file (a local write,
    // given its own time): delivered later with `tidemark upload`, not lost.
    m_outOfTime = true;
    {
      std::lock_guard<std::mutex> lock(m_contextMutex);
      if (m_context) m_context->TryCancel();
    }
    // A sender still inside a stream call shortly after the cancel is taken over: the spool is
    // written here.
    lock.lock();
    bool spooled = m_progress.wait_for(lock, std::chrono::milliseconds(kTakeOverAfterMs),
                                       [this] { return m_stopped; });
    lock.unlock();
    if (!spooled) spooled = takeOverStuckSender();  // which detaches the sender
    if (!spooled) {
      lock.lock();
      spooled =
          m_progress.wait_for(lock, std::chrono::milliseconds(kSpoolGraceMs - kTakeOverAfterMs),
                              [this] { return m_stopped; });
      lock.unlock();
    }
    if (spooled) {
      if (m_thread.joinable()) m_thread.join();
    } else {
      // Give up: the sender is left to end on its own; what it did not spool is lost, and said
      // so. Its collector stops now: left to the sender's way out, it went on emptying the
      // rings beside the next attach's collector (the rings have one reader).
      m_closedCleanly = false;
      if (m_thread.joinable()) m_thread.detach();
      stopCollector();
    }
  }
}

bool Transport::flush(int timeoutMs) {
  std::unique_lock<std::mutex> lock(m_mutex);
  if (!m_started || m_stopped) return m_stopped;
  // Two full passes of each thread after this call (the first may have begun before it): the
  // collector's take the rings into the buffer, the sender's the buffer to the stream.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  const uint64_t collected = m_collectPasses + 2;
  m_recorder.requestDrain();
  if (!m_progress.wait_until(lock, deadline, [&] {
        if (m_collectPasses < collected) m_recorder.requestDrain();
        return m_collectPasses >= collected || m_stopped;
      })) {
    return false;
  }
  const uint64_t target = m_passes + 2;
  m_wake.notify_all();
  return m_progress.wait_until(lock, deadline, [&] {
    if (m_passes < target) m_wake.notify_all();
    return m_passes >= target || m_stopped;
  });
}

v1::AgentCounters Transport::counters() const {
  v1::AgentCounters c;
  c.set_events_recorded(m_recorder.recordedCount());
  c.set_events_sent(m_eventsSent.load());
  c.set_dropped_ring_full(m_recorder.drops().ringFull.load());
  c.set_dropped_no_ring(m_recorder.drops().noRing.load());
  c.set_dropped_table_full(m_recorder.drops().tableFull.load());
  c.set_dropped_spool_full(m_droppedSpoolFull.load());
  c.set_events_spooled(m_eventsSpooled.load());
  c.set_events_handed_off(m_eventsHandedOff.load());
  c.set_dropped_disconnected(m_droppedDisconnected.load());
  c.set_dropped_buffer_full(m_log.refused());
  c.set_ring_waits(m_recorder.ringWaits());
  c.set_degraded(m_recorder.degraded());
  c.set_lossy(m_recorder.lossy());
  c.set_events_buffered_to_disk(m_log.spilledTotal());
  c.set_memory_shortages(m_shortages.load(std::memory_order_relaxed) + m_log.memoryRefusals());
  c.set_reconnects(m_reconnects.load());
  c.set_adapter_failures(m_recorder.adapterFailures());
  if (m_filter) {
    c.set_events_summarized(m_filter->summarized());
    c.set_blocks_restated(m_filter->restated());
  }
  return c;
}

std::string Transport::countersToReport(size_t batchEvents, bool onlyOnTrouble) {
  v1::AgentCounters c = counters();
  c.set_events_sent(c.events_sent() + batchEvents);
  const uint64_t trouble = c.dropped_ring_full() + c.dropped_no_ring() + c.dropped_table_full() +
                           c.dropped_spool_full() + c.dropped_disconnected() +
                           c.dropped_buffer_full() + c.adapter_failures() + (c.degraded() ? 1 : 0);
  const auto now = std::chrono::steady_clock::now();
  if (trouble == m_reportedTrouble &&
      (onlyOnTrouble || now - m_countersReportedAt < std::chrono::seconds(1)))
    return {};
  m_reportedTrouble = trouble;
  m_countersReportedAt = now;
  return c.SerializeAsString();
}

std::string Transport::summary() const {
  const v1::AgentCounters c = counters();
  const uint64_t dropped = c.dropped_ring_full() + c.dropped_no_ring() + c.dropped_table_full() +
                           c.dropped_spool_full() + c.dropped_disconnected() +
                           c.dropped_buffer_full();
  char line[1024];
  if (!m_closedCleanly && m_spooling) {
    // Likely after a handoff a loaded daemon answered too late (its call given 3 s at most).
    // What the process's exit cuts short of the spool is lost; what it holds, upload delivers.
    const unsigned long long session = m_sessionId.load();
    char what[64] = "the run";
    if (session != 0) std::snprintf(what, sizeof what, "the rest of session %llu", session);
    std::snprintf(line, sizeof line,
                  "tidemark: the exit stopped waiting while %s was being spooled to %s (%llu "
                  "events written so far; the rest is lost); %s %s",
                  what, m_config.spoolPath.c_str(),
                  static_cast<unsigned long long>(c.events_spooled()),
                  session != 0 && daemonTakesSpool()
                      ? "tidemarkd takes it up once this process has exited, else: tidemark "
                        "upload"
                      : "deliver it with: tidemark upload",
                  m_config.spoolPath.c_str());
    return line;
  }
  if (!m_closedCleanly) {
    const uint64_t left = m_recorder.recordedCount() > c.events_sent()
                              ? m_recorder.recordedCount() - c.events_sent()
                              : 0;
    std::snprintf(line, sizeof line,
                  "tidemark: tidemarkd at %s did not answer at exit; %llu events written to the "
                  "stream of session %llu were not confirmed and %llu not sent are lost",
                  m_config.server.c_str(), static_cast<unsigned long long>(c.events_sent()),
                  static_cast<unsigned long long>(m_sessionId.load()),
                  static_cast<unsigned long long>(left));
    return line;
  }
  const unsigned long long session = m_sessionId.load();
  switch (m_ending.load()) {
    case Ending::kDelivered:
    case Ending::kRunning: {
      int n = std::snprintf(line, sizeof line,
                            "tidemark: session %llu: %llu events sent to %s, %llu dropped", session,
                            static_cast<unsigned long long>(c.events_sent()),
                            m_config.server.c_str(), static_cast<unsigned long long>(dropped));
      if (m_confirmationLost && n > 0 && static_cast<size_t>(n) < sizeof line) {
        n += std::snprintf(line + n, sizeof line - static_cast<size_t>(n),
                           " (the daemon's answer to the run's end was lost; asked again, it "
                           "said the session had ended whole)");
      } else if (c.reconnects() != 0 && n > 0 && static_cast<size_t>(n) < sizeof line) {
        std::snprintf(line + n, sizeof line - static_cast<size_t>(n),
                      " (the stream broke and was resumed %llu time%s)",
                      static_cast<unsigned long long>(c.reconnects()),
                      c.reconnects() == 1 ? "" : "s");
      }
      break;
    }
    case Ending::kNoMemory:
      std::snprintf(line, sizeof line,
                    "tidemark: session %llu: the agent found no memory at the exit (the job at "
                    "its memory limit) to deliver or spool the rest; %llu events sent to %s, "
                    "%llu dropped",
                    session, static_cast<unsigned long long>(c.events_sent()),
                    m_config.server.c_str(), static_cast<unsigned long long>(dropped));
      break;
    case Ending::kSpooled:
      if (!m_spoolFailure.empty() && c.events_spooled() != 0) {
        // Written in part (the file system filled): what it holds still completes the session.
        std::snprintf(line, sizeof line,
                      "tidemark: the rest of the run did not reach tidemarkd at %s (%s); %llu "
                      "events spooled to %s before its writing failed (%s), %llu dropped; "
                      "complete the session with: tidemark upload %s",
                      m_config.server.c_str(),
                      m_linkError.empty() ? "no answer" : m_linkError.c_str(),
                      static_cast<unsigned long long>(c.events_spooled()),
                      m_config.spoolPath.c_str(), m_spoolFailure.c_str(),
                      static_cast<unsigned long long>(dropped), m_config.spoolPath.c_str());
      } else if (!m_spoolFailure.empty()) {
        std::snprintf(line, sizeof line,
                      "tidemark: the rest of the run did not reach tidemarkd at %s (%s) and could "
                      "not be spooled (%s); %llu events dropped",
                      m_config.server.c_str(),
                      m_linkError.empty() ? "no answer" : m_linkError.c_str(),
                      m_spoolFailure.c_str(), static_cast<unsigned long long>(dropped));
      } else if (session == 0 && !m_untrusted.empty()) {
        std::snprintf(line, sizeof line,
                      "tidemark: not sent to the daemon at %s (%s); %llu events spooled to %s "
                      "(%llu dropped); load them into your own with: tidemark upload %s",
                      m_config.server.c_str(), m_untrusted.c_str(),
                      static_cast<unsigned long long>(c.events_spooled()),
                      m_config.spoolPath.c_str(), static_cast<unsigned long long>(dropped),
                      m_config.spoolPath.c_str());
      } else if (session == 0) {
        std::snprintf(line, sizeof line,
                      "tidemark: no tidemarkd answered at %s; %llu events spooled to %s "
                      "(%llu dropped); %s %s",
                      m_config.server.c_str(), static_cast<unsigned long long>(c.events_spooled()),
                      m_config.spoolPath.c_str(), static_cast<unsigned long long>(dropped),
                      spoolInUsersDirectory()
                          ? "a tidemarkd of this user listening there since before this job "
                            "began takes it up once this process has exited, else load them "
                            "with: tidemark upload"
                          : "load them with: tidemark upload",
                      m_config.spoolPath.c_str());
      } else {
        std::snprintf(line, sizeof line,
                      "tidemark: session %llu: the end of the run did not reach tidemarkd at %s "
                      "(%s); %llu events spooled to %s (%llu dropped); %s %s",
                      session, m_config.server.c_str(), m_linkError.c_str(),
                      static_cast<unsigned long long>(c.events_spooled()),
                      m_config.spoolPath.c_str(), static_cast<unsigned long long>(dropped),
                      daemonTakesSpool() ? "tidemarkd takes it up once this process has "
                                           "exited, else: tidemark upload"
                                         : "complete the session with: tidemark upload",
                      m_config.spoolPath.c_str());
      }
      break;
    case Ending::kHandedOff: {
      int n = std::snprintf(
          line, sizeof line,
          "tidemark: session %llu: %llu events sent to %s, %llu dropped (the last "
          "%llu handed to the daemon in %s, which it stores and removes)",
          session, static_cast<unsigned long long>(c.events_sent()), m_config.server.c_str(),
          static_cast<unsigned long long>(dropped),
          static_cast<unsigned long long>(c.events_handed_off()), m_handoffPath.c_str());
      if (c.reconnects() != 0 && n > 0 && static_cast<size_t>(n) < sizeof line) {
        std::snprintf(line + n, sizeof line - static_cast<size_t>(n),
                      " (the stream broke and was resumed %llu time%s)",
                      static_cast<unsigned long long>(c.reconnects()),
                      c.reconnects() == 1 ? "" : "s");
      } else if (m_streamBreaks != 0 && n > 0 && static_cast<size_t>(n) < sizeof line) {
        // Broken and not taken up again before the exit: the file's handshake resumes it.
        std::snprintf(line + n, sizeof line - static_cast<size_t>(n),
                      " (the stream broke; the daemon resumed the session from the file)");
      }
      break;
    }
    case Ending::kRefused:
      std::snprintf(line, sizeof line,
                    "tidemark: tidemarkd at %s refused the agent (%s); %llu events dropped",
                    m_config.server.c_str(), m_linkError.c_str(),
                    static_cast<unsigned long long>(dropped));
      break;
  }
  return line;
}

}  // namespace tidemark::agent
