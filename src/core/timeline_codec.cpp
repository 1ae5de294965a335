#include "src/core/timeline_codec.h"

#include <bit>
#include <cstring>

namespace tidemark::core {

namespace {
void put(std::string& out, int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}
int64_t get(const unsigned char*& p) {
  uint64_t u = 0;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&u, p, 8);  // the stored order is the host's: one load
  } else {
    for (int i = 0; i < 8; ++i) u |= static_cast<uint64_t>(p[i]) << (8 * i);
  }
  p += 8;
  return static_cast<int64_t>(u);
}
}  // namespace

std::string encodeSamples(const TimelineSample* samples, size_t count) {
  std::string out;
  out.reserve(count * kEncodedSampleBytes);
  for (size_t i = 0; i < count; ++i) {
    const TimelineSample& s = samples[i];
    put(out, s.firstTsNs);
    put(out, s.lastTsNs);
    put(out, static_cast<int64_t>(s.firstSeq));
    put(out, static_cast<int64_t>(s.lastSeq));
    for (const SeriesValues* v : {&s.min, &s.max, &s.last}) {
      for (int64_t x : *v) put(out, x);
    }
  }
  return out;
}

bool decodeSamples(std::string_view bytes, std::vector<TimelineSample>* out) {
  if (bytes.size() % kEncodedSampleBytes != 0) return false;
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size() / kEncodedSampleBytes;
  out->reserve(out->size() + n);
  for (size_t i = 0; i < n; ++i) {
    TimelineSample s;
    s.firstTsNs = get(p);
    s.lastTsNs = get(p);
    s.firstSeq = static_cast<uint64_t>(get(p));
    s.lastSeq = static_cast<uint64_t>(get(p));
    for (SeriesValues* v : {&s.min, &s.max, &s.last}) {
      for (int64_t& x : *v) x = get(p);
    }
    out->push_back(s);
  }
  return true;
}

}  // namespace tidemark::core
