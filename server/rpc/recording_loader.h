#pragma once

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "server/rpc/live_agents.h"
#include "server/store/writer.h"
#include "src/core/recording.h"

namespace tidemark::server {

// Loads a session's recording for a query. For a live session it also commits what the ingest
// handed to the writer and adds the blocks not freed yet (the store gets a block's row only when
// it is freed or the session ends), so live answers include what is allocated now.
//
// The whole recording is held in memory: a session with more than maxBlocks blocks (the daemon's
// memory budget decides) is refused with RESOURCE_EXHAUSTED, saying what still answers, instead
// of a query taking the daemon's memory.
class RecordingLoader {
 public:
  // About what a loaded block costs a query (the block, its category, its replay edges).
  static constexpr int64_t kBytesPerBlock = 200;
  static constexpr int64_t kDefaultMaxBlocks = (int64_t{512} << 20) / kBytesPerBlock;
  // How long a load of a live session waits for its handler to hand over the rows taken since
  // its last checkpoint (it does at its next message: the agent writes every ~100 ms).
  static constexpr std::chrono::milliseconds kRowsWait{5000};
  RecordingLoader(std::string dbPath, StoreWriter* writer, LiveAgents& agents,
                  int64_t maxBlocks = kDefaultMaxBlocks)
      : m_dbPath(std::move(dbPath)), m_writer(writer), m_agents(agents), m_maxBlocks(maxBlocks) {}

  absl::StatusOr<core::Recording> load(int64_t session) const;

 private:
  std::string m_dbPath;
  StoreWriter* m_writer;  // nullptr: a store file read without a daemon
  LiveAgents& m_agents;
  int64_t m_maxBlocks;
};

}  // namespace tidemark::server
