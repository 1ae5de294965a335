#pragma once
// Chains the advisor's unit tests share: a stage from its figures, random chains.
#include <random>
#include <string>

#include "src/advisor/chain.h"

namespace tidemark::core::chain_fixtures {

inline Stage stage(std::string name, int64_t f, int64_t b, int64_t saved, int64_t out,
                   int64_t wf = 0, int64_t wb = 0) {
  Stage s;
  s.name = std::move(name);
  s.forwardNs = f;
  s.backwardNs = b;
  s.savedBytes = saved;
  s.outputBytes = out;
  s.forwardWorkingBytes = wf;
  s.backwardWorkingBytes = wb;
  return s;
}

// A random chain of n stages: times and sizes varying tenfold, now and then a stage that cannot
// be recomputed or one not fed by the stage before, outside memory, a floor, an offload speed
// (copies of a stage taking about as long as its forward), and (withOptions) selective options.
// Outside memory is now and then different while a stage is recomputed.
inline ChainProfile randomChain(std::mt19937_64& rng, int n, bool withOptions) {
  std::uniform_int_distribution<int64_t> time(10, 100), bytes(10, 100), small(0, 20);
  std::uniform_int_distribution<int> coin(0, 9);
  ChainProfile p;
  p.name = "random";
  p.staticBytes = bytes(rng) * 3;
  p.inputBytes = bytes(rng);
  p.endOutsideBytes = small(rng);
  // Now and then the step's peak lies outside the chain (an optimizer step).
  if (coin(rng) == 0) p.floorBytes = p.staticBytes + 5 * bytes(rng);
  for (int i = 0; i < n; ++i) {
    Stage s = stage("s" + std::to_string(i), time(rng), 2 * time(rng), 4 * bytes(rng), bytes(rng),
                    small(rng), small(rng));
    if (withOptions && coin(rng) < 3) {
      s.options.push_back({"half", s.savedBytes / 2, s.forwardNs / 3, {s.name + ".mlp"}});
      // Measured transients (a recording's), below the defaults, now and then.
      if (coin(rng) < 5) {
        s.options.back().forwardWorkingBytes = small(rng);
        s.options.back().backwardWorkingBytes = small(rng);
      }
    }
    s.checkpointable = coin(rng) != 0;
    // Now and then a re-run that does not take the forward's time (a recording's own re-runs).
    if (coin(rng) < 3) s.rerunNs = time(rng);
    if (coin(rng) < 5) {
      s.forwardOutsideBytes = small(rng);
      s.backwardOutsideBytes = small(rng);
      // A recording's recomputed stage: its own term while it runs again, up to a few stages' saved
      // bytes (drawn from the others, so that the chains the tests were written on stay the same).
      if (i % 3 == 1)
        s.recomputeOutsideBytes = 30 * ((s.forwardOutsideBytes + 2 * s.backwardOutsideBytes) % 21);
    }
    // A recording's checkpointed stage: its forward's working under the checkpoint, from none to
    // 1.5 times the stored run's, and now and then up to twice its saved bytes more (a forward
    // moment that weighs; drawn from the others, as above).
    if (i % 4 == 2)
      s.checkpointedForwardWorkingBytes =
          s.forwardWorkingBytes * ((s.savedBytes + s.outputBytes) % 4) / 2 +
          s.savedBytes * (s.outputBytes % 3);
    s.linked = coin(rng) != 0;
    p.stages.push_back(std::move(s));
  }
  if (coin(rng) < 4)
    p.offloadBytesPerSecond = std::uniform_int_distribution<int64_t>(4, 40)(rng) * 1'000'000'000;
  return p;
}

}  // namespace tidemark::core::chain_fixtures
