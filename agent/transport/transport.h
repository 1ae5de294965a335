#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "agent/capture/capture_filter.h"
#include "agent/recorder/recorder.h"
#include "agent/transport/interner.h"
#include "agent/transport/record_log.h"
#include "agent/transport/spool.h"
#include "tidemark/v1/ingest.grpc.pb.h"

namespace tidemark::agent {

struct TransportConfig {
  std::string server;                  // gRPC target, e.g. "unix:/path" or "127.0.0.1:7531"
  std::string token;                   // presented on the stream when not empty
  std::string tlsCa, tlsCert, tlsKey;  // PEM files: TLS when tlsCa is set (client::ChannelOptions)
  int flushIntervalMs = 20;            // how often the drain thread empties the rings
  int ringWaitDeadlineMs = 2000;       // for the degraded-mode message (the recorder enforces it)
  int ackTimeoutMs = 10000;            // a daemon that acknowledges nothing for this long is hung
  int exitTimeoutMs = 5000;            // the exit's wait for the daemon (reconnecting, acks)
  bool quiet = false;
  std::string spoolPath;  // where the rest goes at exit when no server takes it
  uint64_t spoolCapBytes = 256ull << 20;
  // At exit, when at least this many events are not acknowledged yet, they are handed to the
  // daemon in a file (Ingest's Handoff) instead of sent at its pace, so the exit takes a local
  // write; to a daemon on this host (Unix socket, loopback) without a token or TLS only. 0:
  // never. The default is about half a second of the daemon's ingest.
  uint64_t handoffMinEvents = 262144;
  // The file: at handoffMemoryPath when not empty (a memory file system) and the file is no
  // larger than what the agent holds in memory (the window and the buffer's memory), else — or
  // when it cannot be written there — at handoffPath (the spool directory: any size).
  std::string handoffMemoryPath;
  std::string handoffPath;
  std::string bufferDir;                     // where the buffer spills past its memory cap
  uint64_t bufferMemoryBytes = 64ull << 20;  // the buffer's memory cap
  uint64_t bufferFileBytes = 256ull << 20;   // its file's cap
  uint64_t windowBytes = 48ull << 20;        // batches sent and not acknowledged yet, at most
  uint64_t firstEventSeq = 1;                // the session's first event (process-wide numbers)
  v1::Handshake handshake;  // pid, command line, ... (protocol fields are filled in here)
  // Full detail only in these steps, summaries elsewhere (agent/capture); none: every step.
  std::optional<core::CaptureSchedule> schedule;
};

// The agent's two threads. The collector empties the rings into the buffer (RecordLog) whenever
// a thread waits for room or every flush interval, whatever the link does, so a thread never
// waits on the network. The sender batches the buffer's records into EventBatches in sequence
// order, writes them to the stream and keeps each one (serialized, in the window) until the
// server acknowledges that it committed it. When the stream breaks, or the server acknowledges
// nothing for ackTimeoutMs (a hung daemon), the sender reconnects with backoff and resumes the
// session from the batch the server asks for; meanwhile records wait in the buffer. At exit,
// what no server took goes to a spool file for `tidemark upload`.
class Transport {
 public:
  Transport(Recorder& recorder, Interner& interner, TransportConfig config);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  void start();
  // Final drain, goodbye, close, waiting at most timeoutMs; past it the stream is cancelled and
  // what the daemon did not confirm goes to the spool file, given kSpoolGraceMs more (a local
  // write). Idempotent.
  static constexpr int kSpoolGraceMs = 5000;
  // The stream cancelled, a sender still inside a write to it this long after is taken over: the
  // exit's thread writes the spool itself (gRPC's synchronous write to a daemon that reads
  // nothing — stopped, hung — did not always return on cancellation, and the rest was lost).
  static constexpr int kTakeOverAfterMs = 500;
  // An exit still delivering after this long hands the rest to the daemon in a file (when it
  // can: handoffPossible) instead of waiting for the daemon's pace to the exit's bound.
  static constexpr int kHandoffAfterMs = 1000;
  void shutdown(int timeoutMs);
  // Waits (at most timeoutMs) until every record pushed before the call has been sent.
  bool flush(int timeoutMs);
  // The capture schedule's filter (nullptr: every step in full detail).
  const CaptureFilter* captureFilter() const { return m_filter.get(); }

  uint64_t sessionId() const { return m_sessionId.load(); }

  // Recompute plans the server sent, oldest first, for the adapter to apply (false: none).
  bool takePlan(uint64_t* planId, std::string* json);
  // Puts back a plan the caller could not take (its buffer was too small).
  void returnPlan(uint64_t planId, std::string json);
  // Sends what became of a plan, with the next batch.
  // planId 0: a plan the job applied itself, planJson its document.
  void reportPlanResult(uint64_t planId, bool applied, std::string message, int64_t step,
                        std::string planJson = {});
  v1::AgentCounters counters() const;
  // One line for stderr: where the events went.
  std::string summary() const;

 private:
  enum class LinkState { kDown, kLive, kRefused };
  // kNoMemory: the exit found no memory to deliver, hand off or spool the rest (abandonRest).
  enum class Ending { kRunning, kDelivered, kSpooled, kRefused, kHandedOff, kNoMemory };
  // A batch written (or to be written) and not acknowledged yet.
  struct Unacked {
    uint64_t batchSeq = 0;
    uint64_t firstEventSeq = 0;
    uint64_t events = 0;
    uint64_t cost = 0;     // its memory, estimated
    std::string bytes;     // the serialized AgentMessage, written as it is
    bool written = false;  // on the current stream
    std::chrono::steady_clock::time_point writtenAt{};
  };
  // A plan's result on its way to the store: kept until the daemon has certainly read it (the
  // acknowledgement of a batch made after it was written, or the goodbye's), written again on
  // the next stream when the link breaks before, and put in the spool or handed-off file at
  // the exit (the store takes a result it has already as the same one).
  struct Outgoing {
    v1::AgentMessage message;
    uint64_t number = 0;         // in the order queued
    uint64_t readOnceAcked = 0;  // 0: not written on the current stream
  };
  // Results kept (the oldest is let go past it, said once): far more than a job applies plans.
  static constexpr size_t kMaxOutgoing = 1024;

  void spawnThreads();
  void run();
  // The exit's delivery: the rest to the daemon (reconnecting while the exit's time allows),
  // in a handed-off file, or to the spool.
  void deliverRest();
  void collect();
  void stopCollector();
  // The collector's: cancels the stream of a daemon that acknowledged nothing for too long.
  void watchdog();
  // One pass of the sender: forget acknowledged batches, detect a hung server, write what the
  // window holds and new batches while the window has room.
  void pump();
  // Batches what the buffer holds while the window has room (everything: unbounded).
  bool fillWindow(bool unbounded = false);
  // The window's next batch: the carried strings, `records` and `counters` (countersToReport;
  // pump sends them alone when a loss or a failure was counted and nothing else is to be sent).
  void addBatch(const std::vector<Record>& records, const std::string& counters);
  // The counters for the next batch (of batchEvents events), serialized, when they are due: at
  // once when a loss, an adapter failure or degraded mode was counted since the last report, or
  // (unless onlyOnTrouble) a second after it; else "" (the batch carries none).
  std::string countersToReport(size_t batchEvents, bool onlyOnTrouble = false);
  // At exit: whether the rest is handed to the daemon in a file (thread-safe), and the handoff
  // itself (true when the daemon took the file; else the window holds the whole rest).
  bool handoffPossible() const;
  bool handoffOffered() const;
  // Whether the daemon takes the spool up itself once this process has exited (a daemon of this
  // user on this host, the spool in the user's default spool directory, where it looks:
  // server/rpc/handoff_taker.h); else only `tidemark upload` delivers it.
  bool daemonTakesSpool() const;
  // Where such a daemon would look: the spool in the user's default spool directory, a daemon
  // on this host (a Unix socket or loopback), no token or TLS (the daemon's own user's).
  bool spoolInUsersDirectory() const;
  bool handOff(std::chrono::steady_clock::time_point deadline);
  void writeWindow();
  // Publishes since when the oldest written batch waits (for the collector's watchdog).
  void noteWaiting();
  bool tryConnect();  // never throws: a connection that found no memory is tried again later
  bool connect();
  // The gRPC channel to the daemon (m_channel stays empty when it cannot be made: m_untrusted).
  void openChannel();
  // The agent could not get memory (the job at its limit, `ulimit -v`) or a thread: said once
  // on stderr; the pass that failed is tried again later with nothing it held lost.
  void noteShortage(const char* what, bool count = true) noexcept;
  // Runs one of the sender's steps; an exception (no memory) is noted and swallowed, never let
  // out of the agent's thread (where it would end the job). False if it threw.
  template <typename Step>
  bool survive(Step&& step) noexcept {
    try {
      step();
      return true;
    } catch (const std::exception& e) {
      noteShortage(e.what());
    } catch (...) {
      noteShortage("an unknown exception");
    }
    return false;
  }
  // The exit could not deliver, spool or hand off the rest for want of memory: what is left is
  // counted as dropped, and the summary says why.
  void abandonRest() noexcept;
  // The stream is gone: cancel it, say so once, reconnect later.
  void loseLink(const std::string& why);
  void readCommands();
  void readMessages(v1::ServerMessage& message);
  bool closeStream(std::chrono::steady_clock::time_point deadline);
  // Ends the current stream (cancelled unless the server ended it); the link is down after.
  grpc::Status endStream();
  // One AgentMessage on the stream, from its bytes or serialized here. False if the stream broke.
  bool write(const std::string& bytes);
  bool write(const v1::AgentMessage& message);
  // The sender's calls that may block on the daemon (a write, the end of writes, the stream's
  // end: its reader joined and its status read), made so that the exit may take the sender over
  // meanwhile (takeOverStuckSender): if it did, the sender never touches the transport again
  // once the call returns — it waits for ever, a thread without signals of a process that is
  // ending (or, after a detach, retired).
  template <typename Call>
  bool streamCall(Call&& call);
  // The exit's: if the sender is inside a stream call, it is taken over — the collector stopped,
  // the rest spooled here, the sender left for good. False if it was not (it may be about to
  // end on its own).
  bool takeOverStuckSender();
  void spoolRest();
  // Writes the plans' results not written on this stream yet; forgets those the daemon has read.
  void sendOutbox();
  // A plan's result for the daemon (under m_controlMutex).
  void queueOutgoing(v1::AgentMessage message);
  // The results not known to be read, for the exit's file.
  std::vector<v1::AgentMessage> outgoingForFile();
  void scheduleReconnect();

  Recorder& m_recorder;
  Interner& m_interner;
  TransportConfig m_config;

  std::thread m_thread;
  std::thread m_collector;
  std::atomic<bool> m_collectorStop{false};
  std::once_flag m_collectorStopped;
  uint64_t m_collectPasses = 0;  // under m_mutex
  RecordLog m_log;
  std::unique_ptr<CaptureFilter> m_filter;  // the collector's
  bool m_toldDegraded = false;
  // The collector left the rings full at least once: the buffer was full (said with the
  // degraded mode, the likely reason for it).
  std::atomic<bool> m_heldBack{false};
  // False when shutdown() gave up waiting for the sender (its exit outran the exit timeout):
  // what it wrote is not confirmed. Read by summary().
  std::atomic<bool> m_closedCleanly{true};
  // The sender's exit is writing the spool: a summary written while it still does (shutdown gave
  // up on it) names the file, which holds what was written by then.
  std::atomic<bool> m_spooling{false};
  // Where the sender is: outside a stream call, inside one, or taken over (streamCall).
  enum SenderState : uint32_t { kSenderOutside = 0, kSenderInStreamCall = 1, kSenderTakenOver = 2 };
  std::atomic<uint32_t> m_senderState{kSenderOutside};
  // The exit's deadline for reconnecting (a handshake's wait is cut to it), and whether the
  // exit's whole time ran out (shutdown cancelled the stream: what is left goes to the spool).
  std::chrono::steady_clock::time_point m_exitDeadline =
      std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point m_exitFullDeadline =
      std::chrono::steady_clock::time_point::min();  // the exit's whole time (set at the exit)
  bool m_daemonSeen = false;  // a connection to the daemon was made (the sender's)
  std::atomic<bool> m_outOfTime{false};
  std::thread m_reader;
  std::mutex m_mutex;
  std::condition_variable m_wake;
  std::condition_variable m_progress;
  std::atomic<bool> m_stopRequested{false};
  bool m_stopped = false;
  bool m_started = false;
  uint64_t m_passes = 0;

  // The link (the sender's; summary() reads it after shutdown).
  LinkState m_link = LinkState::kDown;
  std::atomic<Ending> m_ending{Ending::kRunning};
  std::string m_linkError;
  bool m_everConnected = false;
  bool m_toldLost = false;
  std::atomic<uint64_t> m_shortages{0};  // steps that found no memory (noteShortage)
  std::atomic<bool> m_toldShortage{false};
  uint64_t m_streamBreaks = 0;    // the live stream lost (not ended for a handoff or the exit)
  bool m_goodbyeWritten = false;  // a goodbye went out on some stream
  // The server said, when asked to continue the session, that it had ended whole: the answer to
  // the goodbye was lost on the way (the exit line says so).
  std::atomic<bool> m_confirmationLost{false};
  // A session could not be resumed: the new one gets every interned string again.
  bool m_resendStrings = false;
  // Strings not in a batch yet (taken from the interner, or every string for a new session).
  std::vector<std::pair<uint32_t, std::string>> m_carriedStrings;
  // The records of the next batch, taken from the buffer (kept when their encoding found no
  // memory: the next pass encodes them again).
  std::vector<Record> m_batchRecords;
  // What the last batch with counters reported (countersToReport): when, and its losses and
  // adapter failures (summed).
  std::chrono::steady_clock::time_point m_countersReportedAt{};
  uint64_t m_reportedTrouble = 0;
  int m_backoffMs = 0;
  std::chrono::steady_clock::time_point m_nextConnect{};
  std::chrono::steady_clock::time_point m_lastWrite{};
  std::shared_ptr<grpc::Channel> m_channel;
  std::unique_ptr<grpc::internal::RpcMethod> m_streamMethod;  // registered with m_channel
  std::unique_ptr<grpc::ClientContext> m_context;  // replaced by the sender under the mutex
  std::mutex m_contextMutex;
  // Since when the oldest written batch waits for its acknowledgement (steady ns, 0: none). The
  // collector cancels the stream when that passes the bound: a sender blocked in a write to a
  // hung daemon cannot notice it itself.
  std::atomic<int64_t> m_waitingSinceNs{0};
  std::atomic<bool> m_watchdogFired{false};
  // Writes serialized AgentMessages (write()), reads ServerMessages.
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, v1::ServerMessage>> m_stream;
  // Why nothing is sent to the daemon: not run by this user or root, or TLS files that cannot
  // be read ("": it is sent to).
  std::string m_untrusted;
  bool m_toldUntrusted = false;
  std::string m_handoffPath;   // the file handed to the daemon at exit (handOff)
  std::string m_spoolFailure;  // why the exit spool could not be written ("": it was)

  // Written by the reader thread.
  std::mutex m_replyMutex;
  std::condition_variable m_replyCv;
  bool m_gotReply = false;
  v1::HandshakeReply m_reply;
  std::atomic<bool> m_readerDone{false};
  std::atomic<uint64_t> m_ackedSeq{0};

  std::deque<Unacked> m_window;
  uint64_t m_windowBytes = 0;
  uint64_t m_nextBatchSeq = 1;
  uint64_t m_nextEventSeq = 1;  // of the next batch's first event

  // Plans in from the server, results out to it (both rare; one mutex).
  std::mutex m_controlMutex;
  std::deque<std::pair<uint64_t, std::string>> m_plans;
  // The plans taken in (the latest kPlanIdsKept) and their results once reported: a plan sent
  // again is not taken again; if it was answered, its answer goes again (the first may have
  // been lost with its stream).
  static constexpr size_t kPlanIdsKept = 4096;
  std::unordered_map<uint64_t, std::optional<v1::PlanResult>> m_planAnswers;
  std::deque<uint64_t> m_planIdsInOrder;
  std::deque<Outgoing> m_outbox;
  uint64_t m_outgoingNumbers = 0;
  bool m_toldOutboxFull = false;

  std::atomic<uint64_t> m_sessionId{0};
  // The number drawn for the session this agent makes (Handshake.agent_instance): a handshake
  // sent again after its answer came too late continues the session the first one made. Drawn
  // again when the agent makes a new session on purpose (one that could not be resumed).
  uint64_t m_instance = 0;
  std::atomic<uint64_t> m_eventsSent{0};
  std::atomic<uint64_t> m_eventsSpooled{0};
  std::atomic<uint64_t> m_eventsHandedOff{0};
  bool m_takesRaw = false;  // the daemon reads RawRecords in a handed-off file (its reply said)
  // Events in the window not acknowledged (the sender's, for shutdown), and whether the exit
  // hands the rest over in a file.
  std::atomic<uint64_t> m_windowEvents{0};
  std::atomic<bool> m_handingOff{false};
  std::atomic<uint64_t> m_droppedSpoolFull{0};
  std::atomic<uint64_t> m_droppedDisconnected{0};
  std::atomic<uint64_t> m_reconnects{0};
};

}  // namespace tidemark::agent
