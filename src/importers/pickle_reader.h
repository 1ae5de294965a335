#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace tidemark::core {

// A value read from a pickle: the plain data that PyTorch's memory snapshots hold (None, bools,
// integers, floats, strings, bytes, lists, tuples, dicts). Lists and dicts are shared (the
// pickle's memo can refer to one twice).
struct PyValue;
using PyList = std::vector<std::shared_ptr<PyValue>>;
using PyDict = std::vector<std::pair<std::shared_ptr<PyValue>, std::shared_ptr<PyValue>>>;

struct PyValue {
  enum class Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict };
  PyValue() = default;
  PyValue(const PyValue&) = default;
  PyValue(PyValue&&) = default;
  PyValue& operator=(const PyValue&) = default;
  PyValue& operator=(PyValue&&) = default;
  // Frees nested containers without recursion: a value nested a million deep is freed in a
  // loop, not with a million stack frames.
  ~PyValue();

  Kind kind = Kind::kNone;
  uint32_t depth = 0;  // containers: 1 + the depth of the deepest value they hold (when added)
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;  // kString (UTF-8) and kBytes
  PyList items;   // kList and kTuple
  PyDict dict;    // kDict, in insertion order

  bool isNumber() const {
    return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool;
  }
  // The entry of a dict with a string key, or nullptr.
  const PyValue* get(std::string_view key) const;
  int64_t asInt(int64_t fallback = 0) const;
  std::string_view asString() const { return kind == Kind::kString ? std::string_view(s) : ""; }
};

// Reads a pickle (protocols 2 to 5) without running anything: an opcode that would look up a
// global, call or build an object is an error naming it, as are truncation, stack or memo misuse,
// lengths past the end of the data, containers nested deeper than kMaxPickleDepth and more than
// kMaxPickleStack values open at once.
inline constexpr uint32_t kMaxPickleDepth = 10000;
inline constexpr size_t kMaxPickleStack = 1000000;
absl::StatusOr<std::shared_ptr<PyValue>> readPickle(std::string_view data);

}  // namespace tidemark::core
