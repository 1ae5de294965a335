#include "server/rpc/recording_loader.h"

#include <optional>
#include <set>
#include <string>
#include <vector>

namespace tidemark::server {

absl::StatusOr<core::Recording> RecordingLoader::load(int64_t session) const {
  // A live session's rows are committed at its checkpoints: what came since would be missing
  // (its last steps, say, while their blocks are here). Its handler hands them over, and its
  // open blocks are taken at that same cut.
  auto cut = m_agents.openBlocksAtPostedCut(session, kRowsWait);
  if (!cut.ok()) return cut.status();
  const std::optional<std::vector<BlockRow>> open =
      *cut ? std::optional<std::vector<BlockRow>>(std::move((*cut)->openBlocks)) : std::nullopt;
  auto info = Store::getSession(m_dbPath, session);
  if (!info.ok()) return info.status();
  const int64_t blocks = info->blocks + (open ? static_cast<int64_t>(open->size()) : 0);
  if (blocks > m_maxBlocks) {
    return absl::ResourceExhaustedError(
        "session " + std::to_string(session) + " holds " + std::to_string(blocks) +
        " blocks, more than this daemon loads whole for one query (" + std::to_string(m_maxBlocks) +
        " within its --memory-budget; a larger budget raises it). Its stored analysis still "
        "answers: peak, steps, timeline, breakdown at the peak" +
        (info->analyzed ? "" : " (once analyzed: see tidemark sessions)"));
  }
  // Rows the ingest handed to the writer before the snapshot are committed before the read.
  if (open && m_writer)
    m_writer->submit([](Store&) { return absl::OkStatus(); }).get().IgnoreError();
  auto rec = Store::loadRecording(m_dbPath, session);
  if (!rec.ok() || !open) return rec;
  // Rows of events after the cut may be in the store by now (a checkpoint since): the recording
  // is read as it stood at the cut, so that a step that ended after it is not taken without
  // its blocks still open. A block freed after the cut is in both: keep the stored row (open
  // again at the cut).
  rec->clipBefore((*cut)->nextEventSeq);
  std::set<std::pair<uint64_t, uint64_t>> stored;
  for (const core::Block& b : rec->blocks) stored.insert({b.address, b.allocSeq});
  int64_t id = -1;
  for (const BlockRow& r : *open) {
    if (stored.count({r.address, r.allocSeq})) continue;
    core::Block b = r.toBlock();  // not freed yet
    b.id = id--;
    rec->blocks.push_back(b);
  }
  rec->sortBySeq();
  return rec;
}

}  // namespace tidemark::server
