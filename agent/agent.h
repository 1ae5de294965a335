#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agent/recorder/recorder.h"
#include "agent/transport/interner.h"
#include "agent/transport/transport.h"

namespace tidemark::agent {

// What the agent reads from its environment (set by `tidemark run`).
struct AgentConfig {
  std::string server;   // TIDEMARK_SERVER, else the user's own daemon (base::defaultDaemonAddress)
  std::string token;    // TIDEMARK_TOKEN, or the contents of TIDEMARK_TOKEN_FILE (docs/security.md)
  std::string tlsCa;    // TIDEMARK_TLS_CA: TLS to the daemon, its certificate checked against it
  std::string tlsCert;  // TIDEMARK_TLS_CERT, TIDEMARK_TLS_KEY: the agent's own, when asked for
  std::string tlsKey;
  std::string sessionName;  // TIDEMARK_SESSION_NAME
  std::string spoolDir;     // TIDEMARK_SPOOL_DIR (default base::defaultSpoolDirectory)
  std::string handoffDir;   // TIDEMARK_HANDOFF_DIR (default base::defaultHandoffDirectory)
  uint64_t spoolCapBytes = 256ull << 20;                 // TIDEMARK_SPOOL_MAX_BYTES
  uint32_t ringRecords = Recorder::kDefaultRingRecords;  // TIDEMARK_RING_RECORDS
  size_t tableBuckets = 1u << 17;                        // TIDEMARK_TABLE_BUCKETS (x8 slots)
  int flushIntervalMs = 20;                              // TIDEMARK_FLUSH_MS
  int exitTimeoutMs = 5000;                              // TIDEMARK_EXIT_TIMEOUT_MS
  uint64_t handoffMinEvents = 262144;  // TIDEMARK_HANDOFF_MIN_EVENTS (0: never hand off)
  int ackTimeoutMs = 10000;  // TIDEMARK_ACK_TIMEOUT_MS: no acknowledgement this long = hung
  uint64_t windowBytes = 48ull << 20;        // TIDEMARK_WINDOW_MAX_BYTES: sent, not acknowledged
  uint64_t bufferMemoryBytes = 64ull << 20;  // TIDEMARK_BUFFER_MAX_BYTES (then its file)
  int ringWaitMs = 2000;  // TIDEMARK_RING_WAIT_MS: the longest wait for room in a full ring
  bool lossy = false;     // TIDEMARK_LOSSY=1: full rings drop (counted) instead of waiting
  bool quiet = false;     // TIDEMARK_QUIET=1: no summary line at exit
  // TIDEMARK_STACKS=MIN_BYTES (`tidemark run --stacks`): the Python stack of each allocation of
  // at least MIN_BYTES (agent/python/python_stacks.h). 0: none.
  uint64_t stackMinBytes = 0;
  // TIDEMARK_CAPTURE_STEPS ("3-4,10") or TIDEMARK_CAPTURE_EVERY/_WINDOW: full detail only in
  // those steps, a summary for the others (agent/capture). None: every step in full detail.
  std::optional<core::CaptureSchedule> schedule;
  // Sets schedule from the settings; a bad one is said on stderr and ignored (full detail).
  void setSchedule(const std::string& steps, const std::string& every, const std::string& window);

  static AgentConfig fromEnvironment();
};

// The agent's lifecycle. Loading (the ELF constructor) maps memory and enables the hooks; the
// constructor then starts the collector and sender threads (start()), which open the gRPC channel
// from the sender thread, after the constructor has returned.
class Agent {
 public:
  static Agent& instance();

  // ELF-constructor time: no threads, no gRPC.
  void load(const AgentConfig& config);
  bool loaded() const { return m_loaded; }
  // Starts the drain thread and the connection. Idempotent; safe from any thread.
  bool start();
  // Stops recording, drains, says goodbye. Bounded by the exit timeout. Idempotent.
  void stop();
  bool flush(int timeoutMs);

  // Both read the transport under the lifecycle lock, once: a detach on the agent's thread
  // retires it (never destroyed) while the job's threads ask.
  uint64_t sessionId() const;
  Interner& interner() { return m_interner; }
  Recorder& recorder() { return Recorder::instance(); }
  Transport* transport() const;
  int ownerPid() const { return m_ownerPid; }
  const AgentConfig& config() const { return m_config; }

  // pthread_atfork child handler: the child records nothing and never touches the channel.
  void onForkChild();
  // The fork and exit handlers (fork: the child records nothing; exit: stop()). Once.
  void installProcessHandlers();
  // TIDEMARK_STACKS: the recorder asks agent/python for the stack of large allocations.
  void followPythonStacks(uint64_t minBytes);

  // `tidemark attach`: loads the agent if this is the first attach (real allocators from the
  // process's own bindings), forgets the blocks of an earlier attach, records again and opens a
  // new session. False if the agent could not be loaded.
  bool attach(const AgentConfig& config);
  // `tidemark detach`: stops recording and closes the session; the agent stays loaded and
  // dormant until the next attach (and does nothing at exit).
  void detach();
  bool attached() const { return m_attached; }
  // Called (with a time bound) at the start of stop(), while the stream is still open: the GPU
  // capture flushes CUPTI's buffers there.
  void setBeforeStop(void (*fn)(int timeoutMs)) { m_beforeStop = fn; }

 private:
  AgentConfig m_config;
  bool m_loaded = false;
  bool m_stopped = false;
  bool m_inChild = false;
  int m_ownerPid = 0;
  Interner m_interner;
  bool m_attached = false;  // loaded by `tidemark attach` rather than LD_PRELOAD
  // The sequence number of the next session's first event (sequence numbers are process-wide:
  // a re-attach's session starts after the events of the ones before).
  uint64_t m_sessionFirstSeq = 1;
  bool m_dormant = false;  // detached: nothing recorded, nothing sent, not even at exit
  void (*m_beforeStop)(int timeoutMs) = nullptr;
  std::unique_ptr<Transport> m_transport;
  // Transports of earlier attaches, shut down but kept: a thread may still hold a pointer.
  std::vector<std::unique_ptr<Transport>> m_retired;
};

}  // namespace tidemark::agent
