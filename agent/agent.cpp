#include "agent/agent.h"
#include "agent/python/python_stacks.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <new>

#include "agent/hooks/allocator_hooks.h"
#include "agent/job_member.h"
#include "src/base/clock.h"
#include "src/base/daemon_address.h"
#include "src/base/host_name.h"
#include "src/base/private_dir.h"

namespace tidemark::agent {

namespace {
std::mutex g_lifecycleMutex;

const char* envOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : fallback;
}

uint64_t envNumber(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return (end != nullptr && *end == '\0') ? n : fallback;
}

std::string readCommandLine() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : raw) {
    if (c == '\0') c = ' ';
  }
  while (!raw.empty() && raw.back() == ' ') raw.pop_back();
  return raw;
}

void atForkPrepare() { t_recursionGuard = true; }
void atForkParent() { t_recursionGuard = false; }
void atForkChild() {
  t_recursionGuard = false;
  Agent::instance().onForkChild();
}

void atExit() {
  // A forked child that calls exit() must not flush the parent's stream.
  Agent& agent = Agent::instance();
  if (getpid() != agent.ownerPid()) return;
  try {
    agent.stop();
  } catch (...) {
  }
}

// Storage for the singleton: never destroyed, so that hooks after exit() find it intact.
alignas(Agent) unsigned char g_agentStorage[sizeof(Agent)];
Agent* g_agent = nullptr;
}  // namespace

AgentConfig AgentConfig::fromEnvironment() {
  AgentConfig c;
  c.server = envOr("TIDEMARK_SERVER", base::defaultDaemonAddress().c_str());
  c.token = base::readToken(envOr("TIDEMARK_TOKEN", ""), envOr("TIDEMARK_TOKEN_FILE", ""));
  c.tlsCa = envOr("TIDEMARK_TLS_CA", "");
  c.tlsCert = envOr("TIDEMARK_TLS_CERT", "");
  c.tlsKey = envOr("TIDEMARK_TLS_KEY", "");
  c.sessionName = envOr("TIDEMARK_SESSION_NAME", "");
  c.spoolDir = envOr("TIDEMARK_SPOOL_DIR", base::defaultSpoolDirectory().c_str());
  // Set and empty: no handoff in memory.
  const char* handoffDir = std::getenv("TIDEMARK_HANDOFF_DIR");
  c.handoffDir = handoffDir != nullptr ? handoffDir : base::defaultHandoffDirectory();
  c.spoolCapBytes = envNumber("TIDEMARK_SPOOL_MAX_BYTES", c.spoolCapBytes);
  c.ringRecords = static_cast<uint32_t>(envNumber("TIDEMARK_RING_RECORDS", c.ringRecords));
  c.tableBuckets = envNumber("TIDEMARK_TABLE_BUCKETS", c.tableBuckets);
  c.flushIntervalMs = static_cast<int>(envNumber("TIDEMARK_FLUSH_MS", c.flushIntervalMs));
  c.exitTimeoutMs = static_cast<int>(envNumber("TIDEMARK_EXIT_TIMEOUT_MS", c.exitTimeoutMs));
  c.handoffMinEvents = envNumber("TIDEMARK_HANDOFF_MIN_EVENTS", c.handoffMinEvents);
  c.ackTimeoutMs = static_cast<int>(envNumber("TIDEMARK_ACK_TIMEOUT_MS", c.ackTimeoutMs));
  c.windowBytes = envNumber("TIDEMARK_WINDOW_MAX_BYTES", c.windowBytes);
  c.quiet = envNumber("TIDEMARK_QUIET", 0) != 0;
  c.bufferMemoryBytes = envNumber("TIDEMARK_BUFFER_MAX_BYTES", c.bufferMemoryBytes);
  c.ringWaitMs = static_cast<int>(envNumber("TIDEMARK_RING_WAIT_MS", c.ringWaitMs));
  c.lossy = envNumber("TIDEMARK_LOSSY", 0) != 0;
  c.stackMinBytes = envNumber("TIDEMARK_STACKS", 0);
  c.setSchedule(envOr("TIDEMARK_CAPTURE_STEPS", ""), envOr("TIDEMARK_CAPTURE_EVERY", ""),
                envOr("TIDEMARK_CAPTURE_WINDOW", ""));
  return c;
}

void AgentConfig::setSchedule(const std::string& steps, const std::string& every,
                              const std::string& window) {
  std::string error;
  schedule = core::CaptureSchedule::fromSettings(steps, every, window, &error);
  if (!error.empty()) {
    // The job runs on: recorded in full detail rather than not at all.
    std::fprintf(stderr, "tidemark: capture schedule ignored (%s); every step in full detail\n",
                 error.c_str());
  }
}

Agent& Agent::instance() {
  if (g_agent == nullptr) g_agent = new (g_agentStorage) Agent();
  return *g_agent;
}

void Agent::load(const AgentConfig& config) {
  if (m_loaded) return;
  m_config = config;
  m_ownerPid = getpid();
  resolveRealAllocators();
  Recorder& rec = Recorder::instance();
  if (!rec.init(config.ringRecords, config.tableBuckets)) {
    std::fprintf(stderr, "tidemark: could not map the agent's buffers; recording is off\n");
    return;
  }
  rec.setLossy(config.lossy);
  rec.setWaitDeadlineMs(config.ringWaitMs);
  followPythonStacks(config.stackMinBytes);
  enableAllocatorHooks(&rec);
  rec.setRecording(true);
  m_loaded = true;
}

void Agent::followPythonStacks(uint64_t minBytes) {
  python_stacks::configure(minBytes, &m_interner);
  Recorder::instance().setStacks(minBytes,
                                 minBytes != 0 ? &python_stacks::stackOfThisThread : nullptr);
}

void Agent::installProcessHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    // OpenSSL, first set up by the agent's TLS connection (after this handler is registered),
    // would register its own exit handler then, which runs before ours and frees what the
    // transport still uses while our exit handler delivers the rest of the run: the job died of
    // SIGSEGV at exit (torch 2, a daemon failing the TLS handshake). Set up here, without one.
    OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
    pthread_atfork(&atForkPrepare, &atForkParent, &atForkChild);
    std::atexit(&atExit);
  });
}

bool Agent::attach(const AgentConfig& config) {
  {
    std::lock_guard<std::mutex> lock(g_lifecycleMutex);
    if (m_inChild) return false;
    Recorder& rec = Recorder::instance();
    if (!m_loaded) {
      m_config = config;
      m_ownerPid = getpid();
      resolveRealAllocators(/*attached=*/true);
      if (!rec.init(config.ringRecords, config.tableBuckets)) return false;
      rec.setLossy(config.lossy);
      rec.setWaitDeadlineMs(config.ringWaitMs);
      followPythonStacks(config.stackMinBytes);
      enableAllocatorHooks(&rec);
      m_loaded = true;
    } else {
      // The rings and the table keep their sizes; where the records go may change.
      m_config.server = config.server;
      m_config.sessionName = config.sessionName;
      m_config.quiet = config.quiet;
    }
    m_attached = true;
    m_dormant = false;
    m_stopped = false;
    // Blocks of an earlier attach may have been freed unseen while dormant.
    rec.blocks().clear();
    m_sessionFirstSeq = rec.recordedCount() + 1;
    rec.setRecording(true);
  }
  installProcessHandlers();
  return start();
}

void Agent::detach() {
  RecursionGuard guard;
  Recorder::instance().setRecording(false);
  Transport* t = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_lifecycleMutex);
    // The process is exiting (stop() ran): stop() delivers what is left and owns the transport.
    if (m_stopped) return;
    m_dormant = true;
    if (m_transport) {
      t = m_transport.get();
      m_retired.push_back(std::move(m_transport));
    }
  }
  if (t != nullptr) t->shutdown(m_config.exitTimeoutMs);
}

bool Agent::start() {
  std::lock_guard<std::mutex> lock(g_lifecycleMutex);
  if (!m_loaded || m_inChild || m_stopped || m_dormant || getpid() != m_ownerPid) return false;
  if (m_transport) return true;
  RecursionGuard guard;
  TransportConfig tc;
  tc.server = m_config.server;
  tc.token = m_config.token;
  tc.tlsCa = m_config.tlsCa;
  tc.tlsCert = m_config.tlsCert;
  tc.tlsKey = m_config.tlsKey;
  tc.flushIntervalMs = m_config.flushIntervalMs;
  tc.spoolCapBytes = m_config.spoolCapBytes;
  tc.bufferDir = m_config.spoolDir;
  tc.bufferMemoryBytes = m_config.bufferMemoryBytes;
  tc.bufferFileBytes = m_config.spoolCapBytes;
  tc.ringWaitDeadlineMs = m_config.ringWaitMs;
  tc.ackTimeoutMs = m_config.ackTimeoutMs;
  tc.windowBytes = m_config.windowBytes;
  tc.exitTimeoutMs = m_config.exitTimeoutMs;
  tc.firstEventSeq = m_sessionFirstSeq;
  tc.quiet = m_config.quiet;
  tc.schedule = m_config.schedule;
  const std::string stamp =
      std::to_string(m_ownerPid) + "-" + std::to_string(base::wallNs() / 1000000) + ".bin";
  tc.spoolPath = m_config.spoolDir + "/tidemark-spool-" + stamp;
  // The daemon opens it by name: an absolute one. In memory first (base::defaultHandoffDirectory).
  tc.handoffPath = std::filesystem::absolute(m_config.spoolDir + "/tidemark-handoff-" + stamp);
  if (!m_config.handoffDir.empty()) {
    tc.handoffMemoryPath =
        std::filesystem::absolute(m_config.handoffDir + "/tidemark-handoff-" + stamp);
  }
  tc.handoffMinEvents = m_config.handoffMinEvents;
  tc.handshake.set_pid(m_ownerPid);
  tc.handshake.set_hostname(base::hostName());
  tc.handshake.set_command_line(readCommandLine());
  tc.handshake.set_session_name(m_config.sessionName);
  tc.handshake.set_start_ts_ns(base::monotonicNs());
  tc.handshake.set_start_wall_ns(base::wallNs());
  tc.handshake.set_agent_version(TIDEMARK_VERSION);
  tc.handshake.set_server_address(m_config.server);
  if (v1::JobMember job; jobMemberFrom(std::getenv, &job)) *tc.handshake.mutable_job() = job;
  m_transport = std::make_unique<Transport>(Recorder::instance(), m_interner, std::move(tc));
  m_transport->start();
  return true;
}

void Agent::stop() {
  {
    std::lock_guard<std::mutex> lock(g_lifecycleMutex);
    if (!m_loaded || m_inChild || m_stopped || m_dormant || getpid() != m_ownerPid) return;
  }
  RecursionGuard guard;
  if (m_beforeStop != nullptr) m_beforeStop(m_config.exitTimeoutMs / 2);
  Recorder::instance().setRecording(false);
  start();  // builds the transport if nobody did, so what the rings hold is still delivered
  // The transport is taken under the lock: a detach (`tidemark detach` while the job exits) may
  // have retired it meanwhile, and one after this returns at once (m_stopped). A retired transport
  // is never destroyed, so the pointer stays good.
  Transport* transport = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_lifecycleMutex);
    if (m_dormant) return;  // a detach came first: it shut the transport down
    m_stopped = true;
    transport = m_transport.get();
  }
  if (transport != nullptr) {
    transport->shutdown(m_config.exitTimeoutMs);
    if (!m_config.quiet) std::fprintf(stderr, "%s\n", transport->summary().c_str());
  }
}

bool Agent::flush(int timeoutMs) {
  Transport* t = transport();
  return t != nullptr && t->flush(timeoutMs);
}

Transport* Agent::transport() const {
  // A forked child has none (onForkChild), and the lock may be held by a parent's thread the fork
  // left behind.
  if (m_inChild) return nullptr;
  std::lock_guard<std::mutex> lock(g_lifecycleMutex);
  return m_transport.get();
}

uint64_t Agent::sessionId() const {
  Transport* t = transport();
  return t != nullptr ? t->sessionId() : 0;
}

void Agent::onForkChild() {
  m_inChild = true;
  Recorder::instance().forgetAfterFork();
  // The parent's transport object (and its threads, which do not exist here) is leaked on
  // purpose: destroying it would touch the parent's gRPC state.
  m_transport.release();
}

}  // namespace tidemark::agent
