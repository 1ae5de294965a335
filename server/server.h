#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "server/analysis/analysis_runner.h"
#include "server/net/listeners.h"
#include "server/net/peer_registry.h"
#include "server/rpc/access.h"
#include "server/rpc/admin_service.h"
#include "server/rpc/advisor_service.h"
#include "server/rpc/control_service.h"
#include "server/rpc/handoff_taker.h"
#include "server/rpc/ingest_service.h"
#include "server/rpc/plan_courier.h"
#include "server/rpc/query_service.h"
#include "server/store/retention.h"
#include "server/store/store_lock.h"
#include "server/store/writer.h"

namespace tidemark::server {

struct ServerOptions {
  std::string listen;      // TCP address (loopback only), "" for none; port 0 picks a free one
  std::string unixSocket;  // "" for none
  // Members of this group see and steer every user's sessions, as root does (--allow-group).
  std::optional<gid_t> allowGroup;
  // Every call must present a token (tidemarkd --require-token), but token management by the
  // daemon's own user or root.
  bool requireToken = false;
  // TLS on the TCP address (PEM files): the daemon's certificate and key, and the CA its clients'
  // certificates must be signed by ("": none asked). With TLS, --listen may be any address.
  std::string tlsCert;
  std::string tlsKey;
  std::string tlsClientCa;
  std::string dbPath;  // the store: a SQLite file, or a PostgreSQL URI (tidemarkd --store)
  // The daemon's name in a store shared with other daemons (tidemarkd --name; "": the host's).
  std::string daemonName;
  // How long a session whose stream broke waits for its agent to resume it (tidemarkd
  // --resume-grace); sooner closed when its process is gone from this host.
  std::chrono::seconds resumeGrace{600};
  // What the daemon's own work may hold in memory (tidemarkd --memory-budget), shared out by
  // MemoryShares below; the resident size stays under it plus a constant (docs/scaling.md).
  int64_t memoryBudgetBytes = int64_t{1} << 30;
  // While the jobs it records want the processors, the daemon's work (each ingest stream for its
  // own job, the analysis pass for all of them) pauses this many times the processor time it took
  // (server/ingest/cpu_yield.h; tidemarkd --nice sets it; 0: never).
  double yieldFactor = 0;
  // tidemarkd --retain / --max-store (server/store/retention.h); none by default.
  RetentionLimits retention;
};

// How the memory budget is shared: the store's page cache, the analysis pass's sorts, and the
// rows each recording session may hold before its stream waits for the store.
inline constexpr int64_t kMinMemoryBudgetBytes = int64_t{64} << 20;
struct MemoryShares {
  int64_t storeCacheBytes;
  size_t analysisBytes;
  size_t sessionRowBytes;
  // The blocks a query may load whole (a live session's, a breakdown at a moment, a plan).
  int64_t queryBlocks;
  static MemoryShares of(int64_t budgetBytes);
};

// tidemarkd's parts wired together: the store's writer, the services, the gRPC server.
class Server {
 public:
  explicit Server(ServerOptions options) : m_options(std::move(options)) {}
  ~Server();

  absl::Status start();
  // Stops accepting, lets running streams finish (bounded), commits everything received.
  void shutdown();
  void wait();

  int port() const { return m_port; }
  AnalysisRunner* analysis() { return m_analysis.get(); }
  RetentionKeeper* retention() { return m_retention.get(); }
  // The sessions whose agents stream now (for tests: what their ingests hold).
  LiveAgents& liveAgents() { return m_agents; }
  // What takes up handed-over files and spools (for tests: how much its looks cost).
  const HandoffTaker* handoffs() const { return m_handoffs.get(); }
  std::string address() const;
  const ServerOptions& options() const { return m_options; }

 private:
  ServerOptions m_options;
  std::unique_ptr<StoreLock> m_storeLock;  // held for the daemon's life (one daemon per store)
  PeerRegistry m_peers;
  Listeners m_listeners;
  std::unique_ptr<TokenBook> m_tokens;
  std::unique_ptr<Access> m_access;
  std::unique_ptr<AdminService> m_admin;
  std::unique_ptr<StoreWriter> m_writer;
  std::unique_ptr<RetentionKeeper> m_retention;
  RecordedJobs m_recordedJobs;  // outlives the services below, which list and read it
  std::unique_ptr<AnalysisRunner> m_analysis;
  std::unique_ptr<IngestService> m_ingest;
  std::unique_ptr<HandoffTaker> m_handoffs;
  std::unique_ptr<QueryService> m_query;
  std::unique_ptr<AdvisorService> m_advisor;
  LiveAgents m_agents;
  std::unique_ptr<ControlService> m_control;
  std::unique_ptr<PlanCourier> m_courier;
  std::unique_ptr<grpc::Server> m_server;
  int m_port = 0;
};

// $XDG_DATA_HOME/tidemark/tidemark.db, or ~/.local/share/tidemark/tidemark.db.
std::string defaultDbPath();
// $XDG_RUNTIME_DIR/tidemark/tidemarkd.sock, or ~/.cache/tidemark/tidemarkd.sock
// (base::defaultUnixSocket).
std::string defaultUnixSocket();
// Makes dir (and its parents) if missing; refuses one that is not a directory of this user's
// that only this user can enter (mode 0700 or stricter), so no one else can reach what is in it.
absl::Status makePrivateDirectory(const std::string& dir);

}  // namespace tidemark::server
