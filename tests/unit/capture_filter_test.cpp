// The capture filter (a schedule's summarized steps) against the daemon's ingest: what it sends
// loses nothing the daemon counts as lost, every block the daemon sees is whole, and each
// summarized step's figures equal the peak the full recording has.
#include "agent/capture/capture_filter.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <tuple>

#include "agent/transport/batch_encoder.h"
#include "server/ingest/session_ingest.h"
#include "tidemark/v1/ingest.pb.h"

namespace tidemark::agent {
namespace {

constexpr uint32_t kReservedIid = 7;
constexpr int kHost = 1, kDevice = 2, kTensor = 3;

// A training-like process: model state before step 1 (tagged weights, a device segment with
// tagged tensors in it), optimizer state from step 1, per step a forward and a backward with
// activations, temporaries and gradients, a counter, blocks that outlive a step by one.
class Process {
 public:
  // Sequence numbers come from nextSeq (shared with the filter, as the recorder's are); each
  // record goes to emit as it is made. reserve(step): how many numbers a step's begin sets
  // aside after its own (the C ABI asks the filter).
  Process(uint64_t seed, uint64_t* nextSeq, std::function<void(const Record&)> emit,
          std::function<uint64_t(int64_t)> reserve)
      : m_random(seed),
        m_nextSeq(nextSeq),
        m_emit(std::move(emit)),
        m_reserve(std::move(reserve)) {}

  std::vector<Record> run(int steps) {
    const uint64_t segment = 0x7000000;
    alloc(kDevice, 0, segment, 1 << 20);
    for (int i = 0; i < 4; ++i) {
      alloc(kHost, -1, 0x1000 + i * 0x100, 64 + i);
      tag(0x1000 + i * 0x100, 64 + i, 1 /*WEIGHT*/, 10 + i);
    }
    for (int i = 0; i < 3; ++i) {
      alloc(kTensor, 0, segment + i * 4096, 4096);
      tag(segment + i * 4096, 4096, 1, 20 + i);
    }
    std::vector<std::tuple<int, int32_t, uint64_t>> carried;  // live into the next step
    for (int step = 1; step <= steps; ++step) {
      push(RecordKind::kStepBegin, static_cast<uint64_t>(step));
      for (auto& [kind, device, address] : carried) free(kind, device, address);
      carried.clear();
      phase(RecordKind::kPhaseBegin, 1);
      std::vector<std::tuple<int, int32_t, uint64_t>> activations;
      const int n = 20 + static_cast<int>(m_random() % 20);
      for (int i = 0; i < n; ++i) {
        const bool onDevice = m_random() % 2 == 0;
        const uint64_t address = onDevice ? segment + 0x10000 + i * 0x2000 : 0x100000 + i * 0x1000;
        const int kind = onDevice ? kTensor : kHost;
        const int32_t device = onDevice ? 0 : -1;
        alloc(kind, device, address, 16 + m_random() % 4000);
        if (m_random() % 3 == 0) {
          free(kind, device, address);  // a temporary
        } else {
          if (m_random() % 2 == 0) tag(address, 16, 4 /*ACTIVATION*/, 0);
          activations.emplace_back(kind, device, address);
        }
      }
      counter(kReservedIid, static_cast<int64_t>(m_random() % 100000));
      phase(RecordKind::kPhaseEnd, 1);
      phase(RecordKind::kPhaseBegin, 2);
      for (auto& [kind, device, address] : activations) {
        if (m_random() % 5 == 0) {
          carried.emplace_back(kind, device, address);
        } else {
          free(kind, device, address);
        }
      }
      if (step == 1) {
        for (int i = 0; i < 4; ++i) {
          alloc(kHost, -1, 0x9000 + i * 0x100, 128);
          tag(0x9000 + i * 0x100, 128, 3 /*OPTIMIZER_STATE*/, 30 + i);
        }
      }
      phase(RecordKind::kPhaseEnd, 2);
      push(RecordKind::kStepEnd, static_cast<uint64_t>(step));
    }
    return m_records;
  }

 private:
  void push(RecordKind kind, uint64_t address, uint8_t small = 0, int32_t device = -1,
            uint64_t size = 0, uint32_t name = 0) {
    Record r{};
    r.kind = kind;
    r.seq = (*m_nextSeq)++;
    r.tsNs = static_cast<int64_t>(r.seq) * 100;
    r.threadId = 1;
    r.address = address;
    r.small = small;
    r.device = device;
    r.sizeBytes = size;
    r.nameIid = name;
    if (kind == RecordKind::kStepBegin) {
      r.sizeBytes = m_reserve(static_cast<int64_t>(address));
      *m_nextSeq += r.sizeBytes;
    }
    m_records.push_back(r);
    m_emit(r);
  }
  void alloc(int kind, int32_t device, uint64_t address, uint64_t size) {
    push(RecordKind::kAlloc, address, static_cast<uint8_t>(kind), device, size);
  }
  void free(int kind, int32_t device, uint64_t address) {
    push(RecordKind::kFree, address, static_cast<uint8_t>(kind), device);
  }
  void tag(uint64_t address, uint64_t size, int category, uint32_t name) {
    push(RecordKind::kTag, address, static_cast<uint8_t>(category), -1, size, name);
  }
  void phase(RecordKind kind, int phase) { push(kind, 0, static_cast<uint8_t>(phase)); }
  void counter(uint32_t iid, int64_t value) {
    push(RecordKind::kCounter, 0, 0, -1, static_cast<uint64_t>(value), iid);
  }

  std::mt19937_64 m_random;
  uint64_t* m_nextSeq;
  std::function<void(const Record&)> m_emit;
  std::function<uint64_t(int64_t)> m_reserve;
  std::vector<Record> m_records;
};

// The full recording's peak of tracked bytes in each step (all memory: device -2; host -1;
// cuda:0), as the daemon's analysis counts it: a tensor inside a live segment adds nothing.
std::map<std::pair<int64_t, int32_t>, int64_t> stepPeaks(const std::vector<Record>& records) {
  std::map<std::tuple<int, int32_t, uint64_t>, std::pair<uint64_t, bool>> live;  // size, counted
  std::map<int32_t, int64_t> tracked;
  std::map<std::pair<int64_t, int32_t>, int64_t> peaks;
  int64_t step = 0;  // 0: outside steps
  auto note = [&] {
    if (step == 0) return;
    for (int32_t d : {-2, -1, 0}) {
      int64_t& p = peaks[{step, d}];
      p = std::max(p, tracked[d]);
    }
  };
  for (const Record& r : records) {
    const auto key = std::make_tuple(static_cast<int>(r.small), r.device, r.address);
    if (r.kind == RecordKind::kStepBegin) {
      step = static_cast<int64_t>(r.address);
      note();
    } else if (r.kind == RecordKind::kStepEnd) {
      step = 0;
    } else if (r.kind == RecordKind::kAlloc) {
      bool counted = true;
      if (r.small == kTensor) {
        for (const auto& [k, v] : live) {
          if (std::get<0>(k) == kDevice && std::get<1>(k) == r.device &&
              std::get<2>(k) <= r.address && r.address < std::get<2>(k) + v.first)
            counted = false;
        }
      }
      live[key] = {r.sizeBytes, counted};
      if (counted) {
        tracked[-2] += static_cast<int64_t>(r.sizeBytes);
        tracked[r.device] += static_cast<int64_t>(r.sizeBytes);
      }
      note();
    } else if (r.kind == RecordKind::kFree) {
      auto it = live.find(key);
      if (it == live.end()) continue;
      if (it->second.second) {
        tracked[-2] -= static_cast<int64_t>(it->second.first);
        tracked[r.device] -= static_cast<int64_t>(it->second.first);
      }
      live.erase(it);
      note();
    }
  }
  return peaks;
}

struct Outcome {
  std::vector<Record> records;  // what the process recorded
  server::SessionIngest ingest{1};
  server::SessionRows rows;
  uint64_t summarized = 0;
  uint64_t restated = 0;
  uint64_t restatedLate = 0;
  std::set<uint64_t> sentSeqs;  // of the events sent (not the ranges said summarized)
  size_t ranges = 0;            // Summarized events sent
};

// Runs a process of `steps` steps as the agent does: records go to the filter in collector passes
// of random length, then through the sender's encoding into the daemon's ingest. late: now and then
// a record comes one pass late (a thread descheduled between taking its number and publishing the
// record).
// lose: the last step's counter is never published (a thread killed between taking its number
// and writing its record): what follows it waits, and goes at the collector's last pass.
void capture(uint64_t seed, int steps, const core::CaptureSchedule& schedule, bool late,
             Outcome* out, bool lose = false) {
  uint64_t nextSeq = 1;
  CaptureFilter filter(
      schedule,
      [&](uint64_t n) {
        const uint64_t first = nextSeq;
        nextSeq += n;
        return first;
      },
      kReservedIid);
  std::mt19937_64 random(seed + 1000);
  std::vector<Record> pass;
  std::vector<Record> held;
  uint64_t batchSeq = 1;
  auto collect = [&](bool all) {
    std::vector<Record> now;
    now.swap(held);
    for (const Record& r : pass) {
      if (late && !all && random() % 17 == 0) {
        held.push_back(r);
      } else {
        now.push_back(r);
      }
    }
    pass.clear();
    std::sort(now.begin(), now.end(),
              [](const Record& a, const Record& b) { return a.seq < b.seq; });
    std::vector<Record> kept;
    filter.process(now, kept);
    for (const Record& r : kept) {
      if (r.kind != RecordKind::kSummarized) out->sentSeqs.insert(r.seq);
      if (r.kind == RecordKind::kSummarized && r.small == 0) ++out->ranges;
    }
    v1::AgentMessage m;
    ASSERT_TRUE(m.ParseFromString(encodeBatchMessage(batchSeq++, {}, kept)));
    ASSERT_TRUE(out->ingest.addBatch(m.batch()).ok());
  };
  size_t passLength = 1 + random() % 60;
  int64_t step = 0;
  Process process(
      seed, &nextSeq,
      [&](const Record& r) {
        if (r.kind == RecordKind::kStepBegin) step = static_cast<int64_t>(r.address);
        if (lose && step == steps && r.kind == RecordKind::kCounter) return;
        pass.push_back(r);
        if (pass.size() >= passLength) {
          collect(false);
          passLength = 1 + random() % 60;
        }
      },
      [&](int64_t step) {
        return filter.startsDetail(step) ? filter.restateBound(nextSeq - 1) : 0;
      });
  out->records = process.run(steps);
  collect(true);
  for (int i = 0; i < 10 && !held.empty(); ++i) collect(true);
  std::vector<Record> rest;
  filter.finish(rest);
  v1::AgentMessage m;
  ASSERT_TRUE(m.ParseFromString(encodeBatchMessage(batchSeq++, {}, rest)));
  ASSERT_TRUE(out->ingest.addBatch(m.batch()).ok());
  out->rows = out->ingest.takeRows();
  server::SessionRows last = out->ingest.finish();
  out->rows.blocks.insert(out->rows.blocks.end(), last.blocks.begin(), last.blocks.end());
  out->rows.tags.insert(out->rows.tags.end(), last.tags.begin(), last.tags.end());
  out->rows.stepFigures.insert(out->rows.stepFigures.end(), last.stepFigures.begin(),
                               last.stepFigures.end());
  out->rows.steps.insert(out->rows.steps.end(), last.steps.begin(), last.steps.end());
  out->summarized = filter.summarized();
  out->restated = filter.restated();
  out->restatedLate = filter.restatedLate();
}

int64_t stat(const server::SessionIngest& in, const std::string& name) {
  for (const server::StatRow& s : in.stats())
    if (s.name == name) return s.value;
  return 0;
}

TEST(CaptureFilterTest, SummarizedStepsLoseNothingAndTheirPeaksAreTheFullRecordings) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::string error;
    const auto schedule = core::CaptureSchedule::parseSteps("3-4,7", &error);
    ASSERT_TRUE(schedule) << error;
    Outcome out;
    capture(seed, 8, *schedule, /*late=*/false, &out);
    const std::vector<Record>& records = out.records;

    // Nothing lost, nothing the daemon could not place.
    EXPECT_EQ(stat(out.ingest, "seq_gap"), 0);
    EXPECT_EQ(stat(out.ingest, "free_of_untracked"), 0);
    EXPECT_EQ(stat(out.ingest, "alloc_over_live"), 0);
    EXPECT_EQ(stat(out.ingest, "summarized_overlap"), 0);
    EXPECT_EQ(stat(out.ingest, "events_summarized"), static_cast<int64_t>(out.summarized));
    EXPECT_EQ(stat(out.ingest, "blocks_restated"), static_cast<int64_t>(out.restated));
    // Each record went as itself or was summarized, never both.
    size_t sentAsItself = 0;
    for (const Record& r : records) sentAsItself += out.sentSeqs.count(r.seq);
    EXPECT_EQ(sentAsItself + out.summarized, records.size());
    EXPECT_GT(out.summarized, records.size() / 3);  // 3 steps of 8 in detail
    // A range a run of summarized records (broken by a pass's end, or a record that goes), not
    // one each: passes are 30 records on average here.
    EXPECT_LT(out.ranges * 8, out.summarized);
    // Before the first step mark everything goes as it is made (the model: 4 weights, the
    // segment and its 3 tensors); what summarized steps made and detail found live came back
    // when detail began: the optimizer state (4 blocks, from step 1), and what step 2 carried.
    EXPECT_GE(out.restated, 4u);
    for (const Record& r : records) {
      if (r.kind == RecordKind::kStepBegin) break;
      EXPECT_EQ(out.sentSeqs.count(r.seq), 1u) << "record " << r.seq << " before the first step";
    }
    EXPECT_EQ(out.rows.steps.size(), 8u);  // every step mark went
    EXPECT_EQ(out.restatedLate, 0u);       // the step's reserved numbers sufficed

    // Every summarized step's figures: its peak per device and in all, equal to the full
    // recording's; the bytes by category at the peak add up to it.
    const auto peaks = stepPeaks(records);
    std::map<std::pair<int64_t, int32_t>, int64_t> figured;
    std::map<std::pair<int64_t, int32_t>, int64_t> atPeak;
    std::set<int64_t> summarizedSteps;
    for (const server::StepFigureRow& f : out.rows.stepFigures) {
      summarizedSteps.insert(f.step);
      if (f.figure == v1::SUMMARY_FIGURE_PEAK_BYTES) figured[{f.step, f.device}] = f.value;
      if (f.figure == v1::SUMMARY_FIGURE_BYTES_AT_PEAK) atPeak[{f.step, f.device}] += f.value;
    }
    EXPECT_EQ(summarizedSteps, (std::set<int64_t>{1, 2, 5, 6, 8}));
    for (int64_t step : summarizedSteps) {
      for (int32_t d : {-2, -1, 0}) {
        SCOPED_TRACE("step " + std::to_string(step) + " device " + std::to_string(d));
        const std::pair<int64_t, int32_t> key{step, d};
        EXPECT_EQ(figured[key], peaks.at(key));
        EXPECT_EQ(atPeak[key], peaks.at(key));
      }
    }

    // Every block live in a detailed step is the daemon's, whole (same size, same free, also
    // when freed in a summarized step); no other block is.
    std::map<std::tuple<int, int32_t, uint64_t>, std::vector<server::BlockRow>> daemon;
    for (const server::BlockRow& b : out.rows.blocks)
      daemon[{b.memoryKind, b.device, b.address}].push_back(b);
    struct Open {
      uint64_t size;
      bool inDetail;  // live at some moment of a detailed step
    };
    std::map<std::tuple<int, int32_t, uint64_t>, Open> open;
    bool inDetail = false;
    size_t expected = 0;
    auto seen = [&](const std::tuple<int, int32_t, uint64_t>& key, uint64_t size,
                    uint64_t freeSeq) {
      bool found = false;
      for (const server::BlockRow& b : daemon[key])
        found |= b.sizeBytes == size && b.freeSeq == freeSeq;
      return found;
    };
    for (const Record& r : records) {
      const auto key = std::make_tuple(static_cast<int>(r.small), r.device, r.address);
      if (r.kind == RecordKind::kStepBegin) {
        inDetail = schedule->detailed(static_cast<int64_t>(r.address));
        if (inDetail)
          for (auto& [k, b] : open) b.inDetail = true;
      }
      if (r.kind == RecordKind::kAlloc) open[key] = {r.sizeBytes, inDetail};
      if (r.kind == RecordKind::kFree) {
        auto it = open.find(key);
        ASSERT_NE(it, open.end());
        if (it->second.inDetail) {
          EXPECT_TRUE(seen(key, it->second.size, r.seq)) << "block at " << r.address;
          ++expected;
        }
        open.erase(it);
      }
    }
    for (const auto& [key, b] : open) {
      if (!b.inDetail) continue;
      EXPECT_TRUE(seen(key, b.size, core::kOpenSeq));
      ++expected;
    }
    EXPECT_GT(expected, 20u);
    EXPECT_EQ(out.rows.blocks.size(), expected);

    // A restated block carries its strongest tag: the weights and optimizer state are tagged.
    std::map<uint64_t, int> tagOf;
    for (const server::TagRow& t : out.rows.tags) tagOf[t.address] = t.category;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(tagOf[0x1000 + i * 0x100], 1);
      EXPECT_EQ(tagOf[0x9000 + i * 0x100], 3);
    }
  }
}

TEST(CaptureFilterTest, LateRecordsAndEveryWindowStillLoseNothing) {
  std::string error;
  const auto schedule = core::CaptureSchedule::everyWindow(3, 1, &error);
  ASSERT_TRUE(schedule) << error;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Outcome out;
    capture(seed, 9, *schedule, /*late=*/true, &out);
    // A record one pass late is still accounted for: sent, or inside a range said summarized.
    EXPECT_EQ(stat(out.ingest, "seq_gap"), 0);
    EXPECT_EQ(stat(out.ingest, "summarized_overlap"), 0);
    EXPECT_EQ(stat(out.ingest, "free_of_untracked"), 0);
    EXPECT_EQ(stat(out.ingest, "events_summarized"), static_cast<int64_t>(out.summarized));
    std::set<int64_t> summarizedSteps;
    for (const server::StepFigureRow& f : out.rows.stepFigures) summarizedSteps.insert(f.step);
    EXPECT_EQ(summarizedSteps, (std::set<int64_t>{2, 3, 5, 6, 8, 9}));
  }
}

TEST(CaptureFilterTest, WhatWaitsForARecordThatNeverComesGoesAtTheLastPass) {
  std::string error;
  const auto schedule = core::CaptureSchedule::parseSteps("2-3", &error);
  ASSERT_TRUE(schedule) << error;
  Outcome out;
  capture(7, 4, *schedule, /*late=*/false, &out, /*lose=*/true);
  // The one record lost is the one hole; everything after it arrived, the last step whole.
  EXPECT_EQ(stat(out.ingest, "seq_gap"), 1);
  EXPECT_EQ(stat(out.ingest, "free_of_untracked"), 0);
  ASSERT_EQ(out.rows.steps.size(), 4u);
  std::set<int64_t> summarizedSteps;
  for (const server::StepFigureRow& f : out.rows.stepFigures) summarizedSteps.insert(f.step);
  EXPECT_EQ(summarizedSteps, (std::set<int64_t>{1, 4}));
}

// A program that never marks a step (no adapter, not Python) is recorded whole, not summarized
// away.
TEST(CaptureFilterTest, WithoutStepMarksEverythingGoes) {
  std::string error;
  const auto schedule = core::CaptureSchedule::parseSteps("3-4", &error);
  ASSERT_TRUE(schedule) << error;
  uint64_t next = 1000;
  CaptureFilter filter(
      *schedule, [&](uint64_t n) { return (next += n) - n; }, kReservedIid);
  std::vector<Record> in;
  for (uint64_t seq = 1; seq <= 200; ++seq) {
    Record r{};
    r.kind = seq % 2 ? RecordKind::kAlloc : RecordKind::kFree;
    r.small = 1;
    r.seq = seq;
    r.address = 0x1000 + (seq - 1) / 2 * 64;
    r.sizeBytes = r.kind == RecordKind::kAlloc ? 64 : 0;
    r.device = -1;
    in.push_back(r);
  }
  std::vector<Record> out;
  filter.process(in, out);
  filter.finish(out);
  ASSERT_EQ(out.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(out[i].seq, in[i].seq);
  EXPECT_EQ(filter.summarized(), 0u);
}

TEST(CaptureScheduleTest, ParsesStepsAndWindowsAndRefusesNonsense) {
  std::string error;
  auto s = core::CaptureSchedule::parseSteps("10,3-4", &error);
  ASSERT_TRUE(s) << error;
  EXPECT_FALSE(s->detailed(2));
  EXPECT_TRUE(s->detailed(3));
  EXPECT_TRUE(s->detailed(4));
  EXPECT_FALSE(s->detailed(5));
  EXPECT_TRUE(s->detailed(10));
  EXPECT_EQ(s->describe(), "steps 3-4,10 in full detail");
  auto w = core::CaptureSchedule::fromSettings("", "500", "3", &error);
  ASSERT_TRUE(w) << error;
  EXPECT_TRUE(w->detailed(1) && w->detailed(3) && w->detailed(501) && w->detailed(503));
  EXPECT_FALSE(w->detailed(4) || w->detailed(500) || w->detailed(504));
  EXPECT_FALSE(core::CaptureSchedule::fromSettings("", "", "", &error));
  EXPECT_TRUE(error.empty());
  for (const char* bad : {"", "0-3", "4-3", "a", "3-", "-3", "3,,4", "3-4-5"}) {
    EXPECT_FALSE(core::CaptureSchedule::parseSteps(bad, &error)) << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
  EXPECT_FALSE(core::CaptureSchedule::fromSettings("3-4", "10", "", &error));
  EXPECT_FALSE(core::CaptureSchedule::fromSettings("", "3", "4", &error));
  EXPECT_FALSE(core::CaptureSchedule::fromSettings("", "0", "", &error));
}

}  // namespace
}  // namespace tidemark::agent
