#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/store/database.h"
#include "src/core/analysis.h"
#include "src/core/recording.h"

namespace tidemark::server {

// 2: session.owner_uid; 3: raw_pruned_wall_ns; 4: peak_item.address; 5: jobs; 6: session.daemon
inline constexpr int kSchemaVersion = 6;

struct SessionHeader {
  std::string name;
  int32_t pid = 0;
  std::string hostname;
  std::string commandLine;
  uint32_t protocolVersion = 0;
  std::string agentVersion;
  int64_t startTsNs = 0;
  int64_t startWallNs = 0;
  std::optional<int64_t> ownerUid;  // the agent's uid; none for sessions stored before owners
  // A rank of a training job (docs/jobs.md): the key its agent found ("" for none), its place.
  std::string jobKey;
  int32_t rank = -1;
  int32_t localRank = -1;
  int32_t worldSize = 0;
};

// A training job: the sessions of one owner whose agents found the same key (docs/jobs.md).
struct JobRecord {
  int64_t id = 0;
  std::string key;
  std::optional<int64_t> ownerUid;
  int32_t worldSize = 0;
  int64_t startWallNs = 0;    // its first rank's start
  int64_t ranksRecorded = 0;  // its sessions
  int64_t ranksLive = 0;      // of them, live
};

struct BlockRow {
  uint64_t address = 0;
  uint64_t sizeBytes = 0;
  int memoryKind = 1;
  int32_t device = -1;
  uint64_t stream = 0;
  uint32_t threadId = 0;
  uint64_t allocSeq = 0;
  int64_t allocTsNs = 0;
  uint64_t freeSeq = core::kOpenSeq;  // kOpenSeq: live at the end
  int64_t freeTsNs = 0;
  // As the analysis sees it (its id left 0).
  core::Block toBlock() const {
    core::Block b;
    b.address = address;
    b.sizeBytes = sizeBytes;
    b.kind = core::memoryKindFromWire(memoryKind);
    b.device = device;
    b.threadId = threadId;
    b.allocSeq = allocSeq;
    b.allocTsNs = allocTsNs;
    b.freeSeq = freeSeq;
    b.freeTsNs = freeTsNs;
    return b;
  }
};

struct CounterRow {
  uint64_t seq = 0;
  int64_t tsNs = 0;
  uint32_t nameIid = 0;
  int64_t value = 0;
};

struct LaunchRow {
  uint64_t seq = 0;
  int64_t tsNs = 0;
  uint32_t threadId = 0;
  uint32_t correlationId = 0;
};

struct StackRow {
  uint64_t seq = 0;
  int64_t tsNs = 0;
  uint64_t address = 0;
  uint32_t framesIid = 0;
};

struct TagRow {
  uint64_t seq = 0;
  int64_t tsNs = 0;
  uint64_t address = 0;
  uint64_t sizeBytes = 0;
  int category = 0;
  uint32_t nameIid = 0;
};

struct IntervalRow {  // scopes and phases
  uint32_t threadId = 0;
  uint32_t nameIid = 0;        // scopes
  int phase = 0;               // phases
  int depth = 0;               // scopes
  int kind = 0;                // scopes: 0 module, 1 op, 2 kernel
  uint32_t correlationId = 0;  // kernels: the launch (0 unknown)
  uint64_t beginSeq = 0;
  int64_t beginTsNs = 0;
  uint64_t endSeq = core::kOpenSeq;
  int64_t endTsNs = 0;
};

struct StepRow {
  int64_t step = 0;
  uint64_t beginSeq = 0;
  int64_t beginTsNs = 0;
  uint64_t endSeq = core::kOpenSeq;
  int64_t endTsNs = 0;
};

// Steps first .. last by number (both included).
struct StepNumbers {
  int64_t first = 0;
  int64_t last = 0;
};

// One figure of a step the agent summarized (a capture schedule): v1.StepFigure.
struct StepFigureRow {
  int64_t step = 0;
  int32_t device = -2;  // -1 host, N cuda:N, -2 all memory
  int figure = 0;       // v1.SummaryFigure
  int category = 0;     // v1.Category for SUMMARY_FIGURE_BYTES_AT_PEAK, else 0
  int64_t tsNs = 0;
  int64_t value = 0;
};

struct StatRow {
  std::string name;
  std::string severity;  // info | error | data_loss
  int64_t value = 0;
  std::string description;
};

// What one ingest pass hands to the writer for one session.
struct SessionRows {
  int64_t sessionId = 0;
  std::vector<std::pair<uint32_t, std::string>> strings;
  std::vector<BlockRow> blocks;
  std::vector<TagRow> tags;
  std::vector<StackRow> stacks;
  std::vector<CounterRow> counters;
  std::vector<LaunchRow> launches;
  std::vector<IntervalRow> scopes;
  std::vector<IntervalRow> phases;
  std::vector<StepRow> steps;
  std::vector<StepFigureRow> stepFigures;
  // The live analysis's results as they complete (src/core/live_analysis.h), stored as the
  // analysis pass stores them: the timeline's chunks and the blocks' categories (by chunk).
  std::vector<core::TimelineChunk> timelineChunks;
  std::vector<std::pair<int64_t, std::string>> blockCodes;
  // Steps' peaks (no items), as the pass stores them; the live analysis holds the same ones
  // until this commit is in the store.
  std::vector<core::SharedPeakReport> stepPeaks;
  int64_t eventsReceived = 0;  // added to the session's counters
  int64_t eventsStored = 0;
  bool empty() const {
    return strings.empty() && blocks.empty() && tags.empty() && stacks.empty() &&
           counters.empty() && launches.empty() && scopes.empty() && phases.empty() &&
           steps.empty() && stepFigures.empty() && timelineChunks.empty() && blockCodes.empty() &&
           stepPeaks.empty() && eventsReceived == 0 && eventsStored == 0;
  }
};

struct SessionEnd {
  int64_t sessionId = 0;
  int state = 2;  // tidemark.v1.SessionState
  int64_t endTsNs = 0;
  std::optional<int64_t> eventsSent;
  std::optional<int64_t> eventsDropped;
  int64_t liveBlocksAtEnd = 0;
  std::vector<StatRow> stats;
};

// A file of the rest of a live session that its agent handed to the daemon (schema.sql).
struct HandoffRow {
  int64_t sessionId = 0;
  std::string path;
  int64_t ownerUid = 0;
  int64_t device = 0;
  int64_t inode = 0;
};

struct TokenRow {
  int64_t id = 0;
  std::string name;
  int role = 0;  // tidemark.v1.TokenRole
  int64_t uid = 0;
  std::string hash;  // SHA-256 of the secret, 32 bytes
  int64_t createdWallNs = 0;
  bool revoked = false;
};

struct SessionRecord {
  int64_t id = 0;
  SessionHeader header;
  int64_t endTsNs = 0;
  int state = 0;
  int64_t eventsReceived = 0;
  int64_t eventsStored = 0;
  std::optional<int64_t> eventsSent;
  std::optional<int64_t> eventsDropped;
  int64_t liveBlocksAtEnd = 0;
  int64_t blocks = 0;
  int64_t steps = 0;
  bool analyzed = false;
  std::optional<int64_t> rawPrunedWallNs;  // when retention dropped its raw events
  // When it ended, on the daemon's realtime clock (none: live, or ended before schema 3).
  std::optional<int64_t> endWallNs;
  std::vector<StatRow> stats;
  int64_t jobId = 0;   // 0: not a rank of a job
  std::string daemon;  // the daemon that ingests it ("": stored before schema 6)
  // When it ended: endWallNs, else its start on the agent's realtime clock plus its length.
  int64_t endedWallNs() const {
    return endWallNs ? *endWallNs : header.startWallNs + (endTsNs - header.startTsNs);
  }
};

// The SQLite store. One Store object owns the write connection and must be used from one
// thread only (the writer). Reads open their own connection and may run on any thread.
// A recompute plan sent to a live job, and its fate.
struct AppliedPlanRow {
  int64_t id = 0;
  int64_t sessionId = 0;
  std::string planJson;
  std::string strategy;
  int64_t budgetBytes = 0;
  int64_t predictedPeakBytes = 0;
  int64_t predictedExtraNs = 0;
  int64_t predictedStepNs = 0;
  int64_t sentWallNs = 0;
  int state = 0;  // 0 sent, 1 applied, 2 refused
  std::string message;
  int64_t fromStep = 0;
};

// A plan recorded by another daemon for a session this daemon ingests (plan_outbox).
struct PlanDelivery {
  int64_t planId = 0;
  int64_t sessionId = 0;
  std::string planJson;
  int64_t sentWallNs = 0;
  bool sessionLive = false;
};

// FAILED_PRECONDITION saying that retention dropped the session's raw events at wallNs.
absl::Status rawEventsPruned(int64_t sessionId, int64_t wallNs);

class Store {
 public:
  // Creates the file (and its directory) if needed, sets WAL, applies the schema, checks the
  // schema version. cacheBytes: the write connection's page cache.
  // path: a SQLite file, or a PostgreSQL URI (database.h). daemonName: the daemon writing
  // through it, recorded with each new session (tidemarkd --name).
  static absl::StatusOr<std::unique_ptr<Store>> open(const std::string& path,
                                                     int64_t cacheBytes = int64_t{128} << 20,
                                                     std::string daemonName = "");

  const std::string& path() const { return m_path; }
  const std::string& daemonName() const { return m_daemonName; }

  // Writer side.
  absl::Status begin();
  absl::Status commit();
  absl::Status rollback();
  absl::Status exec(std::string_view sql) { return m_db.exec(sql); }
  // A header with a job key joins that owner's newest job of the key when it started within
  // kJobJoinWindowNs of it and has no session of the same rank yet; else starts a new job.
  absl::StatusOr<int64_t> createSession(const SessionHeader& header);
  // A stat of a session (replaced by a later one of the same name).
  absl::Status addStat(int64_t session, const StatRow& stat);
  static constexpr int64_t kJobJoinWindowNs = 600LL * 1000000000LL;
  // Tokens (only their hashes): a new one's id; revoking one not there is NOT_FOUND.
  absl::StatusOr<int64_t> insertToken(const TokenRow& token);
  absl::Status revokeToken(int64_t id);
  absl::Status writeRows(const SessionRows& rows);
  absl::Status endSession(const SessionEnd& end);
  // A handed-off file to ingest (replacing one of the same session), and its removal.
  absl::Status addHandoff(const HandoffRow& row);
  absl::Status removeHandoff(int64_t sessionId);
  // A plan about to be sent to a session's agent; returns its id.
  absl::StatusOr<int64_t> createAppliedPlan(const AppliedPlanRow& row);
  // A plan the job applied itself (PlanResult with plan id 0): the session's plan with the same
  // document and first step takes row's state and message; without one, row is added.
  absl::Status recordJobsOwnPlan(const AppliedPlanRow& row);
  absl::Status setPlanResult(int64_t sessionId, int64_t planId, int state,
                             const std::string& message, int64_t fromStep);
  // A plan for a session another daemon ingests, left for that daemon to send (shared stores),
  // and its removal once sent or given up.
  absl::Status queuePlanDelivery(int64_t planId, int64_t sessionId);
  absl::Status removePlanDelivery(int64_t planId);
  // The ingest state of a live session at this commit (replacing the previous one); batchSeq:
  // the last batch it accounts for; its open blocks changed by `closed` (removed first, by
  // memory kind, device and address) and `opened` (added, replacing).
  // full: `opened` is every open block (the changes written before are dropped).
  absl::Status saveCheckpoint(int64_t sessionId, uint64_t batchSeq, const std::string& state,
                              bool full, const std::vector<BlockRow>& opened,
                              const std::vector<BlockRow>& closed);
  // The analysis of an ended session, written in parts (src/core/streaming_analysis.h): first
  // clearAnalysis (drops any earlier results, marks it not analyzed), then the blocks'
  // categories and the timeline's chunks as they come, then finishAnalysis (the peaks, the
  // inferred steps; marks it analyzed). Queries read the results only once it is marked.
  absl::Status clearAnalysis(int64_t sessionId);
  absl::Status writeBlockCodes(int64_t sessionId, int64_t chunk, const std::string& codes);
  absl::Status writeTimelineChunk(int64_t sessionId, int level, int64_t chunk,
                                  const std::vector<core::TimelineSample>& samples);
  // Peaks with their categories and items, replacing any stored for the same steps (a live
  // session's steps' peaks come with its rows as its steps end: SessionRows::stepPeaks).
  absl::Status writePeaks(int64_t sessionId, const std::vector<const core::PeakReport*>& peaks);
  absl::Status finishAnalysis(int64_t sessionId, const std::vector<core::PeakReport>& peaks,
                              const core::CategorizeStats& stats,
                              const std::vector<core::StepInterval>& inferredSteps);

  // Retention. A session's raw events go in slices, each its own short transaction, so that
  // ingest never waits long: markRawPruned first (queries then say the raw events are gone, not
  // answer from half of them), then deleteRawSlice until it deletes nothing (blocks, tags,
  // scopes, phases, counters, launches; with the last slice names, categories and the timeline's
  // fine levels). What stays: the session row, steps, stats, stored peaks, coarse timeline levels.
  absl::Status markRawPruned(int64_t sessionId, int64_t wallNs);
  // Up to maxRows rows; returns how many it deleted.
  absl::StatusOr<int64_t> deleteRawSlice(int64_t sessionId, int64_t maxRows);
  // Every row of a session, gone (NOT_FOUND if there is no such session). Run deleteRawSlice to
  // the end first for a large one.
  absl::Status deleteSession(int64_t sessionId);
  // The bytes of the pages in use (the file less its free pages).
  absl::StatusOr<int64_t> bytesInUse();
  // Gives up to maxPages free pages back to the file system (the store's file shrinks; stores
  // made before schema version 3 without incremental auto-vacuum only reuse them).
  absl::Status releaseFreePages(int64_t maxPages);
  absl::StatusOr<int64_t> freePageCount();

  // Reader side (a fresh read-only connection per call).
  // Sessions with an id over afterId, in id order, at most limit of them.
  // The uid a session belongs to (nullopt inside: stored without one); NOT_FOUND if none.
  static absl::StatusOr<std::optional<int64_t>> sessionOwner(const std::string& path, int64_t id);
  static absl::StatusOr<std::vector<TokenRow>> readTokens(const std::string& path);
  // With owner: only that uid's sessions (and, when it is storeOwner, those stored without one).
  static absl::StatusOr<std::vector<SessionRecord>> listSessions(
      const std::string& path, int64_t afterId = 0, int64_t limit = -1,
      std::optional<int64_t> owner = std::nullopt, int64_t storeOwner = -1);
  // Jobs, in id order (with owner: only that uid's, as listSessions); and one job's sessions.
  static absl::StatusOr<std::vector<JobRecord>> listJobs(const std::string& path,
                                                         std::optional<int64_t> owner,
                                                         int64_t storeOwner);
  static absl::StatusOr<std::vector<SessionRecord>> jobSessions(const std::string& path,
                                                                int64_t jobId);
  // In a store shared by several daemons (PostgreSQL), each looks after its own sessions: those
  // it ingested (and those stored before schema 6). A SQLite store has one daemon: all of them.
  // Sessions still live (a daemon stopped or died while their agents streamed).
  static absl::StatusOr<std::vector<SessionRecord>> liveSessions(const std::string& path,
                                                                 const std::string& daemon);
  // Handed-off files not ingested yet.
  static absl::StatusOr<std::vector<HandoffRow>> pendingHandoffs(const std::string& path,
                                                                 const std::string& daemon);
  // A live session's last checkpoint, or nullopt when none was committed yet.
  struct StoredCheckpoint {
    std::string state;  // tidemark.v1.IngestCheckpoint
    std::vector<BlockRow> openBlocks;
  };
  static absl::StatusOr<std::optional<StoredCheckpoint>> loadCheckpoint(const std::string& path,
                                                                        int64_t id);
  // The states only (no open blocks: cheap) of these sessions' checkpoints, by session; a
  // session without one (none committed yet) is not in the map. One connection for all.
  static absl::StatusOr<std::map<int64_t, std::string>> loadCheckpointStates(
      const std::string& path, const std::vector<int64_t>& ids);
  // countSteps: fill `steps` (it reads every step row of the session); else it stays 0.
  static absl::StatusOr<SessionRecord> getSession(const std::string& path, int64_t id,
                                                  bool countSteps = false);
  // withBlocks false: the intervals and tags only (cheap even for huge sessions).
  static absl::StatusOr<core::Recording> loadRecording(const std::string& path, int64_t id,
                                                       bool withBlocks = true);
  // Only the steps of a session (cheap), as a Recording with nothing else in it.
  static absl::StatusOr<core::Recording> loadSteps(const std::string& path, int64_t id);
  // A page of a session's steps by number, in step order: from `from` on (from the first when
  // nullopt), at most `limit`; with `last`, the last `limit` steps instead; steps numbered below
  // `below` only. Reads only the page's rows, whatever the number of steps.
  static absl::StatusOr<std::vector<core::StepInterval>> loadStepPage(
      const std::string& path, int64_t id, std::optional<int64_t> from, int64_t limit, bool last,
      int64_t below = std::numeric_limits<int64_t>::max());
  static absl::StatusOr<int64_t> countSteps(const std::string& path, int64_t id);
  // The step that holds event `seq` (the last begun at or before it that has not ended before
  // it), or nullopt: as core::Recording::stepAt, reading a few rows whatever the session's steps.
  static absl::StatusOr<std::optional<core::StepInterval>> stepAt(const std::string& path,
                                                                  int64_t id, uint64_t seq);
  // The figures of the steps the agent summarized (none when every step was in full detail).
  // steps: those steps' only.
  static absl::StatusOr<std::vector<StepFigureRow>> loadStepFigures(
      const std::string& path, int64_t id, std::optional<StepNumbers> steps = std::nullopt);
  // The allocation stacks recorded at `address` (seq, frames text), in sequence order.
  static absl::StatusOr<std::vector<std::pair<uint64_t, std::string>>> loadStacks(
      const std::string& path, int64_t id, uint64_t address);
  // The last value of the counter `name` at or before seq, or nullopt when it has none.
  static absl::StatusOr<std::optional<int64_t>> counterAt(const std::string& path, int64_t id,
                                                          const std::string& name, uint64_t seq);
  // The same at each of seqs (one read of the store).
  static absl::StatusOr<std::vector<std::optional<int64_t>>> countersAt(
      const std::string& path, int64_t id, const std::string& name,
      const std::vector<uint64_t>& seqs);
  // The plans sent to a session, oldest first.
  static absl::StatusOr<std::vector<AppliedPlanRow>> appliedPlans(const std::string& path,
                                                                  int64_t id);
  // The plans other daemons left for `daemon`'s sessions, oldest first.
  static absl::StatusOr<std::vector<PlanDelivery>> plansToDeliver(const std::string& path,
                                                                  const std::string& daemon);
  // Ended sessions whose analysis is not stored yet.
  static absl::StatusOr<std::vector<int64_t>> sessionsToAnalyze(const std::string& path,
                                                                const std::string& daemon);
  // Whether `record` is `daemon`'s to look after (as above).
  static bool isOwnSession(const std::string& path, const SessionRecord& record,
                           const std::string& daemon);
  static absl::StatusOr<bool> isAnalyzed(const std::string& path, int64_t id);
  // A stored peak: step -1 for the whole session. NOT_FOUND if there is none.
  static absl::StatusOr<core::PeakReport> readPeak(const std::string& path, int64_t id,
                                                   int64_t step);
  // Every stored peak of a session (categories, no items), the whole session's (-1) first; with
  // steps, those steps' peaks only.
  static absl::StatusOr<std::vector<core::PeakReport>> readPeaks(
      const std::string& path, int64_t id, std::optional<StepNumbers> steps = std::nullopt);
  // The stored timeline's buckets over [fromTs, toTs].
  static absl::StatusOr<std::vector<core::TimelineBucket>> readTimeline(const std::string& path,
                                                                        int64_t id, int64_t fromTs,
                                                                        int64_t toTs, int buckets);

 private:
  explicit Store(std::string path) : m_path(std::move(path)) {}
  static absl::StatusOr<std::unique_ptr<Store>> openPostgres(const std::string& uri);
  absl::Status prepareStatements();
  // PostgreSQL: the blocks, tags, scopes (with their kernels' launches) and phases of a batch
  // with COPY; returns the blocks' id range ({0, 0}: none).
  absl::StatusOr<std::pair<int64_t, int64_t>> copyBulkRows(const SessionRows& rows);
  // The job a new session with a job key belongs to (createSession's rule), made if needed.
  absl::StatusOr<int64_t> jobFor(const SessionHeader& header);

  std::string m_path;
  std::string m_daemonName;
  Database m_db;
  Statement m_insertSession, m_insertString, m_insertBlock, m_insertTag, m_insertScope,
      m_insertPhase, m_insertStep, m_insertStepFigure, m_addCounts, m_endSession, m_upsertStat,
      m_reserveBlockIds;
  // PostgreSQL: the block ids this daemon holds, [m_nextBlockId, m_blockIdsEnd).
  static constexpr int64_t kBlockIdRange = 65536;
  int64_t m_nextBlockId = 0;
  int64_t m_blockIdsEnd = 0;
};

}  // namespace tidemark::server
