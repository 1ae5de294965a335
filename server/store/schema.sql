-- The tidemark store: the one schema definition. Every row carries session_id; ts/dur columns
-- are int64 nanoseconds on CLOCK_MONOTONIC of the recording host; *_seq columns are the agent's
-- process-wide sequence numbers (the order of events). NULL end columns: still open at the end.

-- Key/value facts about the store itself; schema_version drives forward-only migrations.
CREATE TABLE IF NOT EXISTS meta (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
);

-- One recorded process.
CREATE TABLE IF NOT EXISTS session (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL DEFAULT '',        -- TIDEMARK_SESSION_NAME, or ''
  pid INTEGER NOT NULL,
  hostname TEXT NOT NULL,
  command_line TEXT NOT NULL,
  protocol_version INTEGER NOT NULL,
  agent_version TEXT NOT NULL,
  start_ts_ns INTEGER NOT NULL,         -- agent start, monotonic clock
  start_wall_ns INTEGER NOT NULL,       -- agent start, realtime clock
  end_ts_ns INTEGER,                    -- last event or goodbye
  state INTEGER NOT NULL,               -- tidemark.v1.SessionState: 1 live, 2 ended, 3 aborted
  events_received INTEGER NOT NULL DEFAULT 0,  -- counted by the server
  events_stored INTEGER NOT NULL DEFAULT 0,    -- events that became part of a row
  events_sent INTEGER,                  -- from the agent's goodbye
  events_dropped INTEGER,               -- agent-side drops, from its goodbye
  live_blocks_at_end INTEGER,           -- blocks never freed when the session ended
  block_count INTEGER NOT NULL DEFAULT 0,  -- allocation rows of the session
  first_block_id INTEGER,               -- allocation.id range holding the session's blocks
  last_block_id INTEGER,
  analyzed INTEGER NOT NULL DEFAULT 0,  -- 1 once the analysis tables below hold its results
  owner_uid INTEGER,                    -- the agent's uid (NULL: stored before version 2, the
                                        -- store owner's)
  raw_pruned_wall_ns INTEGER,           -- when retention dropped its raw events (NULL: kept);
                                        -- its summaries (steps, peaks, timeline) remain
  end_wall_ns INTEGER,                  -- when it ended, on the daemon's realtime clock
  -- The training job it is a rank of (NULL: none) and its RANK, LOCAL_RANK and WORLD_SIZE there
  -- (NULL: not known).
  job_id INTEGER,
  rank INTEGER,
  local_rank INTEGER,
  world_size INTEGER,
  -- The daemon that ingests it (tidemarkd --name; NULL: stored before schema 6). Daemons sharing
  -- a PostgreSQL store each resume, close, take handed-off files of and analyse their own.
  daemon TEXT
);

-- Training jobs: the sessions of one owner whose agents found the same key (docs/jobs.md).
CREATE TABLE IF NOT EXISTS job (
  id INTEGER PRIMARY KEY,
  key TEXT NOT NULL,                    -- TIDEMARK_JOB, TORCHELASTIC_RUN_ID or MASTER_ADDR:PORT
  owner_uid INTEGER,                    -- the owner of its sessions
  world_size INTEGER NOT NULL DEFAULT 0,
  start_wall_ns INTEGER NOT NULL        -- the start of its first rank, realtime clock
);
CREATE INDEX IF NOT EXISTS job_by_key ON job(key, owner_uid);

-- Interned names (module paths, tensor names), per session.
CREATE TABLE IF NOT EXISTS string (
  session_id INTEGER NOT NULL,
  iid INTEGER NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (session_id, iid)
) WITHOUT ROWID;

-- One row per allocated block with its lifetime (an alloc and its free are one row). No
-- secondary index: rows are appended in rowid order, and a session's rows lie between its
-- session.first_block_id and last_block_id (interleaved with other sessions' only while several
-- record at once), so inserts stay appends to one B-tree.
CREATE TABLE IF NOT EXISTS allocation (
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL,
  address INTEGER NOT NULL,
  size_bytes INTEGER NOT NULL,
  memory_kind INTEGER NOT NULL,         -- tidemark.v1.MemoryKind: 1 host, 2 device, 3 tensor
  device INTEGER NOT NULL,              -- -1 for host memory
  stream INTEGER NOT NULL,
  thread_id INTEGER NOT NULL,           -- thread that allocated
  alloc_seq INTEGER NOT NULL,
  alloc_ts_ns INTEGER NOT NULL,
  free_seq INTEGER,                     -- NULL: live when the session ended
  free_ts_ns INTEGER
);

-- Framework tags: "the block at address, at seq, is a <category> named name_id".
CREATE TABLE IF NOT EXISTS tag (
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  ts_ns INTEGER NOT NULL,
  address INTEGER NOT NULL,
  size_bytes INTEGER NOT NULL,
  category INTEGER NOT NULL,            -- tidemark.v1.Category
  name_id INTEGER NOT NULL              -- string.iid, 0 when unnamed
);
CREATE INDEX IF NOT EXISTS tag_by_session ON tag (session_id, seq);

-- Allocation stacks: "the block at address, at seq, was allocated from frames_id" (a string:
-- one frame per line, innermost first).
CREATE TABLE IF NOT EXISTS stack (
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  ts_ns INTEGER NOT NULL,
  address INTEGER NOT NULL,
  frames_id INTEGER NOT NULL            -- string.iid
);
CREATE INDEX IF NOT EXISTS stack_by_address ON stack (session_id, address, seq);

-- Counters beside the blocks (e.g. "reserved_bytes" of an imported snapshot or trace).
CREATE TABLE IF NOT EXISTS counter (
  session_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  ts_ns INTEGER NOT NULL,
  name_id INTEGER NOT NULL,             -- string.iid
  value INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS counter_by_session ON counter (session_id, name_id, seq);

-- Scopes, one row per open/close pair: modules (forward hooks, "<module> [backward]") and ops
-- (reported through tidemark_op_begin/end by a framework that knows them).
-- The CUDA calls that launched GPU work (tidemark.v1.Launch: on the launching thread), and the
-- kernels (scope rows of kind 2, by begin_seq) with the correlation id that ties them together.
CREATE TABLE IF NOT EXISTS launch (
  session_id INTEGER NOT NULL,
  correlation_id INTEGER NOT NULL,
  thread_id INTEGER NOT NULL,
  seq INTEGER NOT NULL,
  ts_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS launch_by_session ON launch (session_id, correlation_id);
CREATE TABLE IF NOT EXISTS kernel_launch (
  session_id INTEGER NOT NULL,
  kernel_begin_seq INTEGER NOT NULL,
  correlation_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS kernel_launch_by_session ON kernel_launch (session_id);

CREATE TABLE IF NOT EXISTS scope (
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL,
  thread_id INTEGER NOT NULL,
  kind INTEGER NOT NULL DEFAULT 0,      -- tidemark.v1.ScopeKind: 0 module, 1 op
  name_id INTEGER NOT NULL,
  depth INTEGER NOT NULL,               -- 0 for the outermost scope of the thread
  begin_seq INTEGER NOT NULL,
  begin_ts_ns INTEGER NOT NULL,
  end_seq INTEGER,
  end_ts_ns INTEGER
);
CREATE INDEX IF NOT EXISTS scope_by_session ON scope (session_id, begin_seq);

-- Training phases: 1 forward, 2 backward, 3 recompute, 4 optimizer (tidemark.v1.Phase).
CREATE TABLE IF NOT EXISTS phase (
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL,
  thread_id INTEGER NOT NULL,
  phase INTEGER NOT NULL,
  begin_seq INTEGER NOT NULL,
  begin_ts_ns INTEGER NOT NULL,
  end_seq INTEGER,
  end_ts_ns INTEGER
);
CREATE INDEX IF NOT EXISTS phase_by_session ON phase (session_id, begin_seq);

-- Training steps: marked by the adapter, or (inferred = 1) found by the analysis pass from the
-- recording's periodicity when nothing marked them.
CREATE TABLE IF NOT EXISTS step (
  session_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  begin_seq INTEGER NOT NULL,
  begin_ts_ns INTEGER NOT NULL,
  end_seq INTEGER,
  end_ts_ns INTEGER,
  inferred INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (session_id, step)
) WITHOUT ROWID;
-- The step an event lies in, found without reading a session's steps (a peak's step).
CREATE INDEX IF NOT EXISTS step_by_begin ON step (session_id, begin_seq);
-- How many step rows each session has, kept by triggers on `step` (store.cpp: kStepCountTriggers*)
-- so that listing sessions does not count their steps. A session without a row here (stored
-- before it existed) is counted; its first new step writes its row.
CREATE TABLE IF NOT EXISTS step_count (
  session_id INTEGER NOT NULL,
  steps INTEGER NOT NULL,
  PRIMARY KEY (session_id)
) WITHOUT ROWID;

-- Steps a capture schedule summarized (`tidemark run --steps 3-4`): the figures the agent
-- measured of each (tidemark.v1.StepFigure), in place of their events. A summary: retention
-- keeps it with the steps.
CREATE TABLE IF NOT EXISTS step_figure (
  session_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  device INTEGER NOT NULL,    -- -1 host, N cuda:N, -2 all memory together
  figure INTEGER NOT NULL,    -- tidemark.v1.SummaryFigure
  category INTEGER NOT NULL,  -- tidemark.v1.Category (bytes at the peak), else 0
  ts_ns INTEGER NOT NULL,
  value INTEGER NOT NULL,
  PRIMARY KEY (session_id, step, device, figure, category)
) WITHOUT ROWID;

-- The ingest state of a live session at its last commit (tidemark.v1.IngestCheckpoint: open
-- blocks, open intervals, the next sequence numbers), written in the same transaction as the
-- rows it accounts for: a restarted daemon continues the session from here when its agent
-- resumes, and a session whose agent never comes back ends with these blocks as live. Removed
-- when the session ends.
CREATE TABLE IF NOT EXISTS ingest_checkpoint (
  session_id INTEGER PRIMARY KEY,
  batch_seq INTEGER NOT NULL,           -- every batch up to this one is committed
  state BLOB NOT NULL,
  open_blocks BLOB NOT NULL             -- the open blocks as of the last full write (packed)
);
-- The changes to a live session's open blocks since the last full write, in id order (blocks
-- closed, then blocks opened, packed): a block is written when it opens and when it closes, and
-- the full list again only once the changes outweigh it.
CREATE TABLE IF NOT EXISTS ingest_block_delta (
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL,
  closed BLOB NOT NULL,
  opened BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS ingest_block_delta_by_session ON ingest_block_delta (session_id);

-- The rest of a live session its agent handed over at exit as a file (Ingest's Handoff): the
-- daemon ingests it and then removes the row (and the file); one left here after a crash is
-- taken up again at the next start. The file is checked again then: the same file (device and
-- inode), still owned by the uid that handed it over.
CREATE TABLE IF NOT EXISTS handoff (
  session_id INTEGER PRIMARY KEY,
  path TEXT NOT NULL,
  owner_uid INTEGER NOT NULL,
  device INTEGER NOT NULL,
  inode INTEGER NOT NULL
);

-- Counters of data problems and losses (perfetto-style stats): never an abort, always a count.
CREATE TABLE IF NOT EXISTS stat (
  session_id INTEGER NOT NULL,
  name TEXT NOT NULL,
  severity TEXT NOT NULL,               -- info | error | data_loss
  value INTEGER NOT NULL,
  description TEXT NOT NULL,
  PRIMARY KEY (session_id, name)
) WITHOUT ROWID;

-- ---------------------------------------------------------------------------------------------
-- Analysis results, written by the analysis pass once a session has ended (src/core/analysis.h),
-- so that queries read a few rows instead of replaying millions of events.

-- The category of every block and the rule that decided it.
CREATE TABLE IF NOT EXISTS block_category (
  session_id INTEGER NOT NULL,
  chunk INTEGER NOT NULL,               -- holds the session's blocks chunk*65536 ..., in id order
  codes BLOB NOT NULL,                  -- a byte a block: category | rule << 4 (categorize.h)
  PRIMARY KEY (session_id, chunk)
) WITHOUT ROWID;

-- The timeline's levels of detail: samples of 64 events at level 0, each level 4 times coarser.
CREATE TABLE IF NOT EXISTS timeline_chunk (
  session_id INTEGER NOT NULL,
  level INTEGER NOT NULL,
  chunk INTEGER NOT NULL,               -- 1024 samples a chunk, in time order
  first_ts_ns INTEGER NOT NULL,         -- first event of the chunk's first sample
  last_ts_ns INTEGER NOT NULL,          -- last event of the chunk's last sample
  sample_count INTEGER NOT NULL,
  samples BLOB NOT NULL,                -- sample_count records of 40 little-endian int64:
                                        -- first_ts, last_ts, first_seq, last_seq, then min, max
                                        -- and last of the 12 series (total, then each category)
  PRIMARY KEY (session_id, level, chunk)
) WITHOUT ROWID;
-- A level's chunks are in time order: these find the chunks of a range in O(log n), so that a
-- timeline query reads a few rows whatever the session's length. Covering (every column the
-- choice of a level reads): a lookup never descends the table itself, whose keys carry the
-- samples (SQLite reads an overflowing key whole to compare it: a third of a MiB each).
DROP INDEX IF EXISTS timeline_chunk_by_last_ts;
DROP INDEX IF EXISTS timeline_chunk_by_first_ts;
CREATE INDEX IF NOT EXISTS timeline_chunk_by_last ON timeline_chunk (session_id, level,
                                                                     last_ts_ns, first_ts_ns,
                                                                     sample_count);
CREATE INDEX IF NOT EXISTS timeline_chunk_by_first ON timeline_chunk (session_id, level,
                                                                      first_ts_ns, last_ts_ns,
                                                                      sample_count);

-- Peaks: step -1 is the whole session, else the peak inside that step.
CREATE TABLE IF NOT EXISTS peak (
  session_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  seq INTEGER NOT NULL,                 -- the state just after this event
  ts_ns INTEGER NOT NULL,
  tracked_bytes INTEGER NOT NULL,
  phase TEXT NOT NULL,                  -- phase running at the peak, '' if none
  scope TEXT NOT NULL,                  -- innermost module scope open at the peak, '' if none
  PRIMARY KEY (session_id, step)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS peak_category (
  session_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  category INTEGER NOT NULL,            -- tidemark.v1.Category
  bytes INTEGER NOT NULL,
  blocks INTEGER NOT NULL,
  PRIMARY KEY (session_id, step, category)
) WITHOUT ROWID;

-- The largest modules and tensors live at the session's peak.
CREATE TABLE IF NOT EXISTS peak_item (
  session_id INTEGER NOT NULL,
  step INTEGER NOT NULL,
  kind TEXT NOT NULL,                   -- 'module' | 'op' | 'tensor'
  rank INTEGER NOT NULL,                -- 0 = largest
  name TEXT NOT NULL,
  category INTEGER NOT NULL,
  rule INTEGER NOT NULL,                -- what decided a tensor's category (categorize.h)
  bytes INTEGER NOT NULL,
  blocks INTEGER NOT NULL,
  address INTEGER,                      -- a tensor's block (schema version 4)
  PRIMARY KEY (session_id, step, kind, rank)
) WITHOUT ROWID;

-- ---------------------------------------------------------------------------------------------
-- Recompute plans sent to a live job (`tidemark apply`) and what became of them; plan-check
-- compares the prediction with the steps that ran under the plan.
CREATE TABLE IF NOT EXISTS applied_plan (
  id INTEGER PRIMARY KEY,
  session_id INTEGER NOT NULL,
  plan_json TEXT NOT NULL,
  strategy TEXT NOT NULL,
  budget_bytes INTEGER NOT NULL,
  predicted_peak_bytes INTEGER NOT NULL,
  predicted_extra_ns INTEGER NOT NULL,
  predicted_step_ns INTEGER NOT NULL,
  sent_wall_ns INTEGER NOT NULL,
  state INTEGER NOT NULL DEFAULT 0,     -- 0 sent, 1 applied, 2 refused by the job
  message TEXT NOT NULL DEFAULT '',
  from_step INTEGER NOT NULL DEFAULT 0  -- the first step that ran with the plan
);
CREATE INDEX IF NOT EXISTS applied_plan_by_session ON applied_plan (session_id, id);

-- Plans recorded by one daemon for a live session that another daemon ingests (a store shared by
-- several daemons): the session's own daemon sends each to its agent and deletes the row.
CREATE TABLE IF NOT EXISTS plan_outbox (
  plan_id INTEGER NOT NULL PRIMARY KEY,
  session_id INTEGER NOT NULL
);

-- Tokens for callers the daemon cannot identify by uid (tidemark token create): only a
-- SHA-256 hash of each is kept.
CREATE TABLE IF NOT EXISTS token (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  role INTEGER NOT NULL,                -- tidemark.v1.TokenRole
  uid INTEGER NOT NULL,                 -- whose sessions it acts on
  hash BLOB NOT NULL UNIQUE,
  created_wall_ns INTEGER NOT NULL,
  revoked INTEGER NOT NULL DEFAULT 0
);
