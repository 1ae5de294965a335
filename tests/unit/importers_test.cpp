// The importers on the small seed files of tests/fuzz/corpus (written by Python's pickle and
// json): the pickle reader, both snapshot forms, and a Kineto trace with and without Addr.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

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

TEST(KinetoTrace, SaysWhatIsWrong) {
  EXPECT_EQ(importKinetoTrace("{").status().message(), "not valid JSON");
  EXPECT_EQ(importKinetoTrace("{\"x\": 1}").status().message(),
            "not a Chrome / Kineto trace: no traceEvents list");
  EXPECT_TRUE(importKinetoTrace("{\"traceEvents\": [{\"name\": 5, \"ts\": \"x\"}]}").ok());
}

}  // namespace
}  // namespace tidemark::core
