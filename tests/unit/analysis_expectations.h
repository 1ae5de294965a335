#pragma once

// Field-by-field comparisons of analysis results, shared by the tests that hold two analyses
// equal (streaming vs in memory, live vs the pass).
#include <gtest/gtest.h>

#include <vector>

#include "src/core/peak.h"
#include "src/core/timeline.h"

namespace tidemark::core::testing {

inline void expectSameState(const MemoryState& a, const MemoryState& b) {
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.tsNs, b.tsNs);
  EXPECT_EQ(a.trackedBytes, b.trackedBytes);
  EXPECT_EQ(a.bytes, b.bytes);
  EXPECT_EQ(a.blocks, b.blocks);
}

inline void expectSameItems(const std::vector<PeakItem>& a, const std::vector<PeakItem>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name) << i;
    EXPECT_EQ(a[i].bytes, b[i].bytes) << a[i].name;
    EXPECT_EQ(a[i].blocks, b[i].blocks) << a[i].name;
    EXPECT_EQ(a[i].category, b[i].category) << a[i].name;
    EXPECT_EQ(a[i].rule, b[i].rule) << a[i].name;
  }
}

inline void expectSameSamples(const std::vector<TimelineSample>& a,
                              const std::vector<TimelineSample>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].firstSeq, b[i].firstSeq);
    EXPECT_EQ(a[i].lastSeq, b[i].lastSeq);
    EXPECT_EQ(a[i].firstTsNs, b[i].firstTsNs);
    EXPECT_EQ(a[i].lastTsNs, b[i].lastTsNs);
    EXPECT_EQ(a[i].min, b[i].min);
    EXPECT_EQ(a[i].max, b[i].max);
    EXPECT_EQ(a[i].last, b[i].last);
  }
}

}  // namespace tidemark::core::testing
