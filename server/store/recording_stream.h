#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "server/store/database.h"
#include "src/core/streaming_analysis.h"

namespace tidemark::server {

// A stored session read as a stream for the streaming analysis: each cursor is one SQL query
// (on its own connection with PostgreSQL) (no memory map, a small page cache), stepping row by row,
// so reading costs the same memory for a session of a thousand events as for one of a billion. Only
// the session's interned names are held (bounded by ingest, 64 MiB at most). A session's steps in
// begin order; markedOnly: the adapter's marks, not earlier inferences.
absl::StatusOr<std::vector<core::StepInterval>> readStepRows(Database& db, int64_t sessionId,
                                                             bool markedOnly);
// A row of `step` read as (step, begin_seq, begin_ts_ns, end_seq, end_ts_ns).
core::StepInterval stepRow(const Statement& st);

class StoredRecordingStream : public core::RecordingStream {
 public:
  static absl::StatusOr<std::unique_ptr<StoredRecordingStream>> open(const std::string& path,
                                                                     int64_t sessionId);

  std::unique_ptr<core::Cursor<core::Block>> blocks() override;
  std::unique_ptr<core::Cursor<core::TagRef>> tags() override;
  std::unique_ptr<core::Cursor<core::PhaseInterval>> phases() override;
  std::unique_ptr<core::Cursor<core::ScopeRef>> scopes(bool ops) override;
  std::vector<core::StepInterval> steps() override;  // the marked ones (not earlier inferences)
  std::string name(uint32_t id) override;
  const std::unordered_map<uint32_t, std::string>& names() const { return m_names; }
  std::string error() const override { return m_error; }

  // A cursor's statement ended in an error: the analysis is incomplete.
  void noteError(const std::string& what) {
    if (m_error.empty()) m_error = what;
  }
  // A cursor's statement: on the stream's connection (SQLite), or on one of its own opened into
  // `own` (PostgreSQL). !ok() after noteError when it cannot be had.
  Statement prepareCursor(std::string_view sql, Database* own);

 private:
  StoredRecordingStream(std::string path, int64_t id) : m_path(std::move(path)), m_id(id) {}
  std::string m_path;
  Database m_db;
  int64_t m_id;
  std::unordered_map<uint32_t, std::string> m_names;
  std::string m_error;
};

}  // namespace tidemark::server
