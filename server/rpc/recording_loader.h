#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "server/rpc/live_agents.h"
#include "server/store/writer.h"
#include "src/core/recording.h"

namespace tidemark::server {

// Loads a session's recording for a query. For a live session it also commits what the ingest
// handed to the writer and adds the blocks not freed yet (the store gets a block's row only when
// it is freed or the session ends), so live answers include what is allocated now.
class RecordingLoader {
 public:
  RecordingLoader(std::string dbPath, StoreWriter& writer, LiveAgents& agents)
      : m_dbPath(std::move(dbPath)), m_writer(writer), m_agents(agents) {}

  absl::StatusOr<core::Recording> load(int64_t session) const;

 private:
  std::string m_dbPath;
  StoreWriter& m_writer;
  LiveAgents& m_agents;
};

}  // namespace tidemark::server
