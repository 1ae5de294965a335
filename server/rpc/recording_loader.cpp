#include "server/rpc/recording_loader.h"

#include <optional>
#include <set>
#include <vector>

namespace tidemark::server {

absl::StatusOr<core::Recording> RecordingLoader::load(int64_t session) const {
  const std::optional<std::vector<BlockRow>> open = m_agents.openBlocks(session);
  // Rows the ingest handed to the writer before the snapshot are committed before the read.
  if (open) m_writer.submit([](Store&) { return absl::OkStatus(); }).get().IgnoreError();
  auto rec = Store::loadRecording(m_dbPath, session);
  if (!rec.ok() || !open) return rec;
  // A block freed between the snapshot and the read is in both: keep the stored row.
  std::set<std::pair<uint64_t, uint64_t>> stored;
  for (const core::Block& b : rec->blocks) stored.insert({b.address, b.allocSeq});
  int64_t id = -1;
  for (const BlockRow& r : *open) {
    if (stored.count({r.address, r.allocSeq})) continue;
    core::Block b;
    b.id = id--;
    b.address = r.address;
    b.sizeBytes = r.sizeBytes;
    b.kind = core::memoryKindFromWire(r.memoryKind);
    b.device = r.device;
    b.threadId = r.threadId;
    b.allocSeq = r.allocSeq;
    b.allocTsNs = r.allocTsNs;
    rec->blocks.push_back(b);
  }
  rec->sortBySeq();
  return rec;
}

}  // namespace tidemark::server
