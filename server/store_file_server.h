#pragma once

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"

namespace tidemark::server {

class Access;
class AdvisorService;
class LiveAgents;
class QueryService;

// A store file read without a daemon (tidemark --db FILE, tidemark-gui --db FILE), as memray and
// heaptrack users open a capture file: tidemarkd's Query and Advisor services over the file, in
// this process, reached through an in-process channel, so every reading command answers as it
// would from a daemon. Only read: nothing is written to the file (a daemon may be running on it),
// and what needs a running daemon (recording, steering a job, deleting, tokens) is refused.
class StoreFileServer {
 public:
  // FAILED_PRECONDITION when the file is not there or is no tidemark store; PERMISSION_DENIED
  // when this user may not read it.
  static absl::StatusOr<std::unique_ptr<StoreFileServer>> open(const std::string& path);
  ~StoreFileServer();

  std::shared_ptr<grpc::Channel> channel();

 private:
  StoreFileServer() = default;

  std::unique_ptr<LiveAgents> m_agents;  // none: a file has no live sessions
  std::unique_ptr<Access> m_access;
  std::unique_ptr<QueryService> m_query;
  std::unique_ptr<AdvisorService> m_advisor;
  std::unique_ptr<grpc::Server> m_server;
};

}  // namespace tidemark::server
