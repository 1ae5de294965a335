// A session at scale, end to end against a running tidemarkd:
//  1. ingest: streams a synthetic session of N events through the real Ingest API (gRPC over
//     loopback) and times it until the stream's status is back (the daemon returns it only once
//     everything is committed). The events are made while they are sent (a thread of their own,
//     16 batches ahead), so the client's memory does not grow with N. Beside it, the raw SQLite
//     rate: up to 10M events inserted one plain row per event, WAL, one prepared statement, one
//     transaction.
//  2. analysis: how long until the daemon has stored the session's analysis; then the stored
//     peak, checked against the generator's own (exit 1 if they differ), and its query time.
//  3. timeline queries (2000 buckets) over the full range and over a zoomed range (the middle
//     tenth), each repeated; the median and the worst in milliseconds.
//
// With --tensors the session is a GPU job's as the agent records it with torch's tensor view:
// the blocks are tensors inside device segments (one per 256 tensors' worth of addresses), so the
// analysis also ties every tensor to its segment and counts the segments' slack.
//
// With --live-queries the session is also queried while it is live, at its start (after a tenth
// of its events) and at its end (before the goodbye): the whole peak (checked against the
// generator's so far), the steps, the 2000-bucket timeline over the whole and a zoomed range, the
// breakdown at the last step's peak; the median in milliseconds of each, at both moments, and the
// first peak query's (cold: it replays the window of events since the last step).
//
//   bench_scale --server 127.0.0.1:PORT --events 10000000 --scratch /tmp/raw.db [--tensors]
//               [--progress]          (every 50M events sent, on stderr)
//               [--no-raw]            (no raw SQLite rate: 0 in the JSON)
//               [--ns-per-event N]    (the events' spacing; else 50 to 150 ns)
//               [--step-events N]     (a step mark every N events)
//               [--live-queries]
//               [--leave-live]        (no goodbye: once every batch is acknowledged the stream
//                                      breaks, the session is left live for an agent to resume)
//   bench_scale --server 127.0.0.1:PORT --resume SESSION
//       resumes a session left live (after a restart of the daemon), then asks for its peak
//       until it is answered: past the blocks a query may load whole, that is once the daemon
//       has built the session's live analysis again from the store; prints the seconds taken.
#include <grpcpp/grpcpp.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tidemark/v1/ingest.grpc.pb.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace v1 = tidemark::v1;

namespace {

// A training-like stream: blocks allocated and freed LIFO-ish around a set of long-lived ones,
// with a tag now and then. Deterministic. It knows its own truth: the tracked bytes at their
// highest (without --tensors, where every block counts), to check the daemon's figure against.
class Generator {
 public:
  Generator(uint64_t seed, bool tensors, int64_t nsPerEvent, uint64_t stepEvents)
      : m_rng(seed), m_tensors(tensors), m_nsPerEvent(nsPerEvent), m_stepEvents(stepEvents) {}
  void fill(v1::EventBatch* batch, size_t count) {
    for (size_t i = 0; i < count; ++i) {
      v1::Event* e = batch->add_events();
      e->set_seq(++m_seq);
      m_ts += m_nsPerEvent > 0 ? m_nsPerEvent : 50 + static_cast<int64_t>(m_rng() % 100);
      e->set_ts_ns(m_ts);
      e->set_thread_id(1000);
      if (m_stepEvents > 0 && (m_seq % m_stepEvents == 1 || m_beginNext)) {
        // Step marks: the end of the running step, then the begin of the next at the event after.
        if (m_inStep) {
          e->mutable_step_end()->set_step(m_step++);
          m_inStep = false;
          m_beginNext = true;
        } else {
          e->mutable_step_begin()->set_step(m_step);
          m_stepBegin = m_seq;
          m_inStep = true;
          m_beginNext = false;
        }
        continue;
      }
      if (m_tensors && (m_next - 1) % kTensorsPerSegment == 0 && m_segments < m_next) {
        // A new segment for the next tensors' addresses (the cache growing); never freed.
        auto* a = e->mutable_alloc();
        a->set_address(kBase + ((m_next - 1) << 12));
        a->set_size_bytes(kTensorsPerSegment << 12);
        a->set_kind(v1::MEMORY_KIND_DEVICE);
        a->set_device(0);
        m_segments = m_next;
        continue;
      }
      const bool freeOne = !m_live.empty() && (m_live.size() > 4096 || (m_rng() % 2) == 0);
      // With step marks, a tag names a block born in the running step, a few events before, as
      // the adapter's do.
      if (m_seq % 97 == 0 && !m_live.empty() &&
          (m_stepEvents == 0 || (m_born.back() > m_stepBegin && m_born.back() + 1000 > m_seq))) {
        auto* t = e->mutable_tag();
        t->set_address(m_live.back());
        t->set_size_bytes(4096);
        t->set_category(v1::CATEGORY_ACTIVATION);
      } else if (freeOne) {
        const size_t k = m_live.size() - 1 - (m_rng() % std::min<size_t>(m_live.size(), 8));
        auto* f = e->mutable_free();
        f->set_address(m_live[k]);
        if (m_tensors) {
          f->set_kind(v1::MEMORY_KIND_TENSOR);
          f->set_device(0);
        }
        m_liveBytes -= m_sizes[k];
        m_live.erase(m_live.begin() + static_cast<long>(k));
        m_sizes.erase(m_sizes.begin() + static_cast<long>(k));
        m_born.erase(m_born.begin() + static_cast<long>(k));
      } else {
        const uint64_t addr = kBase + (m_next++ << 12);
        auto* a = e->mutable_alloc();
        a->set_address(addr);
        const uint64_t size = m_tensors ? 64 + (m_rng() % 4032) : 64 + (m_rng() % 65536);
        a->set_size_bytes(size);
        if (m_tensors) {
          a->set_kind(v1::MEMORY_KIND_TENSOR);
          a->set_device(0);
        }
        m_live.push_back(addr);
        m_sizes.push_back(size);
        m_born.push_back(m_seq);
        m_liveBytes += size;
        m_peakBytes = std::max(m_peakBytes, m_liveBytes);
      }
    }
  }
  uint64_t peakBytes() const { return m_peakBytes; }
  int64_t steps() const { return m_step; }

 private:
  static constexpr uint64_t kBase = 0x7f0000000000ull;
  static constexpr uint64_t kTensorsPerSegment = 256;  // 4 KiB of addresses each
  std::mt19937_64 m_rng;
  bool m_tensors = false;
  int64_t m_nsPerEvent = 0;
  uint64_t m_stepEvents = 0;
  int64_t m_step = 0;
  bool m_inStep = false;
  bool m_beginNext = false;
  uint64_t m_segments = 0;  // m_next when the last segment was made
  uint64_t m_seq = 0;
  int64_t m_ts = 1'000'000'000;
  uint64_t m_next = 1;
  std::vector<uint64_t> m_live;
  std::vector<uint64_t> m_sizes;
  std::vector<uint64_t> m_born;  // each live block's allocation seq
  uint64_t m_stepBegin = 0;
  uint64_t m_liveBytes = 0;
  uint64_t m_peakBytes = 0;
};

double seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double rawSqliteRate(const std::string& path, long events) {
  std::remove(path.c_str());
  sqlite3* db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) return 0;
  sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;", nullptr, nullptr,
               nullptr);
  sqlite3_exec(db,
               "CREATE TABLE event(id INTEGER PRIMARY KEY, session_id INT, seq INT, ts_ns INT, "
               "kind INT, address INT, size_bytes INT, thread_id INT)",
               nullptr, nullptr, nullptr);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(db, "INSERT INTO event VALUES (NULL, 1, ?1, ?2, ?3, ?4, ?5, 1000)", -1, &st,
                     nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr);
  for (long i = 0; i < events; ++i) {
    sqlite3_bind_int64(st, 1, i + 1);
    sqlite3_bind_int64(st, 2, 1'000'000'000 + i * 100);
    sqlite3_bind_int64(st, 3, 1 + (i & 1));
    sqlite3_bind_int64(st, 4, 0x7f0000000000ll + (i << 12));
    sqlite3_bind_int64(st, 5, 64 + (i % 65536));
    sqlite3_step(st);
    sqlite3_reset(st);
  }
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  const double s = seconds(t0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  return static_cast<double>(events) / s;
}

// 3. timeline queries: prints the figures and closes the JSON object.
int timeTimelines(const std::shared_ptr<grpc::Channel>& channel, uint64_t session,
                  const v1::SessionInfo* known) {
  auto query = v1::Query::NewStub(channel);
  v1::SessionInfo info;
  if (known != nullptr) {
    info = *known;
  } else {
    grpc::ClientContext c;
    v1::GetSessionRequest r;
    r.set_session_id(session);
    if (!query->GetSession(&c, r, &info).ok()) return 1;
  }
  auto timeQueries = [&](int64_t from, int64_t to, int repeats) {
    std::vector<double> ms;
    for (int i = 0; i < repeats; ++i) {
      grpc::ClientContext c;
      v1::TimelineRequest r;
      r.set_session_id(session);
      r.set_from_ts_ns(from);
      r.set_to_ts_ns(to);
      r.set_buckets(2000);
      v1::Timeline t;
      const auto q0 = std::chrono::steady_clock::now();
      if (!query->GetTimeline(&c, r, &t).ok() || !t.precomputed() || t.buckets_size() != 2000) {
        std::fprintf(stderr, "bench_scale: timeline query failed\n");
        std::exit(1);
      }
      ms.push_back(seconds(q0) * 1e3);
    }
    std::sort(ms.begin(), ms.end());
    return std::make_pair(ms[ms.size() / 2], ms.back());
  };
  const int64_t start = info.start_ts_ns();
  const int64_t end = info.end_ts_ns();
  const auto full = timeQueries(start, end, 20);
  const int64_t span = end - start;
  const auto zoom = timeQueries(start + span * 45 / 100, start + span * 55 / 100, 20);

  std::printf(
      "\"timeline_full_ms_median\": %.2f, \"timeline_full_ms_max\": %.2f, "
      "\"timeline_zoom_ms_median\": %.2f, \"timeline_zoom_ms_max\": %.2f, "
      "\"session\": %llu}\n",
      full.first, full.second, zoom.first, zoom.second, static_cast<unsigned long long>(session));
  return 0;
}

// Queries a live session (everything sent so far ingested) and returns its figures as JSON
// fields "live_<label>_*"; exits 1 when an answer is wrong (the whole peak, when it is known).
std::string liveQueries(const std::shared_ptr<grpc::Channel>& channel, uint64_t session,
                        const std::string& label, long events, int64_t expectedPeak) {
  auto query = v1::Query::NewStub(channel);
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "bench_scale: live %s: %s\n", label.c_str(), what.c_str());
    std::exit(1);
  };
  auto median = [](std::vector<double> ms) {
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  constexpr int kRepeats = 15;
  // The first peak query replays the window of events not replayed yet; the others find it
  // replayed (nothing came in between): "cold" is the first.
  std::vector<double> coldMs, peakMs, stepsMs, fullMs, zoomMs, breakdownMs;
  int64_t lastTs = 0, startTs = 0;
  int64_t lastStep = -1;
  for (int i = 0; i < kRepeats; ++i) {
    {
      grpc::ClientContext c;
      v1::PeakRequest r;
      r.set_session_id(session);
      v1::Peak p;
      const auto q0 = std::chrono::steady_clock::now();
      const grpc::Status st = query->GetPeak(&c, r, &p);
      (i == 0 ? coldMs : peakMs).push_back(seconds(q0) * 1e3);
      if (!st.ok()) fail("GetPeak: " + st.error_message());
      if (expectedPeak >= 0 && p.breakdown().tracked_bytes() != expectedPeak)
        fail("the peak is " + std::to_string(p.breakdown().tracked_bytes()) +
             " bytes, the generator's " + std::to_string(expectedPeak));
    }
    {
      grpc::ClientContext c;
      v1::StepsRequest r;
      r.set_session_id(session);
      v1::Steps steps;
      const auto q0 = std::chrono::steady_clock::now();
      const grpc::Status st = query->GetSteps(&c, r, &steps);
      stepsMs.push_back(seconds(q0) * 1e3);
      if (!st.ok()) fail("GetSteps: " + st.error_message());
      for (const v1::StepSummary& s : steps.steps())
        if (s.end_ts_ns() != 0) lastStep = std::max<int64_t>(lastStep, s.step());
    }
    for (bool zoom : {false, true}) {
      grpc::ClientContext c;
      v1::TimelineRequest r;
      r.set_session_id(session);
      if (zoom) {
        const int64_t span = lastTs - startTs;
        r.set_from_ts_ns(startTs + span * 45 / 100);
        r.set_to_ts_ns(startTs + span * 55 / 100);
      }
      r.set_buckets(2000);
      v1::Timeline t;
      const auto q0 = std::chrono::steady_clock::now();
      const grpc::Status st = query->GetTimeline(&c, r, &t);
      (zoom ? zoomMs : fullMs).push_back(seconds(q0) * 1e3);
      if (!st.ok() || t.buckets_size() != 2000) fail("GetTimeline: " + st.error_message());
      if (!zoom) {
        startTs = t.from_ts_ns();
        lastTs = t.to_ts_ns();
      }
    }
    if (lastStep >= 0) {
      grpc::ClientContext c;
      v1::BreakdownRequest r;
      r.set_session_id(session);
      r.set_has_step(true);
      r.set_step(lastStep);
      r.set_peak(true);
      v1::Breakdown b;
      const auto q0 = std::chrono::steady_clock::now();
      const grpc::Status st = query->GetBreakdown(&c, r, &b);
      breakdownMs.push_back(seconds(q0) * 1e3);
      if (!st.ok()) fail("GetBreakdown: " + st.error_message());
    }
  }
  char out[512];
  std::snprintf(out, sizeof out,
                "\"live_%s_events\": %ld, \"live_%s_peak_ms\": %.2f, \"live_%s_steps_ms\": %.2f, "
                "\"live_%s_timeline_ms\": %.2f, \"live_%s_zoom_ms\": %.2f, "
                "\"live_%s_breakdown_ms\": %.2f, \"live_%s_cold_ms\": %.2f, ",
                label.c_str(), events, label.c_str(), median(peakMs), label.c_str(),
                median(stepsMs), label.c_str(), median(fullMs), label.c_str(), median(zoomMs),
                label.c_str(), breakdownMs.empty() ? -1.0 : median(breakdownMs), label.c_str(),
                coldMs.front());
  return out;
}

}  // namespace

// The handshake of the bench's agent.
v1::AgentMessage benchHello() {
  v1::AgentMessage hello;
  hello.mutable_handshake()->set_magic(0x54444D4B);
  hello.mutable_handshake()->set_protocol_version(1);
  hello.mutable_handshake()->set_pid(1);
  hello.mutable_handshake()->set_command_line("bench_scale");
  // The generator's first timestamp: also the process's start as a resume presents it (the
  // daemon resumes a session only for the process that recorded it: pid, host and start).
  hello.mutable_handshake()->set_start_ts_ns(1'000'000'000);
  return hello;
}

// --resume: the session taken back by a new stream; its peak asked until it is answered.
int resumeAndAsk(const std::shared_ptr<grpc::Channel>& channel, uint64_t session) {
  auto stub = v1::Ingest::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Stream(&ctx);
  v1::AgentMessage hello = benchHello();
  hello.mutable_handshake()->set_resume_session_id(session);
  v1::ServerMessage reply;
  if (!stream->Write(hello) || !stream->Read(&reply) || !reply.has_handshake_reply()) {
    std::fprintf(stderr, "bench_scale: session %llu could not be resumed: %s\n",
                 static_cast<unsigned long long>(session),
                 stream->Finish().error_message().c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto query = v1::Query::NewStub(channel);
  grpc::Status got;
  int refused = 0;
  v1::Peak peak;
  do {
    if (!got.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    grpc::ClientContext c;
    v1::PeakRequest r;
    r.set_session_id(session);
    got = query->GetPeak(&c, r, &peak);
    refused += got.ok() ? 0 : 1;
  } while (!got.ok() && got.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
           seconds(t0) < 600);
  const double answeredS = seconds(t0);
  v1::AgentMessage bye;
  bye.mutable_goodbye();
  stream->Write(bye);
  stream->WritesDone();
  while (stream->Read(&reply)) {
  }
  stream->Finish();
  if (!got.ok()) {
    std::fprintf(stderr, "bench_scale: GetPeak: %s\n", got.error_message().c_str());
    return 1;
  }
  std::printf(
      "{\"session\": %llu, \"answered_s\": %.3f, \"refused_before\": %d, "
      "\"peak_bytes\": %lld}\n",
      static_cast<unsigned long long>(session), answeredS, refused,
      static_cast<long long>(peak.breakdown().tracked_bytes()));
  return 0;
}

int main(int argc, char** argv) {
  std::string server = "127.0.0.1:7531";
  std::string scratch = "/tmp/tidemark-bench-raw.db";
  long events = 10'000'000;
  uint64_t queriesOnly = 0;  // --queries-only SESSION: skip ingest and analysis, time queries
  uint64_t resume = 0;
  bool leaveLive = false;
  bool tensors = false;
  bool progress = false;
  bool raw = true;
  bool live = false;
  int64_t nsPerEvent = 0;
  uint64_t stepEvents = 0;
  for (int i = 1; i < argc; ++i) {
    const bool value = i + 1 < argc;
    if (!std::strcmp(argv[i], "--tensors")) {
      tensors = true;
    } else if (!std::strcmp(argv[i], "--progress")) {
      progress = true;
    } else if (!std::strcmp(argv[i], "--no-raw")) {
      raw = false;
    } else if (!std::strcmp(argv[i], "--live-queries")) {
      live = true;
    } else if (!std::strcmp(argv[i], "--leave-live")) {
      leaveLive = true;
    } else if (value && !std::strcmp(argv[i], "--resume")) {
      resume = std::strtoull(argv[++i], nullptr, 10);
    } else if (value && !std::strcmp(argv[i], "--ns-per-event")) {
      nsPerEvent = std::atoll(argv[++i]);
    } else if (value && !std::strcmp(argv[i], "--step-events")) {
      stepEvents = std::strtoull(argv[++i], nullptr, 10);
    } else if (value && !std::strcmp(argv[i], "--server")) {
      server = argv[++i];
    } else if (value && !std::strcmp(argv[i], "--events")) {
      events = std::atol(argv[++i]);
    } else if (value && !std::strcmp(argv[i], "--scratch")) {
      scratch = argv[++i];
    } else if (value && !std::strcmp(argv[i], "--queries-only")) {
      queriesOnly = std::strtoull(argv[++i], nullptr, 10);
    }
  }
  constexpr size_t kBatch = 8192;

  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  if (queriesOnly != 0) return timeTimelines(channel, queriesOnly, nullptr);
  if (resume != 0) return resumeAndAsk(channel, resume);

  // Batches are made by a thread of their own while the stream sends them, a few at a time, so
  // that a session of any length costs the client the same memory.
  Generator gen(42, tensors, nsPerEvent, stepEvents);
  std::mutex mutex;
  std::condition_variable cv;
  // Each batch with the generator's peak once it is made (the truth a live query is held to).
  std::deque<std::pair<v1::AgentMessage, uint64_t>> ready;
  bool generated = false;
  std::thread producer([&] {
    for (long done = 0, n = 1; done < events; ++n) {
      v1::AgentMessage m;
      const size_t count = static_cast<size_t>(std::min<long>(kBatch, events - done));
      m.mutable_batch()->set_batch_seq(static_cast<uint64_t>(n));
      gen.fill(m.mutable_batch(), count);
      done += static_cast<long>(count);
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return ready.size() < 16; });
      ready.emplace_back(std::move(m), gen.peakBytes());
      cv.notify_all();
    }
    std::lock_guard<std::mutex> lock(mutex);
    generated = true;
    cv.notify_all();
  });

  auto stub = v1::Ingest::NewStub(channel);
  grpc::ClientContext ctx;
  const auto t0 = std::chrono::steady_clock::now();
  auto stream = stub->Stream(&ctx);
  v1::AgentMessage hello = benchHello();
  v1::ServerMessage reply;
  if (!stream->Write(hello) || !stream->Read(&reply)) {
    std::fprintf(stderr, "bench_scale: no tidemarkd at %s\n", server.c_str());
    std::exit(1);
  }
  // Taken now: the reads below replace `reply` with the daemon's acknowledgements.
  const uint64_t session = reply.handshake_reply().session_id();
  // Acknowledgements are read as they come (an agent does), or they would fill the stream.
  std::atomic<uint64_t> acked{0};
  std::thread acks([&] {
    v1::ServerMessage ack;
    while (stream->Read(&ack)) {
      if (ack.has_ack()) acked = std::max<uint64_t>(acked, ack.ack().batch_seq());
    }
  });
  // Live queries once everything sent so far is ingested (acknowledged).
  std::string liveFields;
  const long totalBatches = (events + static_cast<long>(kBatch) - 1) / static_cast<long>(kBatch);
  auto queryLive = [&](const std::string& label, long batches, uint64_t peak) {
    // Each request is answered with what is committed then: asked again until it is all.
    v1::AgentMessage ask;
    ask.mutable_ack_request();
    const auto w0 = std::chrono::steady_clock::now();
    while (acked < static_cast<uint64_t>(batches)) {
      if (seconds(w0) > 120) {
        std::fprintf(stderr, "bench_scale: batches not acknowledged\n");
        std::exit(1);
      }
      stream->Write(ask);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    liveFields += liveQueries(channel, session, label,
                              std::min<long>(batches * static_cast<long>(kBatch), events),
                              tensors ? -1 : static_cast<int64_t>(peak));
  };
  long sentBatches = 0;
  long lastProgress = 0;
  uint64_t sentPeak = 0;
  for (;;) {
    v1::AgentMessage m;
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return !ready.empty() || generated; });
      if (ready.empty()) break;
      m = std::move(ready.front().first);
      sentPeak = ready.front().second;
      ready.pop_front();
      cv.notify_all();
    }
    if (!stream->Write(m)) break;
    ++sentBatches;
    if (live && sentBatches == std::max<long>(totalBatches / 10, 1))
      queryLive("start", sentBatches, sentPeak);
    if (progress && sentBatches * static_cast<long>(kBatch) - lastProgress >= 50'000'000) {
      lastProgress = sentBatches * static_cast<long>(kBatch);
      std::fprintf(stderr, "bench_scale: %ld M events sent, %.0f s\n", lastProgress / 1'000'000,
                   seconds(t0));
    }
  }
  producer.join();
  if (live) queryLive("end", sentBatches, sentPeak);
  if (leaveLive) {
    // Everything committed, then the stream breaks (as an agent's does when its daemon stops).
    v1::AgentMessage ask;
    ask.mutable_ack_request();
    const auto w0 = std::chrono::steady_clock::now();
    while (acked < static_cast<uint64_t>(sentBatches) && seconds(w0) < 600) {
      stream->Write(ask);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const double ingestS = seconds(t0);
    ctx.TryCancel();
    acks.join();
    stream->Finish();
    std::printf("{\"session\": %llu, \"events\": %ld, \"ingest_s\": %.3f, \"acknowledged\": %s}\n",
                static_cast<unsigned long long>(session), events, ingestS,
                acked >= static_cast<uint64_t>(sentBatches) ? "true" : "false");
    return acked >= static_cast<uint64_t>(sentBatches) ? 0 : 1;
  }
  v1::AgentMessage bye;
  bye.mutable_goodbye()->mutable_counters()->set_events_sent(static_cast<uint64_t>(events));
  stream->Write(bye);
  stream->WritesDone();
  acks.join();
  const grpc::Status status = stream->Finish();
  const double ingestS = seconds(t0);
  if (!status.ok()) {
    std::fprintf(stderr, "bench_scale: %s\n", status.error_message().c_str());
    return 1;
  }

  // 2. analysis
  auto query = v1::Query::NewStub(channel);
  const auto a0 = std::chrono::steady_clock::now();
  v1::SessionInfo info;
  for (;;) {
    grpc::ClientContext c;
    v1::GetSessionRequest r;
    r.set_session_id(session);
    const grpc::Status got = query->GetSession(&c, r, &info);
    if (!got.ok()) {
      std::fprintf(stderr, "bench_scale: GetSession: %s\n", got.error_message().c_str());
      return 1;
    }
    if (info.analyzed()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double analysisS = seconds(a0);

  // The stored peak against the generator's own (every block counts without --tensors), and how
  // long the peak query takes.
  int64_t storedPeak = -1;
  std::vector<double> peakMs;
  for (int i = 0; i < 20; ++i) {
    grpc::ClientContext c;
    v1::PeakRequest r;
    r.set_session_id(session);
    v1::Peak peak;
    const auto q0 = std::chrono::steady_clock::now();
    const grpc::Status got = query->GetPeak(&c, r, &peak);
    peakMs.push_back(seconds(q0) * 1e3);
    if (!got.ok()) {
      std::fprintf(stderr, "bench_scale: GetPeak: %s\n", got.error_message().c_str());
      return 1;
    }
    storedPeak = peak.breakdown().tracked_bytes();
  }
  std::sort(peakMs.begin(), peakMs.end());
  if (!tensors && storedPeak != static_cast<int64_t>(gen.peakBytes())) {
    std::fprintf(stderr, "bench_scale: the stored peak is %lld bytes, the generator's %llu\n",
                 static_cast<long long>(storedPeak),
                 static_cast<unsigned long long>(gen.peakBytes()));
    return 1;
  }

  // The raw rate from at most 10M rows: it is a rate, and a billion would take the disk.
  const double rawRate = raw ? rawSqliteRate(scratch, std::min<long>(events, 10'000'000)) : 0;
  std::printf(
      "{\"events\": %ld, \"ingest_s\": %.3f, \"ingest_events_per_s\": %.0f, "
      "\"raw_sqlite_rows_per_s\": %.0f, \"analysis_s\": %.3f, \"peak_bytes\": %lld, "
      "\"peak_ms_median\": %.2f, \"peak_ms_max\": %.2f, %s",
      events, ingestS, events / ingestS, rawRate, analysisS, static_cast<long long>(storedPeak),
      peakMs[peakMs.size() / 2], peakMs.back(), liveFields.c_str());
  return timeTimelines(channel, session, &info);
}
