// The importers on the small seed files of tests/fuzz/corpus (written by Python's pickle and
// json): the pickle reader, both snapshot forms, and a Kineto trace with and without Addr.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "src/importers/kineto_trace.h"
#include "src/importers/memory_snapshot.h"
#include "src/importers/pickle_reader.h"

namespace tidemark::core {
namespace {

std::string corpus(const std::string& name) {
  std::ifstream in(std::string(TIDEMARK_CORPUS_DIR) + "/" + name, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

int64_t liveAtEnd(const ImportedRecording& r) {
  int64_t live = 0;
  std::map<uint64_t, int64_t> blocks;
  for (const ImportEvent& e : r.events) {
    if (e.kind == ImportEvent::Kind::kAlloc) blocks[e.address] = static_cast<int64_t>(e.sizeBytes);
    if (e.kind == ImportEvent::Kind::kFree) blocks.erase(e.address);
  }
  for (const auto& [a, s] : blocks) live += s;
  return live;
}

TEST(PickleReader, ReadsEveryProtocolTheSame) {
  for (const char* f :
       {"pickle/snapshot_p2.pickle", "pickle/snapshot_p4.pickle", "pickle/snapshot_p5.pickle"}) {
    absl::StatusOr<std::shared_ptr<PyValue>> v = readPickle(corpus(f));
    ASSERT_TRUE(v.ok()) << f << ": " << v.status();
    const PyValue* segs = (*v)->get("segments");
    ASSERT_NE(segs, nullptr);
    ASSERT_EQ(segs->items.size(), 1u);
    EXPECT_EQ(segs->items[0]->get("total_size")->asInt(), 2048);
    EXPECT_EQ((*v)->get("device_traces")->items[0]->items.size(), 4u);
  }
}

TEST(PickleReader, RefusesGlobalsAndTruncation) {
  // GLOBAL "os system", then REDUCE: the classic way a pickle runs code.
  absl::StatusOr<std::shared_ptr<PyValue>> v =
      readPickle(std::string("\x80\x02"
                             "cos\nsystem\n.",
                             13));
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("refers to a global"), std::string::npos);
  const std::string good = corpus("pickle/snapshot_p4.pickle");
  EXPECT_FALSE(readPickle(good.substr(0, good.size() / 2)).ok());
  EXPECT_FALSE(readPickle("").ok());
  // A list that contains itself (MEMOIZE, BINGET, APPEND) is refused, not leaked.
  v =
      readPickle(std::string("\x80\x04]\x94h\x00"
                             "a.",
                             8));
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("contains itself"), std::string::npos);
}

TEST(PickleReader, DepthIsBoundedAndDeepValuesAreFreedWithoutRecursion) {
  // Lists nested n deep: n EMPTY_LISTs, then n-1 APPENDs.
  auto nested = [](size_t n) {
    return std::string("\x80\x02") + std::string(n, ']') + std::string(n - 1, 'a') + ".";
  };
  absl::StatusOr<std::shared_ptr<PyValue>> v = readPickle(nested(kMaxPickleDepth));
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ((*v)->depth, kMaxPickleDepth);
  v = readPickle(nested(300000));
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("nested deeper than 10000"), std::string::npos);
  // Ten million values open at once (NONE after NONE): refused at the bound, not held.
  v = readPickle(std::string("\x80\x02") + std::string(10000000, 'N') + ".");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("values open at once"), std::string::npos);
  // A chain built by hand, a million deep, is freed in a loop (recursion would overflow the
  // stack long before).
  auto root = std::make_shared<PyValue>();
  root->kind = PyValue::Kind::kList;
  PyValue* tail = root.get();
  for (int i = 0; i < 1000000; ++i) {
    auto next = std::make_shared<PyValue>();
    next->kind = PyValue::Kind::kList;
    tail->items.push_back(next);
    tail = next.get();
  }
  root.reset();
  SUCCEED();
}

TEST(MemorySnapshot, ReplaysTheTraceToTheDump) {
  absl::StatusOr<ImportedRecording> r = importMemorySnapshot(corpus("pickle/snapshot_p4.pickle"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->reservedBytes, 2048);
  EXPECT_EQ(r->allocatedAtEndBytes, 512);
  EXPECT_EQ(liveAtEnd(*r), 512);
  // The block alive at the dump was allocated in the trace (no frames): untagged; the first one
  // was allocated in forward: ACTIVATION.
  int tags = 0;
  for (const ImportEvent& e : r->events) {
    if (e.kind != ImportEvent::Kind::kTag) continue;
    ++tags;
    EXPECT_EQ(e.category, Category::kActivation);
    EXPECT_EQ(e.name, "[frames:forward] forward (m.py:1)");
  }
  EXPECT_EQ(tags, 1);
}

TEST(MemorySnapshot, TheOldestFormIsAListOfSegments) {
  absl::StatusOr<ImportedRecording> r = importMemorySnapshot(corpus("pickle/segments_only.pickle"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->allocatedAtEndBytes, 512);
  EXPECT_EQ(liveAtEnd(*r), 512);
  ASSERT_FALSE(r->notes.empty());
}

TEST(KinetoTrace, MemoryOpsKernelsAndSteps) {
  absl::StatusOr<ImportedRecording> r = importKinetoTrace(corpus("kineto/small_trace.json"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ops, 2);  // ProfilerStep#1 and aten::mm
  EXPECT_EQ(r->kernels, 1);
  EXPECT_EQ(r->statedPeakBytes, 1536);
  // 1024 B were there before the first event (Total Allocated 1536 after +512).
  EXPECT_EQ(r->preexistingBytes, 1024);
  int64_t live = 0, peak = 0;
  std::map<uint64_t, int64_t> blocks;
  for (const ImportEvent& e : r->events) {
    if (e.kind == ImportEvent::Kind::kAlloc) {
      blocks[e.address] = static_cast<int64_t>(e.sizeBytes);
      live += static_cast<int64_t>(e.sizeBytes);
    }
    if (e.kind == ImportEvent::Kind::kFree) {
      live -= blocks[e.address];
      blocks.erase(e.address);
    }
    peak = std::max(peak, live);
  }
  EXPECT_EQ(peak, 1536);
  EXPECT_EQ(live, 1024 + 256);  // the Addr-less alloc at the end has an address of its own
}

// The category and tag name each alloc of `r` got, by address.
std::map<uint64_t, std::pair<Category, std::string>> tagsByAddress(const ImportedRecording& r) {
  std::map<uint64_t, std::pair<Category, std::string>> out;
  for (const ImportEvent& e : r.events)
    if (e.kind == ImportEvent::Kind::kTag) out[e.address] = {e.category, e.name};
  return out;
}

TEST(MemorySnapshot, OneTrainingStepIsExplained) {
  // A step recorded after warm-up: a weight, a gradient and a moment from before the trace; the
  // step's forward, backward (AccumulateGrad) and an optimizer that replaces its state.
  absl::StatusOr<ImportedRecording> r = importMemorySnapshot(corpus("pickle/training_step.pickle"));
  ASSERT_TRUE(r.ok()) << r.status();
  const auto tags = tagsByAddress(*r);
  auto is = [&](uint64_t address, Category c, const std::string& rulePrefix) {
    auto it = tags.find(address);
    ASSERT_NE(it, tags.end()) << std::hex << address;
    EXPECT_EQ(it->second.first, c) << std::hex << address;
    EXPECT_EQ(it->second.second.rfind(rulePrefix, 0), 0u) << it->second.second;
  };
  is(0x1000, Category::kWeight, "[kept, parameter-sized]");
  is(0x3000, Category::kGradient, "[freed by zero_grad]");
  is(0x2000, Category::kOptimizerState, "[replaced by the optimizer]");
  is(0x4000, Category::kActivation, "[frames:forward]");
  is(0x5000, Category::kTemporary, "[frames:forward, freed there]");
  is(0x6000, Category::kGradient, "[frames:backward]");
  is(0x7000, Category::kOptimizerState, "[frames:optimizer]");
  is(0x8000, Category::kTemporary, "[frames:optimizer]");
  is(0x9000, Category::kActivation, "[frames:forward]");
  // Each alloc with frames carries its stack: the Python frames, innermost first.
  std::map<uint64_t, std::string> stacks;
  for (const ImportEvent& e : r->events)
    if (e.kind == ImportEvent::Kind::kStack) stacks[e.address] = e.name;
  EXPECT_EQ(stacks[0x4000], "forward (model.py:1)\ntrain (train.py:1)");
  EXPECT_EQ(stacks[0x6000],
            "backward (_tensor.py:1)\ntrain (train.py:1)\n(and 2 more frames)");  // C++ ones
  EXPECT_EQ(stacks.count(0x1000), 0u);  // from before the trace: no frames
  // One step: from the trace's start to the optimizer's last entry (the free at 0x8000), before
  // the next forward.
  std::vector<std::pair<ImportEvent::Kind, int64_t>> marks;
  int64_t lastOptimizerFreeNs = -1;
  for (const ImportEvent& e : r->events) {
    if (e.kind == ImportEvent::Kind::kStepBegin || e.kind == ImportEvent::Kind::kStepEnd)
      marks.push_back({e.kind, e.step});
    if (e.kind == ImportEvent::Kind::kFree && e.address == 0x8000) lastOptimizerFreeNs = e.tsNs;
    if (e.kind == ImportEvent::Kind::kStepEnd) {
      EXPECT_EQ(e.tsNs, lastOptimizerFreeNs);
    }
  }
  ASSERT_EQ(marks.size(), 2u);
  EXPECT_EQ(marks[0], std::make_pair(ImportEvent::Kind::kStepBegin, int64_t{1}));
  EXPECT_EQ(marks[1], std::make_pair(ImportEvent::Kind::kStepEnd, int64_t{1}));
  EXPECT_EQ(liveAtEnd(*r), r->allocatedAtEndBytes);
}

TEST(KinetoTrace, ATrainingStepIsExplained) {
  absl::StatusOr<ImportedRecording> r = importKinetoTrace(corpus("kineto/training_step.json"));
  ASSERT_TRUE(r.ok()) << r.status();
  constexpr int64_t kT = int64_t{1623142623460000} * 1000;
  // The step is the CPU's annotation (0-100 us), not its GPU twin (5-205 us).
  std::vector<int64_t> stepTimes;
  // Kernels back to back at epoch microseconds: the first ends where the second begins, exactly.
  std::vector<std::pair<ImportEvent::Kind, int64_t>> kernels;
  std::map<uint64_t, uint32_t> allocThread;
  std::map<std::string, uint32_t> opThread;
  for (const ImportEvent& e : r->events) {
    if (e.kind == ImportEvent::Kind::kStepBegin || e.kind == ImportEvent::Kind::kStepEnd)
      stepTimes.push_back(e.tsNs - kT);
    if (e.kernel) kernels.push_back({e.kind, e.tsNs - kT});
    if (e.kind == ImportEvent::Kind::kAlloc) allocThread[e.address] = e.thread;
    if (e.kind == ImportEvent::Kind::kScopeBegin && e.op) opThread[e.name] = e.thread;
  }
  EXPECT_EQ(stepTimes, (std::vector<int64_t>{0, 100'000}));
  using K = ImportEvent::Kind;
  EXPECT_EQ(kernels, (std::vector<std::pair<K, int64_t>>{{K::kScopeBegin, 101'000},
                                                         {K::kScopeEnd, 104'000},
                                                         {K::kScopeBegin, 104'000},
                                                         {K::kScopeEnd, 106'000}}));
  // Memory events keep their thread, so that the thread's open op owns the block.
  EXPECT_EQ(allocThread[100], opThread["aten::mm"]);
  EXPECT_EQ(allocThread[102],
            opThread["autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"]);
  EXPECT_NE(allocThread[100], allocThread[102]);
  const auto tags = tagsByAddress(*r);
  auto is = [&](uint64_t address, Category c, const std::string& rule) {
    auto it = tags.find(address);
    ASSERT_NE(it, tags.end()) << address;
    EXPECT_EQ(it->second, std::make_pair(c, rule)) << address;
  };
  is(300, Category::kGradient, "[before the trace, freed by zero_grad]");
  is(100, Category::kActivation, "[forward, freed in backward]");
  is(101, Category::kTemporary, "[forward, freed in forward]");
  is(102, Category::kGradient, "[AccumulateGrad]");
  is(103, Category::kTemporary, "[optimizer, freed in it]");
  is(104, Category::kOptimizerState, "[optimizer, kept past it]");
  // The rest of what was there before (1024 - 512 B): unknown in a training trace.
  int unknownBefore = 0;
  for (const auto& [address, tag] : tags)
    if (tag == std::make_pair(Category::kUnknown, std::string("[before the trace]")))
      ++unknownBefore;
  EXPECT_EQ(unknownBefore, 1);
  EXPECT_EQ(r->preexistingBytes, 1024);
  EXPECT_EQ(r->allocatedAtEndBytes, 1024 - 512 + 512 + 64);
  EXPECT_EQ(liveAtEnd(*r), r->allocatedAtEndBytes);
}

TEST(KinetoTrace, AForwardOnlyTraceKeepsItsWeights) {
  // Steps without a backward: what was there before the trace and stays is the model's weights.
  const std::string trace = R"({"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1,
     "ts": 10.5, "dur": 20.25},
    {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 11, "dur": 5},
    {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 12,
     "args": {"Device Type": 1, "Device Id": 0, "Addr": 7, "Bytes": 100,
              "Total Allocated": 1100, "Total Reserved": 2048}}]})";
  absl::StatusOr<ImportedRecording> r = importKinetoTrace(trace);
  ASSERT_TRUE(r.ok()) << r.status();
  const auto tags = tagsByAddress(*r);
  int weights = 0;
  for (const auto& [address, tag] : tags) weights += tag.first == Category::kWeight;
  EXPECT_EQ(weights, 1);
  EXPECT_EQ(tags.at(7),
            std::make_pair(Category::kActivation, std::string("[forward, kept past it]")));
  std::vector<int64_t> stepTimes;
  for (const ImportEvent& e : r->events)
    if (e.kind == ImportEvent::Kind::kStepBegin || e.kind == ImportEvent::Kind::kStepEnd)
      stepTimes.push_back(e.tsNs);
  EXPECT_EQ(stepTimes, (std::vector<int64_t>{10'500, 30'750}));  // fractional us, exact
}

// The allocs and frees of `r`, in order (what a doubled file must not change).
std::vector<std::tuple<ImportEvent::Kind, uint64_t, uint64_t>> memoryEvents(
    const ImportedRecording& r) {
  std::vector<std::tuple<ImportEvent::Kind, uint64_t, uint64_t>> out;
  for (const ImportEvent& e : r.events)
    if (e.kind == ImportEvent::Kind::kAlloc || e.kind == ImportEvent::Kind::kFree)
      out.emplace_back(e.kind, e.address, e.sizeBytes);
  return out;
}

bool saysRepeated(const ImportedRecording& r) {
  for (const std::string& n : r.notes)
    if (n.find("repeat the one before them") != std::string::npos) return true;
  return false;
}

TEST(MemorySnapshot, RepeatedEntriesAreLeftOutAndSaid) {
  // training_step_doubled.pickle: training_step.pickle with every trace entry written twice.
  absl::StatusOr<ImportedRecording> once =
      importMemorySnapshot(corpus("pickle/training_step.pickle"));
  absl::StatusOr<ImportedRecording> twice =
      importMemorySnapshot(corpus("pickle/training_step_doubled.pickle"));
  ASSERT_TRUE(once.ok() && twice.ok());
  EXPECT_EQ(memoryEvents(*twice), memoryEvents(*once));
  EXPECT_TRUE(saysRepeated(*twice));
  EXPECT_FALSE(saysRepeated(*once));
}

TEST(KinetoTrace, RepeatedEventsAreLeftOutAndSaid) {
  const std::string text = corpus("kineto/training_step.json");
  nlohmann::json doubled = nlohmann::json::parse(text);
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : doubled["traceEvents"]) {
    events.push_back(e);
    if (e["name"] == "[memory]") events.push_back(e);
  }
  doubled["traceEvents"] = events;
  absl::StatusOr<ImportedRecording> once = importKinetoTrace(text);
  absl::StatusOr<ImportedRecording> twice = importKinetoTrace(doubled.dump());
  ASSERT_TRUE(once.ok() && twice.ok());
  EXPECT_EQ(memoryEvents(*twice), memoryEvents(*once));
  EXPECT_TRUE(saysRepeated(*twice));
  EXPECT_FALSE(saysRepeated(*once));
}

TEST(KinetoTrace, AbsurdSizesAreErrors) {
  auto withBytes = [](const std::string& bytes) {
    return R"({"traceEvents": [{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
               "args": {"Device Type": 1, "Device Id": 0, "Addr": 7, "Bytes": )" +
           bytes + "}}]}";
  };
  EXPECT_TRUE(importKinetoTrace(withBytes("4398046511104")).ok());               // 4 TiB
  EXPECT_EQ(importKinetoTrace(withBytes("562949953421312")).status().message(),  // 2^49
            "trace: absurd [memory] size 562949953421312 (at most 4 TiB a block)");
  EXPECT_EQ(importKinetoTrace(withBytes("1e30")).status().message(),
            "trace: absurd [memory] size 1e+30");
}

TEST(KinetoTrace, SaysWhatIsWrong) {
  EXPECT_EQ(importKinetoTrace("{").status().message(), "not valid JSON");
  EXPECT_EQ(importKinetoTrace("{\"x\": 1}").status().message(),
            "not a Chrome / Kineto trace: no traceEvents list");
  EXPECT_TRUE(importKinetoTrace("{\"traceEvents\": [{\"name\": 5, \"ts\": \"x\"}]}").ok());
}

}  // namespace
}  // namespace tidemark::core
