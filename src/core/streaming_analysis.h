#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/core/analysis.h"
#include "src/core/recording.h"
#include "src/core/timeline.h"

namespace tidemark::core {

// The analysis pass (analysis.h) at a memory cost that does not grow with the recording: the
// blocks are sorted on disk (external_sort.h) and swept in sequence order, holding only what is
// live at each moment (open blocks, open phases and scopes); the results too large to hold
// (every block's category, the timeline's levels of detail) go to a sink as they are found.
// Its results equal analyze()'s (tests/unit/streaming_analysis_test.cpp checks that on random
// recordings), except that step inference sees only the last `maxInferencePoints` events.

// A tag as a stream gives it: its name by id (RecordingStream::name).
struct TagRef {
  uint64_t seq = 0;
  int64_t tsNs = 0;
  uint64_t address = 0;
  uint64_t sizeBytes = 0;
  Category category = Category::kUnknown;
  uint32_t nameId = 0;
};

// A scope (module or op) as a stream gives it.
struct ScopeRef {
  uint64_t beginSeq = 0;
  uint64_t endSeq = kOpenSeq;
  uint32_t threadId = 0;
  uint32_t nameId = 0;
};

template <typename T>
class Cursor {
 public:
  virtual ~Cursor() = default;
  // False at the end, or when the read failed (RecordingStream::error then says why).
  virtual bool next(T& out) = 0;
};

// Where the streaming analysis reads a recording. Each call opens a new cursor at the start.
class RecordingStream {
 public:
  virtual ~RecordingStream() = default;
  virtual std::unique_ptr<Cursor<Block>> blocks() = 0;          // any order, Block::id set
  virtual std::unique_ptr<Cursor<TagRef>> tags() = 0;           // by seq
  virtual std::unique_ptr<Cursor<PhaseInterval>> phases() = 0;  // by beginSeq
  virtual std::unique_ptr<Cursor<ScopeRef>> scopes(
      bool ops) = 0;                              // module or op scopes, by beginSeq
  virtual std::vector<StepInterval> steps() = 0;  // by beginSeq
  virtual std::string name(uint32_t id) = 0;      // "" for none
  virtual std::string error() const = 0;          // "" while every read succeeded
};

// Receives, in order, what is too large to hold.
class AnalysisSink {
 public:
  virtual ~AnalysisSink() = default;
  static constexpr size_t kBlocksPerChunk = 65536;
  static constexpr size_t kSamplesPerChunk = 1024;
  // The categories of the blocks in id order: a byte a block (category | rule << 4), chunk k
  // holding the blocks k * kBlocksPerChunk ... of that order. False stops the analysis.
  virtual bool blockCodes(int64_t chunk, const std::string& codes) = 0;
  virtual bool timelineChunk(int level, int64_t chunk,
                             const std::vector<TimelineSample>& samples) = 0;
};

struct StreamingOptions {
  std::string tempDir = "/tmp";          // the sorts' runs (unnamed files, gone once closed)
  size_t memoryBytes = 64u << 20;        // for the sorts' buffers, in all
  size_t maxInferencePoints = 1u << 22;  // the last totals kept for step inference
  size_t topItems = 20;
  // Set from another thread to stop the analysis soon (its result's error then says so).
  const std::atomic<bool>* cancel = nullptr;
  // Called on the analysing thread wherever the passes look at `cancel` (every 4,096 items):
  // the caller may pause there (tidemarkd's analysis yields to the jobs it records).
  std::function<void()> pace;
};

struct StreamingResult {
  CategorizeStats stats;
  std::vector<PeakReport> peaks;  // as Analysis::peaks
  std::vector<StepInterval> inferredSteps;
  int timelineLevels = 0;
  int64_t blocks = 0;
  std::string error;  // "" on success; else the sink may hold part of the results
};

StreamingResult analyzeStream(RecordingStream& in, AnalysisSink& out,
                              const StreamingOptions& options);

// A recording held in memory, as a stream (tests, and the same analysis for both).
std::unique_ptr<RecordingStream> streamOf(const Recording& recording);

}  // namespace tidemark::core
