#!/usr/bin/env bash
# Makes a copy of the build that runs on a machine without Debian's gRPC, Protobuf and SQLite (a
# GPU machine lent for scripts/gpu-check.sh): bin/tidemark, bin/tidemarkd and
# lib/libtidemark_agent.so, stripped, with every library they need but the C and C++ runtimes
# copied into deps/, each file given a RUNPATH ($ORIGIN/../deps for the three, $ORIGIN for the
# copies) so that the loader finds them there and nothing leaks into the library search of the job
# the agent is loaded into. The C and C++ runtimes (glibc's libraries, libstdc++, libgcc_s, the
# loader) are the machine's own: the job's torch brings a newer libstdc++ than Debian's.
#
#   bash scripts/carry-build.sh [OUT]      (default .gpubuild; BUILD_DIR names the build, default
#                                           build/)
# then, on the GPU machine: STEPS=12 BUILD_DIR=OUT PYTHON=python3 bash scripts/gpu-check.sh
# (OUT is ignored by git where it is .gpubuild: name it in the device run's `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
OUT=${1:-.gpubuild}
for tool in patchelf strip ldd; do
  command -v "$tool" >/dev/null ||
    { echo "carry-build: $tool is missing (apt-get install $tool)" >&2; exit 2; }
done
FILES=("$BUILD/bin/tidemark" "$BUILD/bin/tidemarkd" "$BUILD/lib/libtidemark_agent.so")
for f in "${FILES[@]}"; do
  [ -f "$f" ] || { echo "carry-build: $f is missing (bash scripts/build.sh)" >&2; exit 2; }
done
rm -rf "$OUT/bin" "$OUT/lib" "$OUT/deps"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/deps"
cp "$BUILD/bin/tidemark" "$BUILD/bin/tidemarkd" "$OUT/bin/"
cp "$BUILD/lib/libtidemark_agent.so" "$OUT/lib/"
# The runtimes every machine has in its own version: not carried.
RUNTIMES='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libutil|libnsl|libanl'
RUNTIMES+='|libstdc\+\+|libgcc_s)\.so'
NEEDED=$(ldd "${FILES[@]}")
if grep -q "not found" <<<"$NEEDED"; then
  echo "carry-build: a library the build needs is not found here:" >&2
  grep "not found" <<<"$NEEDED" >&2
  exit 2
fi
awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' <<<"$NEEDED" | sort -u |
  while read -r name path; do
    if ! [[ $name =~ $RUNTIMES ]]; then cp -L "$path" "$OUT/deps/$name"; fi
  done
strip --strip-unneeded "$OUT/bin/"* "$OUT/lib/"* "$OUT/deps/"*
for f in "$OUT/bin/"* "$OUT/lib/"*; do patchelf --set-rpath '$ORIGIN/../deps' "$f"; done
for f in "$OUT/deps/"*; do patchelf --set-rpath '$ORIGIN' "$f"; done
echo "carry-build: $OUT: $(ls "$OUT/deps" | wc -l) libraries beside the three files," \
  "$(du -sh "$OUT" | cut -f1) in all"
