// Megatron-LM's flag sets for a chain (src/advisor/megatron_flags.h): what each flag set
// recomputes, which one is chosen for a budget, and that tidemark's optimal plan is never dearer.
#include <gtest/gtest.h>

#include <random>

#include "src/advisor/megatron_flags.h"
#include "src/advisor/planner.h"
#include "tests/unit/chain_fixtures.h"

namespace tidemark::core {
namespace {

using chain_fixtures::stage;

std::string joined(const std::vector<std::string>& flags) {
  std::string out;
  for (const std::string& f : flags) out += (out.empty() ? "" : " ") + f;
  return out;
}

// An embedding, four identical transformer layers (each with its attention as an option: a
// third of its saved bytes for a tenth of its time), a head.
ChainProfile gpt(bool attention = true) {
  ChainProfile p;
  p.name = "gpt";
  p.staticBytes = 1000;
  p.inputBytes = 10;
  Stage embed = stage("embed", 10, 20, 50, 40);
  embed.checkpointable = false;
  p.stages.push_back(embed);
  for (int i = 0; i < 4; ++i) {
    Stage s = stage("blocks." + std::to_string(i), 100, 200, 400, 40);
    if (attention)
      s.options.push_back({"attn", 400 - 150, 10, {"blocks." + std::to_string(i) + ".attn"}});
    p.stages.push_back(s);
  }
  Stage head = stage("head", 20, 40, 80, 10);
  head.checkpointable = false;
  p.stages.push_back(head);
  return p;
}

MegatronExport exportAt(const ChainProfile& p, int64_t budget) {
  const PlanReport r = makePlan(p, budget, Strategy::kOptimal, 0.0);
  return megatronExport(p, budget, 0, r.plan);
}

TEST(MegatronFlagsTest, EachFlagSetRecomputesWhatMegatronDoes) {
  const ChainProfile p = gpt();
  const int64_t storeAll = simulate(p, storeAllPlan(p)).peakBytes;
  // Everything fits: no flags, and tidemark's plan (store-all) is that flag set.
  MegatronExport e = exportAt(p, storeAll);
  EXPECT_TRUE(e.best.flags.empty());
  EXPECT_TRUE(e.best.fits);
  EXPECT_TRUE(e.sameAsPlan);
  // none, block 1..4, uniform 2..4, selective.
  EXPECT_EQ(e.candidates, 1 + 4 + 3 + 1);
  // A little less: the attention of every layer (cheapest), as Megatron's selective flag, said
  // to be an approximation.
  e = exportAt(p, storeAll - 1);
  EXPECT_EQ(joined(e.best.flags), "--recompute-granularity selective");
  EXPECT_EQ(planSignature(e.best.plan), "S|s0|s0|s0|s0|S");
  EXPECT_FALSE(e.note.empty());
  // Without attention options: the first layer recomputed (block 1).
  const ChainProfile plain = gpt(false);
  e = exportAt(plain, simulate(plain, storeAllPlan(plain)).peakBytes - 1);
  EXPECT_EQ(e.candidates, 1 + 4 + 3);
  EXPECT_EQ(joined(e.best.flags),
            "--recompute-granularity full --recompute-method block --recompute-num-layers 1");
  EXPECT_EQ(planSignature(e.best.plan), "S|R|SSSS");
  EXPECT_TRUE(e.note.empty());
  // The least any flag set reaches: every layer recomputed, alone (block 4) or in groups.
  int64_t least = storeAll;
  for (int k = 1; k <= 4; ++k) {
    ChainPlan uniform;  // groups of k
    uniform.segments.push_back(Segment(0, 0));
    for (int g = 1; g <= 4; g += k)
      uniform.segments.push_back(Segment(g, std::min(g + k - 1, 4), SegmentMode::kRecompute));
    uniform.segments.push_back(Segment(5, 5));
    least = std::min(least, simulate(plain, uniform).peakBytes);
  }
  e = exportAt(plain, least);
  EXPECT_TRUE(e.best.fits);
  EXPECT_EQ(e.best.predicted.peakBytes, least);
  // Below it: none fits; the lowest peak is named.
  e = exportAt(plain, least - 1);
  EXPECT_FALSE(e.best.fits);
  EXPECT_EQ(e.best.predicted.peakBytes, least);
}

TEST(MegatronFlagsTest, AGroupAcrossAStageThatCannotBeRecomputedIsNotOffered) {
  ChainProfile p = gpt(false);
  p.stages[2].checkpointable = false;  // the second layer: layers 1, 3, 4 remain
  const MegatronExport e = exportAt(p, simulate(p, storeAllPlan(p)).peakBytes);
  // none, block 1..3, uniform 2 and 3 would group stage 1 with 3 across stage 2: not offered.
  EXPECT_EQ(e.candidates, 1 + 3);
}

// Megatron's flag sets are plans of the chain: tidemark's optimal plan for a budget never adds
// more than the cheapest of them that fits, and is one of them when it says so.
TEST(MegatronFlagsTest, TheOptimalPlanIsNeverDearerThanTheFlags) {
  std::mt19937_64 rng(18);
  int compared = 0, expressible = 0;
  for (int round = 0; round < 300; ++round) {
    const ChainProfile p = chain_fixtures::randomChain(rng, 2 + static_cast<int>(rng() % 14), true);
    const int64_t storeAll = simulate(p, storeAllPlan(p)).peakBytes;
    const int64_t low = p.staticBytes;
    for (int i = 0; i <= 10; ++i) {
      const int64_t budget = low + (storeAll - low) * i / 10;
      const PlanReport r = makePlan(p, budget, Strategy::kOptimal, 0.0);
      const MegatronExport e = megatronExport(p, budget, 0, r.plan);
      if (!e.best.fits) continue;
      ++compared;
      ASSERT_TRUE(r.feasible) << budget;
      EXPECT_LE(r.predicted.extraNs, e.best.predicted.extraNs) << planSignature(e.best.plan);
      if (e.sameAsPlan) ++expressible;
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(expressible, 0);
  EXPECT_LT(expressible, compared);
}

}  // namespace
}  // namespace tidemark::core
