#include "agent/transport/transport.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "src/base/clock.h"

namespace tidemark::agent {

namespace {
constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kHandshakeMagic = 0x54444D4B;  // "TDMK"
constexpr size_t kMaxEventsPerBatch = 8192;

void toEvent(const Record& r, v1::Event* e) {
  e->set_seq(r.seq);
  e->set_ts_ns(r.tsNs);
  e->set_thread_id(r.threadId);
  switch (r.kind) {
    case RecordKind::kAlloc: {
      auto* a = e->mutable_alloc();
      a->set_address(r.address);
      a->set_size_bytes(r.sizeBytes);
      a->set_kind(static_cast<v1::MemoryKind>(r.small));
      a->set_device(r.device);
      break;
    }
    case RecordKind::kFree: {
      auto* f = e->mutable_free();
      f->set_address(r.address);
      f->set_kind(static_cast<v1::MemoryKind>(r.small));
      f->set_device(r.device);
      break;
    }
    case RecordKind::kScopeBegin:
      e->mutable_scope_begin()->set_name_iid(r.nameIid);
      e->mutable_scope_begin()->set_kind(static_cast<v1::ScopeKind>(r.small));
      if (r.address != 0)
        e->mutable_scope_begin()->set_correlation_id(static_cast<uint32_t>(r.address));
      break;
    case RecordKind::kLaunch:
      e->mutable_launch()->set_correlation_id(static_cast<uint32_t>(r.address));
      break;
    case RecordKind::kScopeEnd:
      e->mutable_scope_end()->set_name_iid(r.nameIid);
      e->mutable_scope_end()->set_kind(static_cast<v1::ScopeKind>(r.small));
      break;
    case RecordKind::kPhaseBegin:
      e->mutable_phase_begin()->set_phase(static_cast<v1::Phase>(r.small));
      break;
    case RecordKind::kPhaseEnd:
      e->mutable_phase_end()->set_phase(static_cast<v1::Phase>(r.small));
      break;
    case RecordKind::kStepBegin:
      e->mutable_step_begin()->set_step(static_cast<int64_t>(r.address));
      break;
    case RecordKind::kStepEnd:
      e->mutable_step_end()->set_step(static_cast<int64_t>(r.address));
      break;
    case RecordKind::kCounter:
      e->mutable_counter()->set_name_iid(r.nameIid);
      e->mutable_counter()->set_value(static_cast<int64_t>(r.sizeBytes));
      break;
    case RecordKind::kTag: {
      auto* t = e->mutable_tag();
      t->set_address(r.address);
      t->set_size_bytes(r.sizeBytes);
      t->set_category(static_cast<v1::Category>(r.small));
      t->set_name_iid(r.nameIid);
      break;
    }
  }
}
}  // namespace

Transport::Transport(Recorder& recorder, Interner& interner, TransportConfig config)
    : m_recorder(recorder),
      m_interner(interner),
      m_config(std::move(config)),
      m_log(m_config.bufferMemoryBytes, m_config.bufferDir, m_config.bufferFileBytes) {
  m_config.handshake.set_magic(kHandshakeMagic);
  m_config.handshake.set_protocol_version(kProtocolVersion);
  m_spool = std::make_unique<SpoolWriter>(m_config.spoolPath, m_config.spoolCapBytes);
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
  m_recorder.collectorStarted();
  m_collector = std::thread([this] { collect(); });
  m_thread = std::thread([this] { run(); });
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
}

void Transport::collect() {
  t_recursionGuard = true;
  std::vector<Record> records;
  for (;;) {
    const bool last = m_collectorStop.load(std::memory_order_acquire);
    records.clear();
    m_recorder.drainAll([&](const Record& r) { records.push_back(r); });
    if (!records.empty()) {
      std::sort(records.begin(), records.end(),
                [](const Record& a, const Record& b) { return a.seq < b.seq; });
      m_log.append(records.data(), records.size());
    }
    m_recorder.notifyDrained();
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      ++m_collectPasses;
    }
    m_progress.notify_all();
    if (last) break;
    m_recorder.awaitDrainRequest(m_config.flushIntervalMs);
  }
}

void Transport::stopCollector() {
  m_collectorStop.store(true, std::memory_order_release);
  m_recorder.requestDrain();
  if (m_collector.joinable()) m_collector.join();
  // This one no longer empties the rings (with none left, a full ring drops, counted).
  m_recorder.collectorStopped();
}

void Transport::run() {
  // The agent's own allocations are never recorded.
  t_recursionGuard = true;
  std::unique_lock<std::mutex> lock(m_mutex);
  while (!m_stopRequested) {
    lock.unlock();
    if (m_link == LinkState::kNeverConnected && std::chrono::steady_clock::now() >= m_nextConnect) {
      if (!tryConnect()) {
        m_nextConnect =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(m_config.connectRetryMs);
      }
    }
    drainOnce();
    lock.lock();
    ++m_passes;
    m_progress.notify_all();
    m_wake.wait_for(lock, std::chrono::milliseconds(m_config.flushIntervalMs));
  }
  lock.unlock();
  // Final pass: everything recorded until shutdown, then the goodbye.
  stopCollector();
  if (m_link == LinkState::kNeverConnected) tryConnect();
  drainOnce();
  v1::Goodbye goodbye;
  *goodbye.mutable_counters() = counters();
  goodbye.set_end_ts_ns(base::monotonicNs());
  goodbye.set_exit_code(-1);
  closeStream(goodbye, std::chrono::steady_clock::now() + std::chrono::seconds(3));
  lock.lock();
  ++m_passes;
  m_stopped = true;
  m_progress.notify_all();
}

void Transport::drainOnce() {
  if (m_recorder.degraded() && !m_toldDegraded && !m_config.quiet) {
    m_toldDegraded = true;
    std::fprintf(stderr,
                 "tidemark: a thread waited %d ms for the agent to make room; recording goes on "
                 "in degraded mode (full rings drop, counted) for the rest of the run\n",
                 m_config.ringWaitDeadlineMs);
  }
  // Strings first: every string a record names was interned before the record was pushed.
  std::vector<std::pair<uint32_t, std::string>> strings = m_interner.takeNew();
  std::vector<Record> records;
  do {
    records.clear();
    m_log.take(records, kMaxEventsPerBatch * 8);
    if (!records.empty() || !strings.empty()) sendBatchRecords(records, strings);
  } while (!records.empty());
  sendOutbox();
}

void Transport::sendOutbox() {
  std::vector<v1::AgentMessage> out;
  {
    std::lock_guard<std::mutex> lock(m_controlMutex);
    out.swap(m_outbox);
  }
  for (const v1::AgentMessage& m : out) deliver(m, 0);
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

void Transport::reportPlanResult(uint64_t planId, bool applied, std::string message, int64_t step) {
  v1::AgentMessage m;
  v1::PlanResult* r = m.mutable_plan_result();
  r->set_plan_id(planId);
  r->set_applied(applied);
  r->set_message(std::move(message));
  r->set_step(step);
  {
    std::lock_guard<std::mutex> lock(m_controlMutex);
    m_outbox.push_back(std::move(m));
  }
  m_wake.notify_one();
}

void Transport::sendBatchRecords(std::vector<Record>& records,
                                 std::vector<std::pair<uint32_t, std::string>>& strings) {
  size_t i = 0;
  do {
    v1::AgentMessage message;
    v1::EventBatch* batch = message.mutable_batch();
    batch->set_batch_seq(++m_batchSeq);
    for (auto& [iid, value] : strings) {
      auto* s = batch->add_strings();
      s->set_iid(iid);
      s->set_value(std::move(value));
    }
    strings.clear();
    const size_t end = std::min(records.size(), i + kMaxEventsPerBatch);
    for (; i < end; ++i) toEvent(records[i], batch->add_events());
    deliver(message, static_cast<uint64_t>(batch->events_size()));
  } while (i < records.size());
}

bool Transport::deliver(const v1::AgentMessage& message, uint64_t events) {
  switch (m_link) {
    case LinkState::kLive:
      if (m_stream->Write(message)) {
        m_eventsSent += events;
        return true;
      }
      // The stream broke: the server went away or refused a message.
      m_link = LinkState::kLost;
      if (m_reader.joinable()) m_reader.join();
      m_linkError = m_stream->Finish().error_message();
      m_droppedDisconnected += events;
      return false;
    case LinkState::kNeverConnected:
      if (m_spool->bytes() == 0) {
        v1::AgentMessage hello;
        *hello.mutable_handshake() = m_config.handshake;
        hello.mutable_handshake()->set_first_batch_seq(1);
        m_spool->append(hello);
      }
      if (m_spool->append(message)) {
        m_eventsSpooled += events;
        m_eventsSent += events;
        return true;
      }
      m_droppedSpoolFull += events;
      return false;
    case LinkState::kLost:
    case LinkState::kRefused:
      m_droppedDisconnected += events;
      return false;
  }
  return false;
}

bool Transport::tryConnect() {
  if (!m_channel) {
    m_channel = grpc::CreateChannel(m_config.server, grpc::InsecureChannelCredentials());
    m_stub = v1::Ingest::NewStub(m_channel);
  }
  if (!m_channel->WaitForConnected(std::chrono::system_clock::now() +
                                   std::chrono::milliseconds(200))) {
    return false;
  }
  m_context = std::make_unique<grpc::ClientContext>();
  m_stream = m_stub->Stream(m_context.get());
  v1::AgentMessage hello;
  *hello.mutable_handshake() = m_config.handshake;
  // Batches spooled before this connection are replayed first, so the stream starts at 1.
  hello.mutable_handshake()->set_first_batch_seq(1);
  v1::ServerMessage reply;
  if (!m_stream->Write(hello) || !m_stream->Read(&reply) || !reply.has_handshake_reply()) {
    const grpc::Status status = m_stream->Finish();
    m_stream.reset();
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) return false;  // retry later
    m_link = LinkState::kRefused;
    m_linkError = status.error_message();
    return false;
  }
  m_sessionId = reply.handshake_reply().session_id();
  m_link = LinkState::kLive;
  m_reader = std::thread([this] { readCommands(); });
  return replaySpool();
}

bool Transport::replaySpool() {
  if (m_spool->bytes() == 0) return true;
  m_spool->flush();
  const std::string path = m_spool->path();
  SpoolReader reader(path);
  v1::AgentMessage message;
  bool first = true;
  while (reader.next(&message)) {
    if (first) {  // the spooled handshake: the live one replaced it
      first = false;
      continue;
    }
    if (!m_stream->Write(message)) {
      m_link = LinkState::kLost;
      return false;
    }
  }
  m_spool = std::make_unique<SpoolWriter>(path, 0);  // closes the file; nothing more goes there
  std::remove(path.c_str());
  m_eventsSpooled = 0;
  return true;
}

void Transport::readCommands() {
  t_recursionGuard = true;
  v1::ServerMessage message;
  while (m_stream->Read(&message)) {
    if (!message.has_command()) continue;
    const v1::Command& cmd = message.command();
    if (cmd.has_start_capture()) m_recorder.setRecording(true);
    if (cmd.has_stop_capture()) m_recorder.setRecording(false);
    if (cmd.has_apply_plan()) {
      std::lock_guard<std::mutex> lock(m_controlMutex);
      m_plans.emplace_back(cmd.apply_plan().plan_id(), cmd.apply_plan().plan_json());
    }
  }
  m_readerDone = true;
}

void Transport::closeStream(const v1::Goodbye& goodbye,
                            std::chrono::steady_clock::time_point deadline) {
  v1::AgentMessage bye;
  *bye.mutable_goodbye() = goodbye;
  if (m_link == LinkState::kNeverConnected) {
    m_spool->append(bye);
    m_spool->flush();
    return;
  }
  if (m_link != LinkState::kLive) return;
  m_stream->Write(bye);
  m_stream->WritesDone();
  while (!m_readerDone && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!m_readerDone) {
    // The server did not close the stream after the goodbye: it may have stored nothing of it.
    m_closedCleanly = false;
    m_context->TryCancel();
  }
  if (m_reader.joinable()) m_reader.join();
  const grpc::Status status = m_stream->Finish();
  if (!status.ok()) {
    m_link = LinkState::kLost;
    m_linkError = status.error_message();
  }
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
  m_wake.notify_all();
  const bool done =
      m_progress.wait_for(lock, std::chrono::milliseconds(timeoutMs), [this] { return m_stopped; });
  lock.unlock();
  if (done) {
    if (m_thread.joinable()) m_thread.join();
  } else {
    m_closedCleanly = false;
    // Give up: the stream is cancelled and the sender left to end on its own (it stops the
    // collector on its way out; meanwhile the rings keep being emptied).
    if (m_context) m_context->TryCancel();
    if (m_thread.joinable()) m_thread.detach();
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
  c.set_dropped_disconnected(m_droppedDisconnected.load());
  c.set_dropped_buffer_full(m_log.refused());
  c.set_ring_waits(m_recorder.ringWaits());
  c.set_degraded(m_recorder.degraded());
  c.set_lossy(m_recorder.lossy());
  c.set_events_buffered_to_disk(m_log.spilledTotal());
  return c;
}

std::string Transport::summary() const {
  const v1::AgentCounters c = counters();
  const uint64_t dropped = c.dropped_ring_full() + c.dropped_no_ring() + c.dropped_table_full() +
                           c.dropped_spool_full() + c.dropped_disconnected() +
                           c.dropped_buffer_full();
  char line[1024];
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
  switch (m_link) {
    case LinkState::kLive:
      std::snprintf(line, sizeof line,
                    "tidemark: session %llu: %llu events sent to %s, %llu dropped",
                    static_cast<unsigned long long>(m_sessionId.load()),
                    static_cast<unsigned long long>(c.events_sent()), m_config.server.c_str(),
                    static_cast<unsigned long long>(dropped));
      break;
    case LinkState::kNeverConnected:
      std::snprintf(line, sizeof line,
                    "tidemark: no tidemarkd answered at %s; %llu events spooled to %s "
                    "(%llu dropped); load them with: tidemark upload %s",
                    m_config.server.c_str(), static_cast<unsigned long long>(c.events_spooled()),
                    m_config.spoolPath.c_str(), static_cast<unsigned long long>(dropped),
                    m_config.spoolPath.c_str());
      break;
    case LinkState::kLost:
      std::snprintf(line, sizeof line,
                    "tidemark: connection to %s lost (%s); %llu events sent to session %llu, "
                    "%llu dropped",
                    m_config.server.c_str(), m_linkError.c_str(),
                    static_cast<unsigned long long>(c.events_sent()),
                    static_cast<unsigned long long>(m_sessionId.load()),
                    static_cast<unsigned long long>(dropped));
      break;
    case LinkState::kRefused:
      std::snprintf(line, sizeof line,
                    "tidemark: tidemarkd at %s refused the agent (%s); %llu events dropped",
                    m_config.server.c_str(), m_linkError.c_str(),
                    static_cast<unsigned long long>(dropped));
      break;
  }
  return line;
}

}  // namespace tidemark::agent
