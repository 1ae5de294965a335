#!/usr/bin/env bash
# Fuzzes the importers' parsers with libFuzzer (clang, ASan + UBSan) for SECONDS each, from the
# seed corpus in tests/fuzz/corpus. Builds into build-fuzz/ (kept between runs). Exit 0 when no
# input crashed; a crashing input is left in build-fuzz/ and named in the output.
# With FUZZ_RUNS=N it runs N inputs each from a fixed seed instead: the same inputs on every
# machine, which is what the tests use (a random search belongs to a person's exploration, not to
# a gate that would fail on whatever it finds next).
# Usage: bash scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-30}
ROOT=$PWD
OUT=${FUZZ_DIR:-build-fuzz}
mkdir -p "$OUT"
CXX=${FUZZ_CXX:-clang++}
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I.)
ABSL=$(pkg-config --libs absl_status absl_statusor absl_strings)
SOURCES=(src/importers/pickle_reader.cpp src/importers/memory_snapshot.cpp
         src/importers/kineto_trace.cpp src/core/category.cpp)
for target in memory_snapshot kineto_trace; do
  bin="$OUT/fuzz_$target"
  if [ ! -x "$bin" ] || [ -n "$(find tests/fuzz/fuzz_$target.cpp "${SOURCES[@]}" src/importers/*.h -newer "$bin" 2>/dev/null)" ]; then
    echo "fuzz: building $bin" >&2
    "$CXX" "${FLAGS[@]}" "tests/fuzz/fuzz_$target.cpp" "${SOURCES[@]}" $ABSL -o "$bin"
  fi
done
status=0
run() {
  local target=$1 corpus=$2
  local work="$OUT/corpus_$target"
  mkdir -p "$work"
  local budget=(-max_total_time="$SECONDS_EACH") what="${SECONDS_EACH}s"
  if [ -n "${FUZZ_RUNS:-}" ]; then
    budget=(-runs="$FUZZ_RUNS" -seed=1)
    what="$FUZZ_RUNS inputs, seed 1"
  fi
  echo "fuzz: $target ($what)" >&2
  if ! (cd "$OUT" && "./fuzz_$target" "${budget[@]}" -max_len=65536 \
        -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 "corpus_$target" "$ROOT/$corpus" \
        2> "fuzz_$target.log"); then
    echo "fuzz: $target FAILED; see $OUT/fuzz_$target.log and the crash-* file in $OUT" >&2
    tail -30 "$OUT/fuzz_$target.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|Done" "$OUT/fuzz_$target.log" >&2 || true
  fi
}
run memory_snapshot tests/fuzz/corpus/pickle
run kineto_trace tests/fuzz/corpus/kineto
exit $status
