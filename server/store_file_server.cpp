#include "server/store_file_server.h"

#include <sys/stat.h>
#include <unistd.h>

#include "server/rpc/access.h"
#include "server/rpc/advisor_service.h"
#include "server/rpc/live_agents.h"
#include "server/rpc/query_service.h"
#include "server/server.h"
#include "server/store/database.h"

namespace tidemark::server {

absl::StatusOr<std::unique_ptr<StoreFileServer>> StoreFileServer::open(const std::string& path) {
  if (isPostgresLocator(path)) {
    return absl::InvalidArgumentError(
        "--db reads a SQLite store file; a PostgreSQL store is read through any daemon storing "
        "into it (--server ADDRESS): its daemons decide who sees which session");
  }
  struct stat file {};
  if (::stat(path.c_str(), &file) != 0 || !S_ISREG(file.st_mode))
    return absl::FailedPreconditionError(path + ": no such store file");
  if (::access(path.c_str(), R_OK) != 0)
    return absl::PermissionDeniedError(path + ": not readable by you (uid " +
                                       std::to_string(::geteuid()) + "): a store is its owner's");
  Database db;
  if (absl::Status s = Database::open(path, /*readOnly=*/true, &db); !s.ok())
    return absl::FailedPreconditionError(std::string(s.message()));
  Statement tables =
      db.prepare("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'session'");
  if (!tables.ok() || !tables.step() || tables.columnInt(0) != 1)
    return absl::FailedPreconditionError(path +
                                         ": not a tidemark store (no session table; tidemarkd "
                                         "writes one, by default ~/.local/share/tidemark/"
                                         "tidemark.db)");
  std::unique_ptr<StoreFileServer> f(new StoreFileServer());
  const MemoryShares shares = MemoryShares::of(ServerOptions{}.memoryBudgetBytes);
  f->m_agents = std::make_unique<LiveAgents>();
  f->m_access = Access::fileReader(path);
  f->m_query =
      std::make_unique<QueryService>(path, nullptr, *f->m_agents, *f->m_access, shares.queryBlocks);
  f->m_advisor = std::make_unique<AdvisorService>(path, nullptr, *f->m_agents, *f->m_access,
                                                  shares.queryBlocks);
  grpc::ServerBuilder builder;
  builder.RegisterService(f->m_query.get());
  builder.RegisterService(f->m_advisor.get());
  f->m_server = builder.BuildAndStart();
  if (!f->m_server) return absl::InternalError("the in-process query server did not start");
  return f;
}

StoreFileServer::~StoreFileServer() {
  if (m_server) m_server->Shutdown();
}

std::shared_ptr<grpc::Channel> StoreFileServer::channel() {
  return m_server->InProcessChannel(grpc::ChannelArguments());
}

}  // namespace tidemark::server
