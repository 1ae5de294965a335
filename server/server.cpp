#include "server/server.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include "server/unix_socket_path.h"

namespace tidemark::server {

std::string defaultDbPath() {
  const char* xdg = std::getenv("XDG_DATA_HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/tidemark/tidemark.db";
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.local/share/tidemark/tidemark.db";
}

std::string defaultUnixSocket() {
  const char* run = std::getenv("XDG_RUNTIME_DIR");
  if (run != nullptr && *run != '\0') return std::string(run) + "/tidemark/tidemarkd.sock";
  return "/tmp/tidemark-" + std::to_string(getuid()) + "/tidemarkd.sock";
}

Server::~Server() { shutdown(); }

absl::Status Server::start() {
  // Before anything touches the store or the socket: a second daemon changes nothing.
  auto lock = StoreLock::acquire(m_options.dbPath);
  if (!lock.ok()) return lock.status();
  m_storeLock = std::make_unique<StoreLock>(std::move(*lock));
  if (!m_options.unixSocket.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(m_options.unixSocket).parent_path(),
                                        ec);
    if (auto s = claimUnixSocketPath(m_options.unixSocket); !s.ok()) return s;
  }
  auto store = Store::open(m_options.dbPath);
  if (!store.ok()) return store.status();
  m_writer = std::make_unique<StoreWriter>(std::move(*store));
  m_analysis = std::make_unique<AnalysisRunner>(*m_writer);
  m_analysis->enqueuePending();
  m_ingest = std::make_unique<IngestService>(
      *m_writer, m_agents, [runner = m_analysis.get()](int64_t id) { runner->enqueue(id); },
      m_options.resumeGrace);
  // Sessions left live by the previous run wait for their agents to resume them.
  if (auto s = m_ingest->detachLiveSessions(); !s.ok()) return s;
  m_control = std::make_unique<ControlService>(*m_writer, m_agents);
  m_query = std::make_unique<QueryService>(m_options.dbPath, *m_writer, m_agents);
  m_advisor = std::make_unique<AdvisorService>(m_options.dbPath, *m_writer, m_agents);

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  // gRPC sets SO_REUSEPORT by default: a second daemon on the same port would silently share the
  // agents with the first. Refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(m_options.listen, grpc::InsecureServerCredentials(), &m_port);
  if (!m_options.unixSocket.empty()) {
    builder.AddListeningPort("unix:" + m_options.unixSocket, grpc::InsecureServerCredentials());
  }
  builder.RegisterService(m_ingest.get());
  builder.RegisterService(m_query.get());
  builder.RegisterService(m_advisor.get());
  builder.RegisterService(m_control.get());
  m_server = builder.BuildAndStart();
  if (!m_server || m_port == 0) {
    m_server.reset();
    return absl::UnavailableError("cannot listen on " + m_options.listen +
                                  " (in use, or not a local address?)");
  }
  return absl::OkStatus();
}

std::string Server::address() const {
  const std::string host = m_options.listen.substr(0, m_options.listen.rfind(':'));
  return host + ":" + std::to_string(m_port);
}

void Server::shutdown() {
  if (m_server) {
    // Streams still open get two seconds to end, then are cancelled; each handler commits
    // what it received before returning.
    m_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    m_server->Wait();
    m_server.reset();
  }
  if (m_ingest) m_ingest->stop();  // no session is closed from here on
  if (m_analysis) {
    m_analysis->stop();  // an analysis cut short is redone at the next start
    m_analysis.reset();
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
