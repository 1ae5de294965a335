// The chain model measured on a hand-written recording: two blocks, each saving activations, with
// known sizes, times and lifetimes.
#include <gtest/gtest.h>

#include "src/advisor/chain_from_recording.h"
#include "src/advisor/simulator.h"
#include "src/advisor/stage_times.h"
#include "src/core/categorize.h"
#include "tests/unit/recording_builders.h"

namespace tidemark::core {
namespace {

using testing::block;
using testing::phase;

Tag saved(uint64_t seq, uint64_t addr, std::string module) {
  Tag t = testing::tag(seq, addr, Category::kActivation);
  t.name = std::move(module) + ":saved";
  return t;
}

ScopeInterval scope(std::string name, uint64_t begin, uint64_t end, int depth) {
  ScopeInterval s;
  s.name = std::move(name);
  s.beginSeq = begin;
  s.endSeq = end;
  s.beginTsNs = static_cast<int64_t>(begin) * 100;
  s.endTsNs = static_cast<int64_t>(end) * 100;
  s.depth = depth;
  return s;
}

// Phases timed at 100 ns per sequence number; one step over everything (seq 1-100).
void timePhasesAndStep(Recording& r) {
  for (PhaseInterval& p : r.phases) {
    p.beginTsNs = static_cast<int64_t>(p.beginSeq) * 100;
    p.endTsNs = static_cast<int64_t>(p.endSeq) * 100;
  }
  StepInterval step;
  step.step = 1;
  step.beginSeq = 1;
  step.endSeq = 100;
  step.endTsNs = 10000;
  r.steps = {step};
}

// Weights 1000 B; input x0 (100) saved by block 0; block 0 saves a0 (400), makes a temporary
// (50) and its output (100), which block 1 saves; block 1 saves a1 (300) and makes its output
// (100), which the loss consumes.
Recording twoBlocks() {
  Recording r;
  r.blocks = {block(0x1000, 1000, 1, kOpenSeq), block(0x2000, 100, 3, 60),
              block(0x3000, 400, 7, 55),        block(0x3100, 50, 9, 12),
              block(0x3200, 100, 13, 50),       block(0x4000, 300, 18, 45),
              block(0x4200, 100, 24, 35),       block(0x4300, 10, 27, 36),
              block(0x5000, 100, 41, 52),       block(0x5100, 100, 51, 57)};
  r.tags = {saved(6, 0x2000, "M.blocks.0.lin"), saved(8, 0x3000, "M.blocks.0.lin"),
            saved(17, 0x3200, "M.blocks.1.lin"), saved(19, 0x4000, "M.blocks.1.lin")};
  r.phases = {phase(Phase::kForward, 2, 29), phase(Phase::kBackward, 30, 60),
              phase(Phase::kOptimizer, 60, 70)};
  timePhasesAndStep(r);
  r.scopes = {scope("M", 2, 29, 0),
              scope("M.blocks.0", 5, 15, 1),
              scope("M.blocks.0.lin", 6, 10, 2),
              scope("M.blocks.1", 16, 26, 1),
              scope("M.blocks.1.lin", 17, 21, 2),
              scope("M.blocks.1.lin [backward]", 40, 46, 0),
              scope("M.blocks.0.lin [backward]", 50, 58, 0)};
  r.sortBySeq();
  return r;
}

TEST(ChainFromRecording, MeasuresTheBlocks) {
  const Recording rec = twoBlocks();
  const std::vector<BlockCategory> cats = categorize(rec);
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, cats, 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->blocksPrefix, "M.blocks");
  EXPECT_EQ(c->step, 1);
  const ChainProfile& p = c->profile;
  ASSERT_EQ(p.size(), 2);
  EXPECT_EQ(p.stages[0].name, "M.blocks.0");
  EXPECT_EQ(p.inputBytes, 100);  // x0, saved by block 0 and born before it
  EXPECT_EQ(p.stages[0].forwardNs, 1000);
  EXPECT_EQ(p.stages[0].backwardNs, 800);
  EXPECT_EQ(p.stages[0].savedBytes, 400);
  EXPECT_EQ(p.stages[0].outputBytes, 100);
  // Born inside the forward at most 500 at once (a0 + output), less the output.
  EXPECT_EQ(p.stages[0].forwardWorkingBytes, 400);
  EXPECT_EQ(p.stages[1].savedBytes, 300);
  EXPECT_EQ(p.stages[1].outputBytes, 100);
  EXPECT_EQ(p.stages[1].backwardNs, 600);
  // Checkpointing the child that saved a0 drops it all.
  ASSERT_EQ(p.stages[0].options.size(), 1u);
  EXPECT_EQ(p.stages[0].options[0].name, "recompute lin");
  EXPECT_EQ(p.stages[0].options[0].savedBytes, 0);
  EXPECT_EQ(p.stages[0].options[0].recompute, std::vector<std::string>{"M.blocks.0.lin"});
  // Everything stored in the recording; the model reproduces its peak (2010 B at seq 27, with
  // the loss's block live) and the optimizer step's floor.
  EXPECT_EQ(planSignature(c->recordedPlan), "S|S");
  EXPECT_EQ(c->measuredPeakBytes, 2010);
  EXPECT_EQ(simulate(p, c->recordedPlan).peakBytes, 2010);
  EXPECT_EQ(p.floorBytes, 1100);
}

// twoBlocks() as `steps` training steps, one after the other (100 sequence numbers each; the
// weights once).
Recording twoBlocksSteps(int steps) {
  const Recording one = twoBlocks();
  Recording r;
  for (int t = 0; t < steps; ++t) {
    const uint64_t off = 100 * static_cast<uint64_t>(t);
    const int64_t offNs = static_cast<int64_t>(off) * 100;
    for (Block b : one.blocks) {
      if (t > 0 && b.freeSeq == kOpenSeq) continue;  // the weights
      b.allocSeq += off;
      b.allocTsNs += offNs;
      if (b.freeSeq != kOpenSeq) {
        b.freeSeq += off;
        b.freeTsNs += offNs;
      }
      r.blocks.push_back(b);
    }
    for (Tag g : one.tags) {
      g.seq += off;
      g.tsNs += offNs;
      r.tags.push_back(g);
    }
    // Phases, scopes and steps: intervals, moved on as a whole.
    auto shifted = [&](auto iv) {
      iv.beginSeq += off;
      iv.endSeq += off;
      iv.beginTsNs += offNs;
      iv.endTsNs += offNs;
      return iv;
    };
    for (const PhaseInterval& ph : one.phases) r.phases.push_back(shifted(ph));
    for (const ScopeInterval& sc : one.scopes) r.scopes.push_back(shifted(sc));
    StepInterval st = shifted(one.steps[0]);
    st.step = t + 1;
    r.steps.push_back(st);
  }
  r.sortBySeq();
  return r;
}

// Sets the duration of the call of `name` that begins at `beginSeq`.
void timeScope(Recording& r, const std::string& name, uint64_t beginSeq, int64_t ns) {
  for (ScopeInterval& sc : r.scopes)
    if (sc.name == name && sc.beginSeq == beginSeq) sc.endTsNs = sc.beginTsNs + ns;
}

// A block re-run inside a recompute phase of the step's backward, `ns` long.
void rerunIn(Recording& r, int step, const std::string& name, int64_t ns) {
  const uint64_t off = 100 * static_cast<uint64_t>(step - 1);
  PhaseInterval re = phase(Phase::kRecompute, off + 31, off + 34);
  re.beginTsNs = static_cast<int64_t>(re.beginSeq) * 100;
  re.endTsNs = re.beginTsNs + ns + 100;
  r.phases.push_back(re);
  ScopeInterval sc = scope(name, off + 32, off + 33, 1);
  sc.endTsNs = sc.beginTsNs + ns;
  r.scopes.push_back(sc);
  r.sortBySeq();
}

// A module's times over the steady steps (the first step left out): the mean of its runs, stalls
// beyond 4x the median left out; a forward in a step that re-ran the module is no sample; each
// re-run is one.
TEST(ChainFromRecording, ModuleTimesAreTypicalRunsOverTheSteadySteps) {
  Recording rec = twoBlocksSteps(7);
  timeScope(rec, "M.blocks.0", 5, 90'000);  // the first step: left out
  timeScope(rec, "M.blocks.0", 105, 2'500);
  timeScope(rec, "M.blocks.0", 205, 3'000);
  timeScope(rec, "M.blocks.0", 305, 1'000);
  timeScope(rec, "M.blocks.0", 405, 70'000);  // re-run in its step: no forward sample
  rerunIn(rec, 5, "M.blocks.0", 4'000);
  rerunIn(rec, 6, "M.blocks.0", 11'000);
  rerunIn(rec, 7, "M.blocks.0", 90'000);  // a stall: beyond 4x the median (11,000)
  const std::map<std::string, ModuleTimes> t =
      moduleTimesOverSteps(rec, {"M.blocks.0", "M.blocks.1", "M.nothing"});
  EXPECT_EQ(t.at("M.blocks.0").forwards, 3);  // steps 2, 3 and 4
  EXPECT_EQ(t.at("M.blocks.0").forwardNs, (2'500 + 3'000 + 1'000) / 3);
  EXPECT_EQ(t.at("M.blocks.0").reruns, 3);
  EXPECT_EQ(t.at("M.blocks.0").rerunNs, (4'000 + 11'000) / 2);
  EXPECT_EQ(t.at("M.blocks.1").forwards, 6);
  EXPECT_EQ(t.at("M.blocks.1").forwardNs, 1'000);
  EXPECT_EQ(t.at("M.blocks.1").reruns, 0);
  EXPECT_EQ(t.at("M.nothing").forwards, 0);
  EXPECT_EQ(t.at("M.nothing").forwardNs, -1);
  EXPECT_DOUBLE_EQ(rerunOverForward(t), 7'500.0 / 2'166.0);
  EXPECT_EQ(rerunOverForward(moduleTimesOverSteps(rec, {"M.blocks.1"})), 0.0);
  // One step only: it is the steady one.
  const Recording single = twoBlocks();
  EXPECT_EQ(moduleTimesOverSteps(single, {"M.blocks.0"}).at("M.blocks.0").forwardNs, 1'000);
}

// The chain's times: the stage's forward from every steady step, what a plan's re-run costs from
// the recording's own re-runs, and for a stage never re-run its forward times the recording's
// re-run/forward ratio; the plan's extra time follows.
TEST(ChainFromRecording, TimesComeFromEveryStepAndTheRecordedReruns) {
  Recording rec = twoBlocksSteps(4);
  timeScope(rec, "M.blocks.0", 105, 2'500);
  timeScope(rec, "M.blocks.0", 205, 3'000);
  timeScope(rec, "M.blocks.0", 305, 1'000);  // the modelled step (the last without re-runs)
  absl::StatusOr<RecordedChain> plain = chainFromRecording(rec, categorize(rec), 0, "");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->step, 4);
  EXPECT_EQ(plain->profile.stages[0].forwardNs, 2'166);  // the steps' mean, not step 4's 1,000
  EXPECT_EQ(plain->profile.stages[0].rerunNs, 0);        // no re-run recorded: its forward's
  EXPECT_EQ(plain->profile.stages[0].options[0].recomputeNs, 400);  // the child's, as recorded

  // Re-runs recorded in other trainings of the job (pooled): they time the re-runs; the sizes and
  // forwards stay the recording's.
  RerunSamples elsewhere;
  for (int64_t ns : {8'000, 10'000}) {
    Recording other = twoBlocksSteps(2);
    rerunIn(other, 2, "M.blocks.0", ns);
    addRecordedReruns(other, {}, &elsewhere);
  }
  ASSERT_EQ((elsewhere[{"M.blocks.0", ""}].size()), 2u);
  absl::StatusOr<RecordedChain> timed =
      chainFromRecording(rec, categorize(rec), 0, "", 0, &elsewhere);
  ASSERT_TRUE(timed.ok()) << timed.status();
  EXPECT_EQ(timed->profile.stages[0].forwardNs, 2'166);
  EXPECT_EQ(timed->profile.stages[0].rerunNs, 9'000);
  EXPECT_EQ(timed->profile.stages[1].rerunNs, 4'155);  // 1,000 x 9,000 / 2,166
  EXPECT_EQ(timed->profile.stages[0].savedBytes, plain->profile.stages[0].savedBytes);

  rerunIn(rec, 3, "M.blocks.1", 4'000);  // a plan re-ran block 1 in step 3: 4x its forward
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, categorize(rec), 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 4);
  const ChainProfile& p = c->profile;
  EXPECT_EQ(p.stages[1].forwardNs, 1'000);  // steps 2 and 4
  EXPECT_EQ(p.stages[1].rerunNs, 4'000);
  EXPECT_EQ(p.stages[0].forwardNs, 2'166);
  EXPECT_EQ(p.stages[0].rerunNs, 8'664);                   // 2,166 x 4
  EXPECT_EQ(p.stages[0].options[0].recomputeNs, 1'600);    // the child: 400 x 4
  EXPECT_EQ(p.baseStepNs(), plain->profile.baseStepNs());  // forwards and backwards unchanged
  const ChainPlan first{{{0, 0, SegmentMode::kRecompute}, {1, 1, SegmentMode::kStore}}};
  const ChainPlan second{{{0, 0, SegmentMode::kStore}, {1, 1, SegmentMode::kRecompute}}};
  EXPECT_EQ(simulate(p, first).extraNs, 8'664);
  EXPECT_EQ(simulate(p, second).extraNs, 4'000);
}

// The two blocks of twoBlocks() in two containers, as a ResNet keeps its blocks (layer1.0,
// layer2.0): called one after the other with nothing between them but the second container's
// entry, they are one chain, measured as the two blocks of one list are.
Recording blocksInTwoContainers(bool somethingBetween) {
  Recording r = twoBlocks();
  auto rename = [](std::string& name) {
    for (auto [from, to] : {std::pair<std::string, std::string>{"M.blocks.0", "M.layer1.0"},
                            {"M.blocks.1", "M.layer2.0"}})
      if (name.compare(0, from.size(), from) == 0) name = to + name.substr(from.size());
  };
  for (ScopeInterval& sc : r.scopes) {
    rename(sc.name);
    if (sc.name.compare(0, 8, "M.layer1") == 0 || sc.name.compare(0, 8, "M.layer2") == 0)
      sc.depth += sc.name.find("[backward]") == std::string::npos ? 1 : 0;
  }
  for (Tag& t : r.tags) rename(t.name);
  r.scopes.push_back(scope("M.layer1", 5, 15, 1));
  r.scopes.push_back(scope("M.layer2", 16, 26, 1));
  if (somethingBetween) {  // a module called before the blocks too (the second call counts)
    r.scopes.push_back(scope("M.norm", 3, 4, 1));
    r.scopes.push_back(scope("M.norm", 15, 16, 1));
  }
  r.sortBySeq();
  return r;
}

TEST(ChainFromRecording, BlocksOfSeveralContainersCalledInTurnAreOneChain) {
  const Recording one = twoBlocks();
  absl::StatusOr<RecordedChain> a = chainFromRecording(one, categorize(one), 0, "");
  ASSERT_TRUE(a.ok()) << a.status();
  const Recording rec = blocksInTwoContainers(false);
  const std::vector<BlockCategory> cats = categorize(rec);
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, cats, 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->blocksPrefix, "M.layer1,M.layer2");
  ASSERT_EQ(c->profile.size(), 2);
  EXPECT_EQ(c->profile.stages[0].name, "M.layer1.0");
  EXPECT_EQ(c->profile.stages[1].name, "M.layer2.0");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(c->profile.stages[i].savedBytes, a->profile.stages[i].savedBytes);
    EXPECT_EQ(c->profile.stages[i].outputBytes, a->profile.stages[i].outputBytes);
    EXPECT_EQ(c->profile.stages[i].forwardNs, a->profile.stages[i].forwardNs);
    EXPECT_EQ(c->profile.stages[i].backwardNs, a->profile.stages[i].backwardNs);
  }
  EXPECT_EQ(c->profile.staticBytes, a->profile.staticBytes);
  EXPECT_EQ(c->measuredPeakBytes, 2010);
  EXPECT_EQ(simulate(c->profile, c->recordedPlan).peakBytes, 2010);
  // Named as a list or a pattern: the same chain.
  for (const char* named : {"M.layer1, M.layer2", "M.layer*"}) {
    absl::StatusOr<RecordedChain> n = chainFromRecording(rec, cats, 0, named);
    ASSERT_TRUE(n.ok()) << named << ": " << n.status();
    EXPECT_EQ(n->blocksPrefix, "M.layer1,M.layer2") << named;
    EXPECT_EQ(n->profile.size(), 2) << named;
  }
  absl::StatusOr<RecordedChain> bad = chainFromRecording(rec, cats, 0, "M.layer1,M.stage*");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "no modules named M.stage*.<n> in step 1's forward (indexed modules: M.layer1, "
            "M.layer2)");
}

// A block called twice in the forward (a shared or siamese block) is modelled once; the chain
// says so, for its plans to carry.
TEST(ChainFromRecording, ABlockCalledTwiceInTheForwardIsSaid) {
  const Recording plain = twoBlocks();
  absl::StatusOr<RecordedChain> a = chainFromRecording(plain, categorize(plain), 0, "");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->warnings.empty());
  Recording rec = twoBlocks();
  rec.scopes.push_back(scope("M.blocks.1", 27, 28, 1));  // again, after its first call
  rec.sortBySeq();
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, categorize(rec), 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_EQ(c->warnings[0].rfind("blocks called more than once in one forward (M.blocks.1 (2) "
                                 "calls): the chain model takes each block once",
                                 0),
            0u)
      << c->warnings[0];
  EXPECT_EQ(c->profile.size(), 2);
}

// A tensor made between two blocks on the forward's thread (a pooling, a residual added outside
// the blocks) is the second block's input, not the first block's output: the second is not
// linked, and no recomputed segment runs from one into the other. Nothing made between them (or
// made by another thread): linked.
TEST(ChainFromRecording, ABlockWhoseInputIsMadeBetweenBlocksIsNotLinked) {
  const Recording plain = twoBlocks();
  absl::StatusOr<RecordedChain> a = chainFromRecording(plain, categorize(plain), 0, "");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->profile.stages[1].linked);
  for (const uint32_t thread : {0u, 7u}) {
    Recording rec = twoBlocks();
    Block pooled = block(0x3300, 80, 15, 50);  // after block 0's scope, before block 1's
    pooled.threadId = thread;
    rec.blocks.push_back(pooled);
    rec.sortBySeq();
    absl::StatusOr<RecordedChain> c = chainFromRecording(rec, categorize(rec), 0, "");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->profile.stages[1].linked, thread != 0) << thread;
    EXPECT_TRUE(c->profile.stages[0].linked);
    EXPECT_TRUE(validatePlan(c->profile, ChainPlan{{{0, 1, SegmentMode::kRecompute}}}).ok() ==
                (thread != 0));
  }
}

// Containers of one model with a module between them (a T5's encoder and decoder stacks, its
// final norm between) are one chain all the same; containers of two models (a GAN's generator and
// discriminator) with something between are not.
TEST(ChainFromRecording, ContainersOfOneModelWithAModuleBetweenThemAreOneChain) {
  const Recording rec = blocksInTwoContainers(true);
  const std::vector<BlockCategory> cats = categorize(rec);
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, cats, 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->blocksPrefix, "M.layer1,M.layer2");
  EXPECT_EQ(c->profile.size(), 2);
  Recording two = blocksInTwoContainers(true);
  for (ScopeInterval& sc : two.scopes)
    if (sc.name.compare(0, 8, "M.layer2") == 0) sc.name = "N" + sc.name.substr(1);
  for (Tag& t : two.tags)
    if (t.name.compare(0, 8, "M.layer2") == 0) t.name = "N" + t.name.substr(1);
  two.sortBySeq();
  c = chainFromRecording(two, categorize(two), 0, "");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no repeated blocks"), std::string::npos) << c.status();
  c = chainFromRecording(two, categorize(two), 0, "M.layer1,N.layer2");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->profile.size(), 2);
}

// An optimizer that makes its state at its first step (Adam's moments, 500 B, born in the
// optimizer phase) and gradients zero_grad keeps (200 B, born in backward) are there from the
// start of every later step: a plan made from the first step counts them as static; the step that
// made them peaked without them. Memory freed before the next step begins is not carried.
TEST(ChainFromRecording, WhatAFirstStepLeavesToTheNextIsStaticInTheModel) {
  const Recording plain = twoBlocks();
  auto withBlocks = [](std::vector<Block> extra, Category c) {
    Recording r = twoBlocks();
    for (const Block& b : extra) {
      r.blocks.push_back(b);
      r.tags.push_back(testing::tag(b.allocSeq + 1, b.address, c));
    }
    r.sortBySeq();
    return r;
  };
  absl::StatusOr<RecordedChain> a = chainFromRecording(plain, categorize(plain), 0, "");
  ASSERT_TRUE(a.ok());
  const Recording state = withBlocks({block(0x6000, 500, 62, kOpenSeq)}, Category::kOptimizerState);
  absl::StatusOr<RecordedChain> b = chainFromRecording(state, categorize(state), 0, "");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->profile.staticBytes, a->profile.staticBytes + 500);
  EXPECT_EQ(b->measuredPeakBytes, 2010);
  EXPECT_EQ(simulate(b->profile, b->recordedPlan).peakBytes, 2510);
  // Gradients still held when the next step begins (zero_grad keeps them) are carried; in the
  // last step recorded nothing tells whether a zero_grad would free them: not carried.
  Recording grads = withBlocks({block(0x7000, 200, 42, kOpenSeq)}, Category::kGradient);
  absl::StatusOr<RecordedChain> last = chainFromRecording(grads, categorize(grads), 0, "");
  ASSERT_TRUE(last.ok());
  StepInterval next = grads.steps.front();
  next.step = 2;
  next.beginSeq = 120;
  next.endSeq = 200;
  grads.steps.push_back(next);
  absl::StatusOr<RecordedChain> g = chainFromRecording(grads, categorize(grads), 1, "");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->profile.staticBytes, a->profile.staticBytes + 200);
  EXPECT_EQ(simulate(g->profile, g->recordedPlan).peakBytes, 2210);
  // Freed by a zero_grad before the next step began: not carried.
  for (Block& blk : grads.blocks)
    if (blk.address == 0x7000) blk.freeSeq = 110;
  absl::StatusOr<RecordedChain> freed = chainFromRecording(grads, categorize(grads), 1, "");
  ASSERT_TRUE(freed.ok());
  // Not carried, the gradient is memory outside the chain from its birth in backward on.
  EXPECT_EQ(freed->profile.staticBytes, last->profile.staticBytes);
  EXPECT_LT(last->profile.staticBytes, g->profile.staticBytes);
  // Freed within the step (the optimizer's scratch): nothing carried.
  const Recording scratch = withBlocks({block(0x6000, 500, 62, 68)}, Category::kOptimizerState);
  absl::StatusOr<RecordedChain> c = chainFromRecording(scratch, categorize(scratch), 0, "");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->profile.staticBytes, a->profile.staticBytes);
  EXPECT_EQ(simulate(c->profile, c->recordedPlan).peakBytes, 2010);
}

TEST(ChainFromRecording, SaysWhatIsMissing) {
  Recording rec = twoBlocks();
  const std::vector<BlockCategory> cats = categorize(rec);
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, cats, 0, "M.layers");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            "no modules named M.layers.<n> in step 1's forward (indexed modules: M.blocks)");
  c = chainFromRecording(rec, cats, 7, "");
  EXPECT_EQ(c.status().message(), "the session has no step 7");
  rec.phases.clear();
  c = chainFromRecording(rec, cats, 0, "");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no forward and backward phases"), std::string::npos);
}

// A capture schedule summarized the steps after the detailed one: they have marks and no phases.
// The advisor takes the last step recorded in detail, not the last step.
TEST(ChainFromRecording, TakesTheLastStepRecordedInDetail) {
  Recording rec = twoBlocks();
  for (int64_t n = 2; n <= 3; ++n) {
    StepInterval summarized;
    summarized.step = n;
    summarized.beginSeq = 100 + static_cast<uint64_t>(n) * 10;
    summarized.endSeq = summarized.beginSeq + 5;
    rec.steps.push_back(summarized);
  }
  rec.sortBySeq();
  const std::vector<BlockCategory> cats = categorize(rec);
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, cats, 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 1);
  // Asked for by number, a summarized step says what it lacks.
  c = chainFromRecording(rec, cats, 3, "");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("step 3 has no forward and backward"), std::string::npos);
}

// A model that checkpoints by itself recomputes in every step; a job that then ran a plan from
// step 2 on recomputes differently there. Asked for no step, the advisor models the last step
// before the plan, not the last step.
TEST(ChainFromRecording, AJobUnderAPlanIsModelledFromAStepBeforeIt) {
  Recording rec = twoBlocks();
  rec.phases.push_back(phase(Phase::kRecompute, 31, 33));  // the model's own checkpointing
  StepInterval planned;
  planned.step = 2;
  planned.beginSeq = 101;
  planned.endSeq = 200;
  rec.steps.push_back(planned);
  for (PhaseInterval p : {phase(Phase::kForward, 102, 129), phase(Phase::kBackward, 130, 160),
                          phase(Phase::kRecompute, 131, 133)})
    rec.phases.push_back(p);
  rec.sortBySeq();
  const std::vector<BlockCategory> cats = categorize(rec);
  absl::StatusOr<RecordedChain> last = chainFromRecording(rec, cats, 0, "");
  EXPECT_TRUE(!last.ok() || last->step == 2);  // recomputation in both: the last step
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, cats, 0, "", /*firstPlannedStep=*/2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 1);
  // No step before the plan recorded: the rule as without one.
  c = chainFromRecording(rec, cats, 0, "", /*firstPlannedStep=*/1);
  EXPECT_TRUE(!c.ok() || c->step == 2);
}

// The last block ran under checkpoint: at the start of the backward it is recomputed (a1' and
// its output regenerated) before its backward scope begins. That moment is the model's
// recomputation of the block, not the end of the forward: the memory outside the chain at the end
// of the forward must not take it in (it did, and every plan storing the last block was then
// predicted too high by the recomputation's bytes).
// twoBlocks(), with block 1 under checkpoint: its forward keeps nothing (a1 freed at 25, no
// saved tags), and the backward starts by recomputing it (seq 31-38: a1' and its output). With
// blockScope the re-run opens the block's own scope; without, its module's forward alone ran
// under the checkpoint (the call, and its hooks, outside: `transformers` layers since 5.0), and
// the recomputation holds its child and a module of no model, named by its class.
Recording secondBlockCheckpointed(bool blockScope) {
  Recording r = twoBlocks();
  for (Block& b : r.blocks)
    if (b.address == 0x4000) b.freeSeq = 25;
  r.blocks.push_back(block(0x6000, 300, 34, 45));
  r.blocks.push_back(block(0x6100, 100, 36, 38));
  r.tags.resize(2);  // block 0's
  Tag again = saved(34, 0x6000, "M.blocks.1.lin");
  again.category = Category::kRecomputed;
  r.tags.push_back(again);
  r.phases.push_back(phase(Phase::kRecompute, 31, 38));
  timePhasesAndStep(r);
  if (blockScope)
    r.scopes.push_back(scope("M.blocks.1", 32, 37, 1));
  else
    r.scopes.push_back(scope("Func", 36, 37, 1));
  r.scopes.push_back(scope("M.blocks.1.lin", 33, 36, blockScope ? 2 : 1));
  r.sortBySeq();
  return r;
}

TEST(ChainFromRecording, ABlockReRunWithoutItsOwnScopeIsRecomputed) {
  Recording r = secondBlockCheckpointed(false);
  absl::StatusOr<RecordedChain> c = chainFromRecording(r, categorize(r), 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(planSignature(c->recordedPlan), "S|R");
  EXPECT_EQ(c->profile.stages[1].savedBytes, 300);
  r.tags.pop_back();  // torch 2's non-reentrant checkpoint: no tag
  absl::StatusOr<RecordedChain> u = chainFromRecording(r, categorize(r), 0, "");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(planSignature(u->recordedPlan), "S|R");
  EXPECT_EQ(u->profile.stages[1].savedBytes, 300);
  // Where block 1's forward called a second child, a recomputation of `lin` alone is that
  // child's (a plan's selective option): the block is stored. One of both is the block's.
  Recording two = r;
  two.scopes.push_back(scope("M.blocks.1.act", 22, 25, 2));
  two.sortBySeq();
  absl::StatusOr<RecordedChain> child = chainFromRecording(two, categorize(two), 0, "");
  ASSERT_TRUE(child.ok()) << child.status();
  EXPECT_EQ(planSignature(child->recordedPlan), "S|S");
  two.scopes.push_back(scope("M.blocks.1.act", 36, 37, 1));
  two.sortBySeq();
  absl::StatusOr<RecordedChain> both = chainFromRecording(two, categorize(two), 0, "");
  ASSERT_TRUE(both.ok()) << both.status();
  EXPECT_EQ(planSignature(both->recordedPlan), "S|R");
  // A recomputation that holds scopes of two blocks is neither's alone.
  r.scopes.push_back(scope("M.blocks.0.lin", 36, 37, 1));
  r.sortBySeq();
  absl::StatusOr<RecordedChain> m = chainFromRecording(r, categorize(r), 0, "");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(planSignature(m->recordedPlan), "S|S");
}

TEST(ChainFromRecording, ANonReentrantRecomputationsBackwardIsMeasuredWithoutItsScope) {
  // torch 2's non-reentrant checkpoint keeps block 1's saved tensors from the adapter's hooks:
  // no tags, and no backward scope of block 1. Its backward is from its recomputation (seq 32)
  // until block 0's begins (50): measured as a scope over that stretch would be.
  Recording unscoped = secondBlockCheckpointed(true);
  unscoped.tags.pop_back();
  std::erase_if(unscoped.scopes,
                [](const ScopeInterval& s) { return s.name == "M.blocks.1.lin [backward]"; });
  Recording scoped = unscoped;
  scoped.scopes.push_back(scope("M.blocks.1.lin [backward]", 32, 50, 0));
  scoped.sortBySeq();
  absl::StatusOr<RecordedChain> a = chainFromRecording(scoped, categorize(scoped), 0, "");
  absl::StatusOr<RecordedChain> b = chainFromRecording(unscoped, categorize(unscoped), 0, "");
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(planSignature(b->recordedPlan), "S|R");
  EXPECT_GT(b->profile.staticBytes, 0);
  EXPECT_EQ(b->profile.staticBytes, a->profile.staticBytes);
  EXPECT_EQ(b->profile.stages[1].backwardWorkingBytes, a->profile.stages[1].backwardWorkingBytes);
  EXPECT_EQ(b->profile.stages[1].backwardOutsideBytes, a->profile.stages[1].backwardOutsideBytes);
  EXPECT_EQ(simulate(b->profile, b->recordedPlan).peakBytes,
            simulate(a->profile, a->recordedPlan).peakBytes);
}

TEST(ChainFromRecording, TheEndOfTheForwardStopsWhereARecomputationStarts) {
  Recording r = secondBlockCheckpointed(true);
  const std::vector<BlockCategory> cats = categorize(r);
  absl::StatusOr<RecordedChain> c = chainFromRecording(r, cats, 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(planSignature(c->recordedPlan), "S|R");
  const ChainProfile& p = c->profile;
  // From the end of the forward (seq 29) to the recomputation (seq 31): weights, x0, a0, the
  // blocks' outputs and the loss's 10 B = 1710; the model keeps x0 + a0 + block 1's input (600)
  // and twice the output (200); the rest is static or outside the chain.
  EXPECT_EQ(p.staticBytes + p.endOutsideBytes, 1710 - 600 - 200);
  EXPECT_EQ(p.stages[1].savedBytes, 300);  // a1', tagged as the recomputation saved it

  // torch 2's non-reentrant checkpoint keeps what the recomputation saves from the hooks in
  // scope: no tag. What it made that lives into the block's backward is what it kept (a1'; its
  // output is freed before).
  r.tags.pop_back();
  const std::vector<BlockCategory> untagged = categorize(r);
  absl::StatusOr<RecordedChain> u = chainFromRecording(r, untagged, 0, "");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(planSignature(u->recordedPlan), "S|R");
  EXPECT_EQ(u->profile.stages[1].savedBytes, 300);
}

TEST(ChainFromRecording, TheHeadAfterTheChainIsInTheEndOfTheForward) {
  // A head after the last block (its logits, 500 B) lives from seq 27 to 28, before the forward
  // phase ends (29): the step's peak. The end of the forward begins where the last block's
  // forward ends (26).
  Recording r = twoBlocks();
  r.blocks.push_back(block(0x4400, 500, 27, 28));
  r.sortBySeq();
  absl::StatusOr<RecordedChain> c = chainFromRecording(r, categorize(r), 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->measuredPeakBytes, 1000 + 100 + 400 + 100 + 300 + 100 + 10 + 500);
  EXPECT_EQ(simulate(c->profile, c->recordedPlan).peakBytes, c->measuredPeakBytes);
}

TEST(ChainFromRecording, ACheckpointedForwardsWorkingIsATermOfItsOwn) {
  // Block 1 ran under a checkpoint: its forward kept nothing, a temporary of 150 B its working
  // there; its re-run kept a1' (300). A stored run's working is the re-run's; the checkpointed
  // one the forward's.
  Recording r = secondBlockCheckpointed(true);
  for (Block& b : r.blocks)
    if (b.address == 0x4000) b.sizeBytes = 150;
  absl::StatusOr<RecordedChain> c = chainFromRecording(r, categorize(r), 0, "");
  ASSERT_TRUE(c.ok()) << c.status();
  const Stage& s = c->profile.stages[1];
  EXPECT_EQ(s.forwardWorkingBytes, 300);
  EXPECT_EQ(s.checkpointedForwardWorkingBytes, 150);
  EXPECT_EQ(simulate(c->profile, c->recordedPlan).peakBytes, c->measuredPeakBytes);
}

// Both blocks run under one checkpoint of the job's (checkpoint_sequential): the forward keeps
// only their outputs (o0 100, o1 100; a0 400 and a1 300 are freed at once), and the backward
// re-runs them together (seq 31-44): block 0 (its child `lin` first) saves a0' (400) and its
// output made again, o0' (100), which its last op and block 1 save; block 1 saves a1' (300) and
// o1' (100). torch stops the recomputation there: a temporary of block 1's last op (50) is
// freed as that unwinds (seq 45), before the backward allocates its first gradient (47).
// tagged: torch 1.13's reentrant checkpoint (the adapter's hooks tag what is saved; backward
// scopes); else torch 2's non-reentrant one (neither).
Recording twoBlocksRecomputedTogether(bool tagged) {
  Recording r;
  r.blocks = {
      block(0x1000, 1000, 1, kOpenSeq), block(0x2000, 100, 3, 60),  block(0x3000, 400, 7, 12),
      block(0x3200, 100, 13, 20),       block(0x4000, 300, 18, 22), block(0x4200, 100, 24, 40),
      block(0x4300, 10, 27, 36),        block(0x6000, 400, 33, 55), block(0x6100, 100, 36, 50),
      block(0x6200, 300, 39, 48),       block(0x6400, 50, 41, 45),  block(0x6300, 100, 42, 46),
      block(0x7000, 100, 47, 52)};
  if (tagged) {
    for (auto [seq, address, module] :
         std::initializer_list<std::tuple<int, int, const char*>>{{34, 0x6000, "M.blocks.0.lin"},
                                                                  {36, 0x6100, "M.blocks.0"},
                                                                  {39, 0x6100, "M.blocks.1"},
                                                                  {40, 0x6200, "M.blocks.1"},
                                                                  {42, 0x6300, "M.blocks.1"}}) {
      Tag t = saved(static_cast<uint64_t>(seq), static_cast<uint64_t>(address), module);
      t.category = Category::kRecomputed;
      r.tags.push_back(t);
    }
  }
  r.phases = {phase(Phase::kForward, 2, 29), phase(Phase::kBackward, 30, 60),
              phase(Phase::kRecompute, 31, 44), phase(Phase::kOptimizer, 60, 70)};
  timePhasesAndStep(r);
  r.scopes = {scope("M", 2, 29, 0),
              scope("M.blocks.0", 5, 15, 1),
              scope("M.blocks.0.lin", 6, 10, 2),
              scope("M.blocks.1", 16, 26, 1),
              scope("M.blocks.0", 32, 38, 1),
              scope("M.blocks.0.lin", 33, 35, 2),
              scope("M.blocks.1", 38, 44, 1)};
  if (tagged) {
    r.scopes.push_back(scope("M.blocks.1 [backward]", 44, 49, 0));
    r.scopes.push_back(scope("M.blocks.0 [backward]", 49, 56, 0));
  }
  r.sortBySeq();
  return r;
}

TEST(ChainFromRecording, BlocksReRunTogetherKeepWhatEachSavedLessTheOutputsMadeAgain) {
  ChainProfile scoped;
  for (bool tagged : {true, false}) {
    SCOPED_TRACE(tagged ? "tagged, with backward scopes" : "untagged, no backward scopes");
    const Recording r = twoBlocksRecomputedTogether(tagged);
    absl::StatusOr<RecordedChain> c = chainFromRecording(r, categorize(r), 0, "");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(planSignature(c->recordedPlan), "RR");
    const ChainProfile& p = c->profile;
    // What each block keeps stored, as a recording of the blocks stored would say: o0' and o1'
    // are the blocks' outputs (counted as such), the unwinding's temporary nothing.
    EXPECT_EQ(p.stages[0].savedBytes, 400);
    EXPECT_EQ(p.stages[1].savedBytes, 300);
    EXPECT_EQ(p.stages[0].outputBytes, 100);
    EXPECT_EQ(p.stages[1].outputBytes, 100);
    // Each block's backward is its own (untagged: from the recomputation's end until the last
    // of what block 1 kept is freed, then until block 0's is): what lies outside the chain
    // there is what the scopes show, not the other block's activations.
    EXPECT_EQ(simulate(p, c->recordedPlan).peakBytes, c->measuredPeakBytes);
    if (tagged) {
      scoped = p;
    } else {
      EXPECT_EQ(p.staticBytes, scoped.staticBytes);
      for (int i : {0, 1}) {
        EXPECT_EQ(p.stages[i].backwardOutsideBytes, scoped.stages[i].backwardOutsideBytes) << i;
        EXPECT_EQ(p.stages[i].backwardWorkingBytes, scoped.stages[i].backwardWorkingBytes) << i;
      }
    }
    // Who saved what is known from the tags only: `lin` alone saved a0', a selective option of
    // block 0; untagged, none is made up.
    EXPECT_EQ(p.stages[0].options.size(), tagged ? 1u : 0u);
  }
}

// Block 0 has two children: `a` saves A (300; a temporary of 50 beside it), then `b` saves B
// (400). The backward runs b's first (B freed at 50), then a's (A freed at 55), with two
// activation gradients (100 each) born on the way. Block 1 saves 200 and block 0's output.
Recording blockWithTwoChildren() {
  Recording r;
  r.blocks = {block(0x1000, 1000, 1, kOpenSeq), block(0x2000, 100, 2, 58),    // weights, x0
              block(0x3000, 300, 5, 55),        block(0x3100, 50, 6, 8),      // A, temporary
              block(0x3200, 400, 11, 50),       block(0x3300, 100, 19, 56),   // B, output o0
              block(0x4000, 200, 22, 40),       block(0x4100, 100, 25, 36),   // block 1: s1, o1
              block(0x5000, 100, 47, 54),       block(0x5100, 100, 53, 59)};  // gradients
  r.tags = {saved(3, 0x2000, "M.blocks.0.a"), saved(5, 0x3000, "M.blocks.0.a"),
            saved(11, 0x3200, "M.blocks.0.b"), saved(21, 0x3300, "M.blocks.1"),
            saved(22, 0x4000, "M.blocks.1")};
  r.phases = {phase(Phase::kForward, 2, 30), phase(Phase::kBackward, 31, 60),
              phase(Phase::kOptimizer, 61, 70)};
  timePhasesAndStep(r);
  r.scopes = {scope("M", 2, 29, 0),
              scope("M.blocks.0", 3, 20, 1),
              scope("M.blocks.0.a", 4, 9, 2),
              scope("M.blocks.0.b", 10, 18, 2),
              scope("M.blocks.1", 21, 28, 1),
              scope("M.blocks.1 [backward]", 38, 42, 0),
              scope("M.blocks.0.b [backward]", 44, 51, 0),
              scope("M.blocks.0.a [backward]", 52, 57, 0)};
  r.sortBySeq();
  return r;
}

TEST(ChainFromRecording, SelectiveOptionsMeasureWhenTheChildRegenerates) {
  const Recording rec = blockWithTwoChildren();
  absl::StatusOr<RecordedChain> c = chainFromRecording(rec, categorize(rec), 0, "M.blocks");
  ASSERT_TRUE(c.ok()) << c.status();
  const Stage& s = c->profile.stages[0];
  EXPECT_EQ(s.savedBytes, 700);
  // Forward: A, B and the output at once (800), less the output. Backward: both gradients at
  // once (200), less the input's.
  EXPECT_EQ(s.forwardWorkingBytes, 700);
  EXPECT_EQ(s.backwardWorkingBytes, 100);
  ASSERT_EQ(s.options.size(), 2u);
  const StageOption& a = s.options[0];
  const StageOption& b = s.options[1];
  ASSERT_EQ(a.name, "recompute a");
  ASSERT_EQ(b.name, "recompute b");
  EXPECT_EQ(a.savedBytes, 400);
  EXPECT_EQ(b.savedBytes, 300);
  // Without A, the forward holds at most B and the output (500): 300 less. Without B (freed when
  // b ends, at 18), A and B together (700) stay the most: 100 less than 800.
  EXPECT_EQ(a.forwardWorkingBytes, 400);
  EXPECT_EQ(b.forwardWorkingBytes, 600);
  // The recorded backward holds 800 at most (A, B, a gradient). Recomputing a, A comes back only
  // at a's backward, after B is freed: at most 500 (a's forward re-run on top of B's gradient,
  // 100 + 350; then A and both gradients). The option's transient on top of the 400 it keeps is
  // 100 + 300 - (800 - 500). Recomputing b regenerates B as b's backward begins, first: 100 + 400.
  EXPECT_EQ(a.backwardWorkingBytes, 100);
  EXPECT_EQ(b.backwardWorkingBytes, 500);
  EXPECT_EQ(optionBackwardWorkingBytes(s, b), s.backwardWorkingBytes + s.savedBytes - b.savedBytes);
}

ScopeInterval op(std::string name, uint64_t begin, uint64_t end, uint32_t thread = 0) {
  ScopeInterval o = scope(std::move(name), begin, end, 0);
  o.isOp = true;
  o.threadId = thread;
  return o;
}

// The chain of blockWithTwoChildren() recorded with these op scopes.
absl::StatusOr<RecordedChain> chainWithOps(std::vector<ScopeInterval> ops) {
  Recording rec = blockWithTwoChildren();
  rec.ops = std::move(ops);
  rec.sortBySeq();
  return chainFromRecording(rec, categorize(rec), 0, "M.blocks");
}

TEST(ChainFromRecording, AnOpLevelOptionKeepsTheOutputsOfTheMatrixProducts) {
  // Inside a's aten::matmul (not kept itself), an aten::mm makes A (300, alive after it); b's
  // work is an aten::gelu (not kept), and an aten::addmm on another thread is another block's.
  absl::StatusOr<RecordedChain> c =
      chainWithOps({op("aten::matmul", 4, 9), op("aten::mm", 5, 6), op("aten::gelu", 10, 18),
                    op("aten::addmm", 10, 18, 7)});
  ASSERT_TRUE(c.ok()) << c.status();
  const Stage& s = c->profile.stages[0];
  ASSERT_EQ(s.options.size(), 3u);
  const StageOption& o = s.options[2];
  EXPECT_EQ(o.name, "keep matmul outputs");
  EXPECT_EQ(o.policy, kSavePolicyMatmul);
  EXPECT_TRUE(o.recompute.empty());
  EXPECT_EQ(o.savedBytes, 300);  // A; B and the temporary are re-made
  // The block's forward (1,700 ns) less the kept op's (100 ns).
  EXPECT_EQ(o.recomputeNs, 1600);
  // Its transients are the model's: the stage's forward; everything re-made at the start of the
  // backward.
  EXPECT_EQ(optionForwardWorkingBytes(s, o), s.forwardWorkingBytes);
  EXPECT_EQ(optionBackwardWorkingBytes(s, o), s.backwardWorkingBytes + s.savedBytes - 300);
  // A block whose kept ops make (nearly) all it saves has no such option.
  c = chainWithOps({op("aten::mm", 4, 19)});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->profile.stages[0].options.size(), 2u);
}

TEST(ChainFromRecording, OpLevelOptionsKeepSomeCallsMostTimePerByteFirst) {
  // Three calls in block 0: an aten::mm making A (300 bytes, 100 ns), an aten::addmm making B
  // (400 bytes, 100 ns: less time per byte) and a second aten::mm that keeps nothing (400 ns).
  absl::StatusOr<RecordedChain> c =
      chainWithOps({op("aten::mm", 5, 6), op("aten::addmm", 11, 12), op("aten::mm", 13, 17)});
  ASSERT_TRUE(c.ok()) << c.status();
  const Stage& s = c->profile.stages[0];
  // Keeping every call keeps all the stage saves (700): no "keep matmul outputs". Keeping some:
  // the free call and the one with most time per byte (A's), named by op and occurrence in the
  // forward's order; the forward (1,700 ns) re-runs less their 500 ns.
  ASSERT_EQ(s.options.size(), 3u);
  const StageOption& o = s.options[2];
  EXPECT_EQ(o.name, "keep 2 of 3 matmul outputs");
  EXPECT_EQ(o.policy, "matmul:mm#0,mm#1");
  EXPECT_TRUE(isSavePolicy(o.policy));
  EXPECT_EQ(o.savedBytes, 300);
  EXPECT_EQ(o.recomputeNs, 1200);
  EXPECT_TRUE(validateProfile(c->profile).ok());
  // B made slower (400 ns: more time per byte than A's): it goes first instead.
  c = chainWithOps({op("aten::mm", 5, 6), op("aten::addmm", 11, 15), op("aten::mm", 15, 17)});
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->profile.stages[0].options.size(), 3u);
  EXPECT_EQ(c->profile.stages[0].options[2].policy, "matmul:addmm#0,mm#1");
  EXPECT_EQ(c->profile.stages[0].options[2].savedBytes, 400);
}

// Re-runs under an op-level policy (a plan's selective option) time that option, not the whole
// block: the option costs its recorded re-runs, and another block's op-level option its share of
// that block's re-run plus the correction the recorded ones showed, relative to their block's.
TEST(ChainFromRecording, OpLevelReRunsTimeTheirOptionsNotTheBlock) {
  const std::string policy = "matmul:mm#0,mm#1";
  PlannedPolicies planned;
  planned.fromStep = {{2, {{"M.blocks.0", policy}}}, {4, {}}};
  EXPECT_EQ(planned.at(1, "M.blocks.0"), "");  // before the plan
  EXPECT_EQ(planned.at(2, "M.blocks.0"), policy);
  EXPECT_EQ(planned.at(3, "M.blocks.0"), policy);
  EXPECT_EQ(planned.at(3, "M.blocks.1"), "");
  EXPECT_EQ(planned.at(3, "M.blocks.0.lin"), policy);  // a module inside it
  EXPECT_EQ(planned.at(3, "M.blocks.01"), "");
  EXPECT_EQ(planned.at(4, "M.blocks.0"), "");  // a later plan without it

  RerunSamples elsewhere;
  Recording other = twoBlocksSteps(4);
  rerunIn(other, 3, "M.blocks.0", 5'000);  // under the policy
  rerunIn(other, 4, "M.blocks.0", 9'000);  // a whole re-run (the later plan)
  addRecordedReruns(other, planned, &elsewhere);
  ASSERT_EQ((elsewhere[{"M.blocks.0", policy}]), std::vector<int64_t>{5'000});
  ASSERT_EQ((elsewhere[{"M.blocks.0", ""}]), std::vector<int64_t>{9'000});
  elsewhere.erase({"M.blocks.0", ""});

  // Block 0's calls as in OpLevelOptionsKeepSomeCallsMostTimePerByteFirst ("keep 2 of 3", 1,200
  // ns of its 1,700); block 1 (700 ns) an aten::mm of 100 ns making 100 of the 300 bytes it
  // saves ("keep matmul outputs", 600 ns).
  Recording rec = blockWithTwoChildren();
  rec.blocks.push_back(block(0x4200, 100, 23, 39));
  rec.tags.push_back(saved(23, 0x4200, "M.blocks.1"));
  rec.ops = {op("aten::mm", 5, 6), op("aten::addmm", 11, 12), op("aten::mm", 13, 17),
             op("aten::mm", 23, 24)};
  rec.sortBySeq();
  absl::StatusOr<RecordedChain> plain = chainFromRecording(rec, categorize(rec), 0, "M.blocks");
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_EQ(plain->profile.stages[0].options.back().policy, policy);
  ASSERT_EQ(plain->profile.stages[0].options.back().recomputeNs, 1'200);
  ASSERT_FALSE(plain->profile.stages[1].options.empty());
  ASSERT_EQ(plain->profile.stages[1].options.back().policy, kSavePolicyMatmul);
  ASSERT_EQ(plain->profile.stages[1].options.back().recomputeNs, 600);

  absl::StatusOr<RecordedChain> c =
      chainFromRecording(rec, categorize(rec), 0, "M.blocks", 0, &elsewhere);
  ASSERT_TRUE(c.ok()) << c.status();
  const ChainProfile& p = c->profile;
  EXPECT_EQ(p.stages[0].options.back().recomputeNs, 5'000);  // as recorded
  EXPECT_EQ(p.stages[0].rerunNs, 0);  // no whole re-run recorded: not the policy's 5,000
  EXPECT_EQ(p.stages[0].options[0].recomputeNs, plain->profile.stages[0].options[0].recomputeNs);
  // Block 0's correction, 5,000 - 1,200, is 3,800 / 1,700 of its re-run: block 1's option costs
  // 600 + 700 x 3,800 / 1,700 = 2,164.7.
  EXPECT_EQ(p.stages[1].options.back().recomputeNs, 2'165);
  EXPECT_EQ(p.stages[1].rerunNs, 0);

  // Whole re-runs known (block 1's, twice its forward: block 0's re-run is taken as twice its
  // forward too) and no op-level one: an op-level option is its share of the block's forward
  // (the op observer's work in a recorded forward stands for selective checkpointing's in a
  // re-run), where a child option follows the re-runs.
  RerunSamples whole;
  Recording wholeRun = twoBlocksSteps(2);
  rerunIn(wholeRun, 2, "M.blocks.1", 1'400);
  addRecordedReruns(wholeRun, {}, &whole);
  c = chainFromRecording(rec, categorize(rec), 0, "M.blocks", 0, &whole);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->profile.stages[1].rerunNs, 1'400);
  EXPECT_EQ(c->profile.stages[0].rerunNs, 3'400);
  EXPECT_EQ(c->profile.stages[0].options.back().recomputeNs, 1'200);
  EXPECT_EQ(c->profile.stages[1].options.back().recomputeNs, 600);
  EXPECT_EQ(c->profile.stages[0].options[0].recomputeNs,
            2 * plain->profile.stages[0].options[0].recomputeNs);

  // The recording's own steps under the plan: the same, from its own re-runs.
  Recording own = twoBlocksSteps(4);
  rerunIn(own, 3, "M.blocks.0", 5'000);
  const std::map<std::string, ModuleTimes> t =
      moduleTimesOverSteps(own, {"M.blocks.0"}, nullptr, &planned);
  EXPECT_EQ(t.at("M.blocks.0").reruns, 0);
  EXPECT_EQ(t.at("M.blocks.0").policyRerunNs, (std::map<std::string, int64_t>{{policy, 5'000}}));
  EXPECT_EQ(moduleTimesOverSteps(own, {"M.blocks.0"}).at("M.blocks.0").rerunNs, 5'000);
}

}  // namespace
}  // namespace tidemark::core
