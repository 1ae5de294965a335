// The GUI's logic without widgets: the fixed colours, the view range's zoom and pan, and the
// stacking of the server's buckets.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "gui/model/axis_ticks.h"
#include "gui/model/category_colors.h"
#include "gui/model/format.h"
#include "gui/model/icicle.h"
#include "gui/model/job_rows.h"
#include "gui/model/lanes.h"
#include "gui/model/stacked_timeline.h"
#include "gui/model/step_compare.h"
#include "gui/model/view_range.h"

namespace tidemark::gui {
namespace {

// A bucket of the server's timeline over [from, to] whose total is at most `highest`.
TimelineBucket bucket(int64_t from, int64_t to, int64_t highest) {
  TimelineBucket b;
  b.startNs = from;
  b.endNs = to;
  b.maxBytes[0] = highest;
  return b;
}

TEST(JobRows, RanksShareOneRealtimeAxisAndOneHeight) {
  // Two ranks whose monotonic clocks differ (two hosts): put on the realtime clock by their
  // starts, rank 1 began 2 s after rank 0 and its curve lies 2 s later.
  const RankCurve r0 =
      rankCurve(7, 1'000, 50'000, {bucket(1'000, 2'000, 10), bucket(2'000, 3'000, 30)});
  const RankCurve r1 = rankCurve(8, 900'000, 52'000, {bucket(900'000, 901'000, 50)});
  ASSERT_EQ(r0.points.size(), 2u);
  using Point = std::pair<int64_t, int64_t>;
  EXPECT_EQ(r0.points[0], Point(50'500, 10));  // at its bucket's middle
  EXPECT_EQ(r0.points[1], Point(51'500, 30));
  EXPECT_EQ(r1.points[0], Point(52'500, 50));
  EXPECT_EQ(r0.peak(), 30);
  const JobAxis axis = jobAxis({r0, r1});
  EXPECT_EQ(axis.fromWallNs, 50'500);
  EXPECT_EQ(axis.toWallNs, 52'500);
  EXPECT_EQ(axis.maxBytes, 50);
  // Nothing recorded: an axis of one nanosecond, never a division by zero.
  const JobAxis empty = jobAxis({});
  EXPECT_EQ(empty.toWallNs - empty.fromWallNs, 1);
}

TEST(CategoryColors, DistinctAndNotThePeakMarker) {
  std::set<std::tuple<int, int, int>> seen;
  for (const Rgb& c : categoryColors()) {
    EXPECT_TRUE(seen.insert({c.r, c.g, c.b}).second);
    EXPECT_FALSE(c == kPeakMarker);
  }
  EXPECT_EQ(categoryLabel(0), "WEIGHT");
  EXPECT_EQ(categoryLabel(kCategories - 1), "UNKNOWN");
}

TEST(CategoryColors, TextVersionsReadOnWhite) {
  // UNKNOWN's grey was 1.5:1 against white; every text colour reaches 4.5:1, keeping its hue.
  EXPECT_LT(contrastWithWhite(categoryColors()[kCategories - 1]), 2.0);
  for (const Rgb& c : categoryColors()) {
    const Rgb t = readableOnWhite(c);
    EXPECT_GE(contrastWithWhite(t), 4.5);
    EXPECT_LE(t.r, c.r);
    EXPECT_LE(t.g, c.g);
    EXPECT_LE(t.b, c.b);
  }
  const Rgb dark{20, 20, 20};
  EXPECT_EQ(readableOnWhite(dark), dark);  // already readable: unchanged
}

TEST(ViewRange, ZoomKeepsTheAnchorAndStaysInside) {
  ViewRange v;
  v.setLimits(1000, 101000);  // 100 µs
  v.reset();
  EXPECT_FALSE(v.zoomed());
  v.zoom(0.5, 51000);  // about the middle
  EXPECT_EQ(v.from(), 26000);
  EXPECT_EQ(v.to(), 76000);
  EXPECT_TRUE(v.zoomed());
  // The anchor stays at the same place on screen.
  const double before = v.xOf(40000, 1000);
  v.zoom(0.5, 40000);
  EXPECT_NEAR(v.xOf(40000, 1000), before, 1e-6);
  v.pan(-1'000'000);  // far past the start: clamped
  EXPECT_EQ(v.from(), 1000);
  v.zoom(100, 0);  // far out: the whole recording
  EXPECT_EQ(v.from(), 1000);
  EXPECT_EQ(v.to(), 101000);
  v.zoom(1e-9, 5000);  // never narrower than the minimum
  EXPECT_EQ(v.span(), ViewRange::kMinSpanNs);
  EXPECT_EQ(v.timeAt(0, 100), v.from());
  EXPECT_EQ(v.timeAt(100, 100), v.to());
}

TEST(StackedTimeline, CategoriesStackAndTheEnvelopeKeepsPeaks) {
  TimelineBucket a;
  a.startNs = 0;
  a.endNs = 10;
  a.lastBytes = {30, 10, 0, 0, 20};  // total, WEIGHT, GRADIENT, OPTIMIZER_STATE, ACTIVATION
  a.maxBytes = {50, 10, 0, 0, 40};   // a peak of 50 inside the bucket
  TimelineBucket b = a;
  b.startNs = 10;
  b.endNs = 20;
  b.maxBytes[0] = 30;
  const StackedTimeline t = StackedTimeline::build({a, b});
  ASSERT_EQ(t.stack.size(), 2u);
  EXPECT_EQ(t.stack[0][0], 0);
  EXPECT_EQ(t.stack[0][1], 10);  // WEIGHT at the bottom
  EXPECT_EQ(t.stack[0][4], 30);  // + ACTIVATION
  EXPECT_EQ(t.stack[0][kCategories], 30);
  EXPECT_EQ(t.envelope[0], 50);
  EXPECT_EQ(t.envelope[1], 30);
  EXPECT_EQ(t.yMax, 50);
  EXPECT_EQ(t.bucketAt(5), 0);
  EXPECT_EQ(t.bucketAt(15), 1);
  EXPECT_EQ(t.bucketAt(25), -1);
}

std::vector<std::string> labels(const std::vector<Tick>& ticks) {
  std::vector<std::string> out;
  for (const Tick& t : ticks) out.push_back(t.label);
  return out;
}

TEST(AxisTicks, BytesAreRoundInTheirUnit) {
  // 83.64 MiB with 5 ticks at most: 0, 20, 40, 60, 80 MiB (not 20.91, 41.82, ...).
  const int64_t mib = int64_t{1} << 20;
  EXPECT_EQ(labels(byteTicks(static_cast<int64_t>(83.64 * mib), 5)),
            (std::vector<std::string>{"0 B", "20 MiB", "40 MiB", "60 MiB", "80 MiB"}));
  EXPECT_EQ(byteTicks(static_cast<int64_t>(83.64 * mib), 5)[1].value, 20 * mib);
  // 665.58 MiB: 0, 200, 400, 600 MiB.
  EXPECT_EQ(labels(byteTicks(static_cast<int64_t>(665.58 * mib), 5)),
            (std::vector<std::string>{"0 B", "200 MiB", "400 MiB", "600 MiB"}));
  // Just over a GiB: in MiB below it.
  EXPECT_EQ(labels(byteTicks(int64_t{1} << 30 | mib, 4)),
            (std::vector<std::string>{"0 B", "500 MiB", "1000 MiB"}));
  EXPECT_EQ(labels(byteTicks(6 * (int64_t{1} << 30) + mib, 5)),
            (std::vector<std::string>{"0 B", "2 GiB", "4 GiB", "6 GiB"}));
  EXPECT_EQ(labels(byteTicks(3000, 4)), (std::vector<std::string>{"0 B", "1 KiB", "2 KiB"}));
  EXPECT_EQ(labels(byteTicks(0, 5)), (std::vector<std::string>{"0 B"}));
  // An axis from 40 to 84 MiB (a Pareto curve's budgets): 40, 50, ..., 80 MiB.
  EXPECT_EQ(labels(byteTicks(40 * mib, 84 * mib, 5)),
            (std::vector<std::string>{"40 MiB", "50 MiB", "60 MiB", "70 MiB", "80 MiB"}));
}

TEST(AxisTicks, TimeIsRoundInTheUnitOfItsStep) {
  EXPECT_EQ(labels(timeTicks(0, 168'000'000, 5)),
            (std::vector<std::string>{"0 ms", "50 ms", "100 ms", "150 ms"}));
  // A zoomed range starts at its first round value.
  EXPECT_EQ(labels(timeTicks(1'234'000, 1'900'000, 4)),
            (std::vector<std::string>{"1.4 ms", "1.6 ms", "1.8 ms"}));
  EXPECT_EQ(labels(timeTicks(0, 12'000'000'000, 7)),
            (std::vector<std::string>{"0 s", "2 s", "4 s", "6 s", "8 s", "10 s", "12 s"}));
  EXPECT_TRUE(timeTicks(5, 5, 4).empty());
}

TEST(Format, HumanBytes) {
  EXPECT_EQ(humanBytes(512), "512 B");
  EXPECT_EQ(humanBytes(66941337), "63.84 MiB");
  EXPECT_EQ(humanBytes(int64_t{3} << 30), "3.00 GiB");
}

TEST(Format, AnAppliedPlansNoteIsWhatTheJobSaidBesideApplied) {
  EXPECT_EQ(appliedPlanNote("applied"), "");
  EXPECT_EQ(appliedPlanNote(""), "");
  EXPECT_EQ(appliedPlanNote("applied; but in step 31 its forward took another path"),
            "in step 31 its forward took another path");
  EXPECT_EQ(appliedPlanNote("something else"), "something else");
}

TEST(Lanes, OutermostModulesBelowTheModelOutermostOpsAndKernels) {
  using K = LaneSpan::Kind;
  const std::vector<LaneSpan> spans = {{K::kModule, "M", 0, 0, 100},
                                       {K::kModule, "M.blocks.0", 1, 0, 40},
                                       {K::kModule, "M.blocks.0.mlp", 2, 10, 30},
                                       {K::kModule, "M.blocks.1", 1, 50, 90},
                                       {K::kModule, "M.blocks.1 [backward]", 0, 95, 99},
                                       {K::kOp, "aten::linear", 0, 10, 20},
                                       {K::kOp, "aten::addmm", 1, 11, 19},
                                       {K::kKernel, "gemm", 0, 12, 18}};
  const Lanes l = layoutLanes(spans);
  ASSERT_EQ(l.modules.size(), 3u);  // the two blocks and the backward scope
  EXPECT_EQ(l.modules[0].name, "M.blocks.0");
  EXPECT_EQ(l.modules[2].name, "M.blocks.1 [backward]");
  ASSERT_EQ(l.ops.size(), 1u);
  EXPECT_EQ(l.ops[0].name, "aten::linear");
  EXPECT_EQ(l.kernels.size(), 1u);
  EXPECT_EQ(l.count(), 3);
  EXPECT_TRUE(layoutLanes({}).empty());
}

TEST(StepCompare, CurvesStartAtTheirStepAndKeepTheirPeaks) {
  // Step 3 ran 1000..1300, step 7 ran 5000..5200 (buckets may begin before the step).
  const StepCurve a = stepCurve(3, 1000,
                                {bucket(900, 1000, 99), bucket(990, 1100, 40),
                                 bucket(1100, 1200, 70), bucket(1200, 1300, 50)});
  const StepCurve b = stepCurve(7, 5000, {bucket(5000, 5100, 60), bucket(5100, 5200, 90)});
  ASSERT_EQ(a.fromNs.size(), 3u);  // the bucket ending at the step's start is not in it
  EXPECT_EQ(a.fromNs[0], 0);       // clipped to the step's start
  EXPECT_EQ(a.toNs[2], 300);
  EXPECT_EQ(a.peak(), 70);
  std::array<int64_t, kCategories> pa{}, pb{};
  pa[0] = 30, pa[2] = 0;
  pb[0] = 30, pb[2] = 25;  // the optimizer state appeared
  const StepComparison c = compareSteps(a, pa, b, pb);
  EXPECT_EQ(c.spanNs, 300);
  EXPECT_EQ(c.yMax, 90);
  EXPECT_EQ(c.change(0), 0);
  EXPECT_EQ(c.change(2), 25);
  EXPECT_EQ(c.b.step, 7);
}

TEST(StepCompare, DefaultIsFirstAgainstLastFinishedStep) {
  EXPECT_FALSE(defaultComparison({}));
  EXPECT_FALSE(defaultComparison({{0, 10}, {10, 0}}));  // one finished, one running
  const auto pair = defaultComparison({{0, 0}, {5, 10}, {10, 20}, {20, 30}, {30, 0}});
  ASSERT_TRUE(pair);
  EXPECT_EQ(pair->first, 1u);
  EXPECT_EQ(pair->second, 3u);
}

// The icicle of a moment: a module as wide as what it and its children hold, children under it
// largest first, what it holds itself the part no child covers, memory outside the listed
// modules left blank at the top.
TEST(Icicle, ModulesNestByTheirNamesAndSpanTheirBytes) {
  const std::vector<IcicleModule> modules = {{"GPT.blocks.0.attn", "ACTIVATION", 300},
                                             {"GPT.blocks.0.mlp", "ACTIVATION", 100},
                                             {"GPT.blocks.1", "ACTIVATION", 500},
                                             {"GPT", "WEIGHT", 100},
                                             {"(no module)", "UNKNOWN", 0},
                                             {"loss", "TEMPORARY", 50}};
  const std::vector<IcicleCell> cells = icicleLayout(modules, 2000);
  auto find = [&](const std::string& path) -> const IcicleCell& {
    for (const IcicleCell& c : cells)
      if (c.path == path) return c;
    ADD_FAILURE() << "no cell " << path;
    static IcicleCell none;
    return none;
  };
  // GPT, loss, the rest, blocks, 1, 0, attn, mlp (the 0-byte one left out).
  ASSERT_EQ(cells.size(), 8u);
  EXPECT_EQ(cells[0].path, "GPT");
  EXPECT_EQ(cells[1].path, "loss");
  EXPECT_EQ(cells[2].path, kIcicleRest);  // 950 bytes in no listed module
  EXPECT_EQ(cells[2].depth, 0);
  EXPECT_EQ(cells[2].bytes, 950);
  EXPECT_DOUBLE_EQ(cells[2].x0, 0.525);
  EXPECT_DOUBLE_EQ(cells[2].x1, 1.0);
  EXPECT_EQ(cells[2].category, "");
  const IcicleCell& gpt = find("GPT");
  EXPECT_EQ(gpt.bytes, 1000);
  EXPECT_EQ(gpt.ownBytes, 100);
  EXPECT_DOUBLE_EQ(gpt.x0, 0.0);
  EXPECT_DOUBLE_EQ(gpt.x1, 0.5);          // of the moment's 2000 bytes
  EXPECT_EQ(gpt.category, "ACTIVATION");  // its largest child's, above its own 100 of WEIGHT
  EXPECT_DOUBLE_EQ(find("loss").x0, 0.5);
  EXPECT_DOUBLE_EQ(find("loss").x1, 0.525);
  const IcicleCell& blocks = find("GPT.blocks");
  EXPECT_EQ(blocks.depth, 1);
  EXPECT_EQ(blocks.label, "blocks");
  EXPECT_EQ(blocks.ownBytes, 0);
  // Block 1 (500) before block 0 (400), both under blocks.
  EXPECT_DOUBLE_EQ(find("GPT.blocks.1").x0, 0.0);
  EXPECT_DOUBLE_EQ(find("GPT.blocks.0").x0, 0.25);
  EXPECT_DOUBLE_EQ(find("GPT.blocks.0").x1, 0.45);
  EXPECT_DOUBLE_EQ(find("GPT.blocks.0.attn").x0, 0.25);
  EXPECT_DOUBLE_EQ(find("GPT.blocks.0.mlp").x0, 0.40);
  EXPECT_EQ(find("GPT.blocks.0.mlp").depth, 3);
  // Modules that hold more than the moment's total (a smaller total given) fill the row.
  const std::vector<IcicleCell> full = icicleLayout(modules, 10);
  EXPECT_DOUBLE_EQ(full[1].x1, 1.0);
  EXPECT_NE(full[2].path, kIcicleRest);
  EXPECT_TRUE(icicleLayout({}, 0).empty());
}

}  // namespace
}  // namespace tidemark::gui
