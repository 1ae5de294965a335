#include "server/server.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include "server/unix_socket_path.h"
#include "src/base/daemon_address.h"
#include "src/base/host_name.h"
#include "src/base/private_dir.h"

namespace tidemark::server {

std::string defaultDbPath() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/tidemark/tidemark.db";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.local/share/tidemark/tidemark.db";
}

std::string defaultUnixSocket() { return base::defaultUnixSocket(); }

absl::Status makePrivateDirectory(const std::string& dir) {
  const std::string why = base::makePrivateDirectory(dir);
  return why.empty() ? absl::OkStatus() : absl::FailedPreconditionError(why);
}

namespace {
absl::StatusOr<std::string> readFile(const std::string& path, const char* option) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(std::string(option) + " " + path + ": cannot be read");
  }
  return text.str();
}
}  // namespace

MemoryShares MemoryShares::of(int64_t budgetBytes) {
  const int64_t b = std::max<int64_t>(budgetBytes, kMinMemoryBudgetBytes);
  MemoryShares s;
  s.storeCacheBytes = b / 8;                     // 128 MiB of the default 1 GiB
  s.analysisBytes = static_cast<size_t>(b / 4);  // 256 MiB
  // 64 MiB a session, twice at most, and half as much again for its live analysis's window
  s.sessionRowBytes = static_cast<size_t>(b / 16);
  s.queryBlocks = b / 2 / RecordingLoader::kBytesPerBlock;  // 2.7M blocks
  return s;
}

Server::~Server() { shutdown(); }

absl::Status Server::start() {
  // Before anything touches the store or the socket: a second daemon changes nothing. (A
  // PostgreSQL store is shared by several daemons: each looks after the sessions it ingests.)
  if (!isPostgresLocator(m_options.dbPath)) {
    auto lock = StoreLock::acquire(m_options.dbPath);
    if (!lock.ok()) return lock.status();
    m_storeLock = std::make_unique<StoreLock>(std::move(*lock));
  }
  if (m_options.daemonName.empty()) m_options.daemonName = base::hostName();
  if (!m_options.unixSocket.empty()) {
    const std::string dir = std::filesystem::path(m_options.unixSocket).parent_path().string();
    if (auto s = makePrivateDirectory(dir.empty() ? "." : dir); !s.ok()) {
      return absl::FailedPreconditionError("--unix " + m_options.unixSocket + ": " +
                                           std::string(s.message()));
    }
    if (auto s = claimUnixSocketPath(m_options.unixSocket); !s.ok()) return s;
  }
  if (m_options.listen.empty() && m_options.unixSocket.empty()) {
    return absl::InvalidArgumentError("nothing to listen on: give --listen or --unix");
  }
  const bool tls = !m_options.tlsCert.empty();
  if (!m_options.listen.empty() && !tls) {
    if (auto s = m_listeners.listenTcp(m_options.listen); !s.ok()) return s;
    m_port = m_listeners.tcpPort();
  }
  grpc::SslServerCredentialsOptions ssl;
  if (tls) {
    if (m_options.listen.empty()) {
      return absl::InvalidArgumentError("--tls-cert is for the TCP address: give --listen");
    }
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    auto cert = readFile(m_options.tlsCert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    auto key = readFile(m_options.tlsKey, "--tls-key");
    if (!key.ok()) return key.status();
    pair.cert_chain = *cert;
    pair.private_key = *key;
    ssl.pem_key_cert_pairs.push_back(pair);
    if (!m_options.tlsClientCa.empty()) {
      auto ca = readFile(m_options.tlsClientCa, "--tls-client-ca");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
    }
  }
  if (!m_options.unixSocket.empty()) {
    if (auto s = m_listeners.listenUnix(m_options.unixSocket); !s.ok()) return s;
  }
  const MemoryShares shares = MemoryShares::of(m_options.memoryBudgetBytes);
  auto store = Store::open(m_options.dbPath, shares.storeCacheBytes, m_options.daemonName);
  if (!store.ok()) return store.status();
  m_writer = std::make_unique<StoreWriter>(std::move(*store));
  m_tokens = std::make_unique<TokenBook>(*m_writer, m_options.dbPath);
  if (auto s = m_tokens->load(); !s.ok()) return s;
  m_access = std::make_unique<Access>(m_peers, *m_tokens, m_options.dbPath, ::geteuid(),
                                      m_options.allowGroup, m_options.requireToken);
  m_admin = std::make_unique<AdminService>(*m_tokens, *m_access);
  m_retention = std::make_unique<RetentionKeeper>(*m_writer, m_options.retention);
  m_analysis = std::make_unique<AnalysisRunner>(
      *m_writer, shares.analysisBytes, [keeper = m_retention.get()](int64_t) { keeper->poke(); });
  m_analysis->yieldTo(m_options.yieldFactor, &m_recordedJobs);
  m_analysis->enqueuePending();
  m_ingest = std::make_unique<IngestService>(
      *m_writer, m_agents, *m_access,
      [runner = m_analysis.get()](int64_t id) { runner->enqueue(id); }, m_options.resumeGrace,
      shares.sessionRowBytes, m_options.yieldFactor);
  m_ingest->setRecordedJobs(&m_recordedJobs);
  // Sessions left live by the previous run wait for their agents to resume them (or for the
  // files their agents handed over, taken up once the server runs).
  if (auto s = m_ingest->detachLiveSessions(); !s.ok()) return s;
  m_handoffs = std::make_unique<HandoffTaker>(*m_writer, *m_access);
  m_ingest->setHandoffTaker(m_handoffs.get());
  m_control = std::make_unique<ControlService>(*m_writer, m_agents, *m_access);
  m_courier =
      std::make_unique<PlanCourier>(*m_writer, m_agents, isPostgresLocator(m_options.dbPath));
  m_query = std::make_unique<QueryService>(m_options.dbPath, m_writer.get(), m_agents, *m_access,
                                           shares.queryBlocks);
  m_advisor = std::make_unique<AdvisorService>(m_options.dbPath, m_writer.get(), m_agents,
                                               *m_access, shares.queryBlocks);

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // Listeners accepts the plain connections, learns who is at the other end, and hands them over;
  // the TLS port is gRPC's own (PeerRegistry tells its loopback callers' uid by their address).
  grpc::ServerBuilder builder;
  if (tls) {
    // gRPC sets SO_REUSEPORT by default: a second daemon on the port would share the agents.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    builder.AddListeningPort(m_options.listen, grpc::SslServerCredentials(ssl), &m_port);
  }
  builder.RegisterService(m_ingest.get());
  builder.RegisterService(m_query.get());
  builder.RegisterService(m_advisor.get());
  builder.RegisterService(m_control.get());
  builder.RegisterService(m_admin.get());
  m_server = builder.BuildAndStart();
  if (!m_server || (tls && m_port == 0)) {
    m_server.reset();
    return absl::UnavailableError(tls ? "cannot listen on " + m_options.listen +
                                            " with TLS (in use, not a local address, or a "
                                            "certificate and key that do not go together?)"
                                      : std::string("the gRPC server did not start"));
  }
  if (tls) m_peers.setTlsPort(m_port);
  m_listeners.start(m_server.get(), &m_peers);
  m_handoffs->start(*m_server, m_options.unixSocket, m_port);
  return absl::OkStatus();
}

std::string Server::address() const {
  if (m_options.listen.empty()) return "unix:" + m_options.unixSocket;
  const std::string host = m_options.listen.substr(0, m_options.listen.rfind(':'));
  return host + ":" + std::to_string(m_port);
}

void Server::shutdown() {
  m_listeners.stop();
  // Handed-over files stop being sent (what was sent is committed; the rest at the next start).
  if (m_handoffs) m_handoffs->stop();
  if (m_server) {
    // Streams still open get two seconds to end, then are cancelled; each handler commits
    // what it received before returning.
    m_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    m_server->Wait();
    m_server.reset();
  }
  if (m_courier) m_courier->stop();
  if (m_ingest) m_ingest->stop();  // no session is closed from here on
  if (m_analysis) {
    m_analysis->stop();  // an analysis cut short is redone at the next start
    m_analysis.reset();
  }
  if (m_retention) {
    m_retention->stop();
    m_retention.reset();
  }
  if (m_writer) {
    m_writer->stop();
    m_writer.reset();
  }
}

void Server::wait() {
  if (m_server) m_server->Wait();
}

}  // namespace tidemark::server
