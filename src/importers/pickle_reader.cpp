#include "src/importers/pickle_reader.h"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"

namespace tidemark::core {

const PyValue* PyValue::get(std::string_view key) const {
  if (kind != Kind::kDict) return nullptr;
  for (const auto& [k, v] : dict)
    if (k->kind == Kind::kString && k->s == key) return v.get();
  return nullptr;
}

int64_t PyValue::asInt(int64_t fallback) const {
  switch (kind) {
    case Kind::kInt:
      return i;
    case Kind::kBool:
      return b ? 1 : 0;
    case Kind::kFloat:  // beyond an int64 (or NaN): not an integer this data can mean
      return f > -9e18 && f < 9e18 ? static_cast<int64_t>(f) : fallback;
    default:
      return fallback;
  }
}

namespace {

using Ptr = std::shared_ptr<PyValue>;

Ptr make(PyValue::Kind k) {
  auto v = std::make_shared<PyValue>();
  v->kind = k;
  return v;
}

}  // namespace

PyValue::~PyValue() {
  if (items.empty() && dict.empty()) return;
  // Children this value alone holds are emptied here, one at a time, before they are freed.
  std::vector<std::shared_ptr<PyValue>> pending;
  auto adopt = [&pending](PyValue& v) {
    for (auto& c : v.items) {
      if (c) pending.push_back(std::move(c));
    }
    for (auto& [k, val] : v.dict) {
      if (k) pending.push_back(std::move(k));
      if (val) pending.push_back(std::move(val));
    }
    v.items.clear();
    v.dict.clear();
  };
  adopt(*this);
  while (!pending.empty()) {
    std::shared_ptr<PyValue> v = std::move(pending.back());
    pending.pop_back();
    if (v.use_count() == 1) adopt(*v);
  }
}

namespace {

bool isContainer(const PyValue& v) {
  return v.kind == PyValue::Kind::kList || v.kind == PyValue::Kind::kTuple ||
         v.kind == PyValue::Kind::kDict;
}

// True when a container holds itself, directly or not (the memo allows it; nothing here reads
// such a value, and shared pointers in a cycle would never be freed).
bool hasCycle(const PyValue& root) {
  enum Color { kOpen, kDone };
  std::unordered_map<const PyValue*, Color> color;
  std::vector<std::pair<const PyValue*, size_t>> stack{{&root, 0}};
  color[&root] = kOpen;
  auto child = [](const PyValue& v, size_t k) -> const PyValue* {
    if (v.kind == PyValue::Kind::kDict) {
      if (k / 2 >= v.dict.size()) return nullptr;
      return (k % 2 == 0 ? v.dict[k / 2].first : v.dict[k / 2].second).get();
    }
    return k < v.items.size() ? v.items[k].get() : nullptr;
  };
  while (!stack.empty()) {
    auto& [v, k] = stack.back();
    const PyValue* c = child(*v, k++);
    if (c == nullptr) {
      color[v] = kDone;
      stack.pop_back();
      continue;
    }
    if (!isContainer(*c)) continue;
    auto it = color.find(c);
    if (it != color.end()) {
      if (it->second == kOpen) return true;
      continue;
    }
    color[c] = kOpen;
    stack.push_back({c, 0});
  }
  return false;
}

// The containers a value holds, itself included (a value without cycles: each is entered once).
std::unordered_set<const PyValue*> containersIn(const PyValue& root) {
  std::unordered_set<const PyValue*> seen;
  std::vector<const PyValue*> todo{&root};
  while (!todo.empty()) {
    const PyValue* v = todo.back();
    todo.pop_back();
    if (!isContainer(*v) || !seen.insert(v).second) continue;
    for (const Ptr& c : v->items)
      if (c) todo.push_back(c.get());
    for (const auto& [k, val] : v->dict) {
      if (k) todo.push_back(k.get());
      if (val) todo.push_back(val.get());
    }
  }
  return seen;
}

class Machine {
 public:
  explicit Machine(std::string_view data) : m_data(data) {}
  // Every container the value that went out does not hold (all of them when none went out) is
  // emptied: that breaks any cycle the data built — also one left in the memo beside a value
  // that went out whole — so that everything is freed.
  ~Machine() {
    const std::unordered_set<const PyValue*> kept =
        m_delivered ? containersIn(*m_delivered) : std::unordered_set<const PyValue*>{};
    for (const std::weak_ptr<PyValue>& w : m_containers) {
      if (Ptr v = w.lock(); v && kept.count(v.get()) == 0) {
        v->items.clear();
        v->dict.clear();
      }
    }
  }

  absl::StatusOr<Ptr> run() {
    while (true) {
      if (m_pos >= m_data.size()) return fail("truncated: no STOP opcode");
      const size_t at = m_pos;
      const auto op = static_cast<uint8_t>(m_data[m_pos++]);
      absl::Status s = step(op, at);
      if (!s.ok()) return s;
      if (m_stopped) {
        if (m_stack.size() != 1) return fail("the pickle does not end with one value");
        if (hasCycle(*m_stack.back())) return fail("a value contains itself");
        m_delivered = m_stack.back();
        return m_stack.back();
      }
    }
  }

 private:
  absl::Status fail(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("pickle: ", what, " (at byte ", m_pos, ")"));
  }

  bool take(size_t n, std::string_view* out) {
    if (n > m_data.size() - m_pos) return false;
    *out = m_data.substr(m_pos, n);
    m_pos += n;
    return true;
  }
  bool takeUint(size_t n, uint64_t* out) {
    std::string_view b;
    if (!take(n, &b)) return false;
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(b[k])) << (8 * k);
    *out = v;
    return true;
  }

  absl::Status push(Ptr v) {
    if (m_stack.size() >= kMaxPickleStack) {
      return fail(absl::StrCat("more than ", kMaxPickleStack, " values open at once"));
    }
    m_stack.push_back(std::move(v));
    return absl::OkStatus();
  }
  // Records that `parent` holds `child`: past kMaxPickleDepth levels the pickle is refused
  // (nothing that reads it needs more than a few).
  absl::Status nest(PyValue& parent, const PyValue& child) {
    if (child.depth + 1 > parent.depth) parent.depth = child.depth + 1;
    if (parent.depth > kMaxPickleDepth) {
      return fail(absl::StrCat("containers nested deeper than ", kMaxPickleDepth, " levels"));
    }
    return absl::OkStatus();
  }
  absl::Status nestAll(PyValue& parent) {
    for (const Ptr& c : parent.items) {
      if (auto s = nest(parent, *c); !s.ok()) return s;
    }
    for (const auto& [k, v] : parent.dict) {
      if (auto s = nest(parent, *k); !s.ok()) return s;
      if (auto s = nest(parent, *v); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  absl::StatusOr<Ptr> pop() {
    if (m_stack.empty() || (!m_marks.empty() && m_stack.size() <= m_marks.back()))
      return fail("stack underflow");
    Ptr v = std::move(m_stack.back());
    m_stack.pop_back();
    return v;
  }
  // The values above the topmost mark, which is removed.
  absl::StatusOr<PyList> popMark() {
    if (m_marks.empty()) return fail("no MARK");
    const size_t mark = m_marks.back();
    m_marks.pop_back();
    PyList out(std::make_move_iterator(m_stack.begin() + static_cast<long>(mark)),
               std::make_move_iterator(m_stack.end()));
    m_stack.resize(mark);
    return out;
  }
  absl::StatusOr<PyValue*> top(PyValue::Kind kind, const char* what) {
    if (m_stack.empty() || (!m_marks.empty() && m_stack.size() <= m_marks.back()))
      return fail(absl::StrCat(what, " on an empty stack"));
    if (m_stack.back()->kind != kind) return fail(absl::StrCat(what, " on the wrong type"));
    return m_stack.back().get();
  }

  absl::Status pushString(size_t lenBytes, PyValue::Kind kind) {
    uint64_t n = 0;
    std::string_view body;
    if (!takeUint(lenBytes, &n) || !take(n, &body)) return fail("truncated string");
    Ptr v = make(kind);
    v->s.assign(body);
    return push(std::move(v));
  }

  absl::Status pushInt(int64_t i) {
    Ptr v = make(PyValue::Kind::kInt);
    v->i = i;
    return push(std::move(v));
  }

  absl::Status pushLong(size_t lenBytes) {
    uint64_t n = 0;
    std::string_view body;
    if (!takeUint(lenBytes, &n) || !take(n, &body)) return fail("truncated integer");
    if (n > 8) return fail("integer wider than 64 bits");
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k)
      v |= static_cast<uint64_t>(static_cast<uint8_t>(body[k])) << (8 * k);
    if (n > 0 && n < 8 && (static_cast<uint8_t>(body[n - 1]) & 0x80)) v |= ~uint64_t{0} << (8 * n);
    return pushInt(static_cast<int64_t>(v));
  }

  absl::Status memoPut(uint64_t key) {
    if (m_stack.empty()) return fail("MEMOIZE on an empty stack");
    m_memo[key] = m_stack.back();
    return absl::OkStatus();
  }
  absl::Status memoGet(uint64_t key) {
    auto it = m_memo.find(key);
    if (it == m_memo.end()) return fail("memo key not found");
    return push(it->second);
  }

  absl::Status tupleOf(size_t n) {
    if (m_stack.size() < n + (m_marks.empty() ? 0 : m_marks.back())) return fail("stack underflow");
    Ptr t = container(PyValue::Kind::kTuple);
    t->items.assign(m_stack.end() - static_cast<long>(n), m_stack.end());
    m_stack.resize(m_stack.size() - n);
    if (auto s = nestAll(*t); !s.ok()) return s;
    return push(std::move(t));
  }

  absl::Status step(uint8_t op, size_t at) {
    uint64_t n = 0;
    std::string_view b;
    switch (op) {
      case 0x80:  // PROTO
        if (!take(1, &b)) return fail("truncated PROTO");
        if (static_cast<uint8_t>(b[0]) < 2 || static_cast<uint8_t>(b[0]) > 5)
          return fail(absl::StrCat("protocol ", static_cast<int>(static_cast<uint8_t>(b[0])),
                                   " is not read (2 to 5 are)"));
        return absl::OkStatus();
      case 0x95:  // FRAME
        return takeUint(8, &n) ? absl::OkStatus() : fail("truncated FRAME");
      case '}':
        return push(container(PyValue::Kind::kDict));
      case ']':
        return push(container(PyValue::Kind::kList));
      case ')':
        return push(container(PyValue::Kind::kTuple));
      case '(':
        if (m_marks.size() > kMaxMarks) return fail("too many nested MARKs");
        m_marks.push_back(m_stack.size());
        return absl::OkStatus();
      case 'N':
        return push(make(PyValue::Kind::kNone));
      case 0x88:
      case 0x89: {
        Ptr v = make(PyValue::Kind::kBool);
        v->b = op == 0x88;
        return push(std::move(v));
      }
      case 'J':
        if (!takeUint(4, &n)) return fail("truncated BININT");
        return pushInt(static_cast<int32_t>(static_cast<uint32_t>(n)));
      case 'K':
        if (!takeUint(1, &n)) return fail("truncated BININT1");
        return pushInt(static_cast<int64_t>(n));
      case 'M':
        if (!takeUint(2, &n)) return fail("truncated BININT2");
        return pushInt(static_cast<int64_t>(n));
      case 0x8a:
        return pushLong(1);
      case 0x8b:
        return pushLong(4);
      case 'G': {
        if (!take(8, &b)) return fail("truncated BINFLOAT");
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = (bits << 8) | static_cast<uint8_t>(b[k]);
        Ptr v = make(PyValue::Kind::kFloat);
        std::memcpy(&v->f, &bits, sizeof bits);
        return push(std::move(v));
      }
      case 'X':
        return pushString(4, PyValue::Kind::kString);
      case 0x8c:
        return pushString(1, PyValue::Kind::kString);
      case 0x8d:
        return pushString(8, PyValue::Kind::kString);
      case 'B':
        return pushString(4, PyValue::Kind::kBytes);
      case 'C':
        return pushString(1, PyValue::Kind::kBytes);
      case 0x8e:
        return pushString(8, PyValue::Kind::kBytes);
      case 0x96:
        return pushString(8, PyValue::Kind::kBytes);
      case 'a': {
        auto v = pop();
        if (!v.ok()) return v.status();
        auto list = top(PyValue::Kind::kList, "APPEND");
        if (!list.ok()) return list.status();
        if (auto s = nest(**list, **v); !s.ok()) return s;
        (*list)->items.push_back(std::move(*v));
        return absl::OkStatus();
      }
      case 'e': {
        auto items = popMark();
        if (!items.ok()) return items.status();
        auto list = top(PyValue::Kind::kList, "APPENDS");
        if (!list.ok()) return list.status();
        for (Ptr& v : *items) {
          if (auto s = nest(**list, *v); !s.ok()) return s;
          (*list)->items.push_back(std::move(v));
        }
        return absl::OkStatus();
      }
      case 's': {
        auto v = pop();
        if (!v.ok()) return v.status();
        auto k = pop();
        if (!k.ok()) return k.status();
        auto dict = top(PyValue::Kind::kDict, "SETITEM");
        if (!dict.ok()) return dict.status();
        if (auto s = nest(**dict, **k); !s.ok()) return s;
        if (auto s = nest(**dict, **v); !s.ok()) return s;
        (*dict)->dict.emplace_back(std::move(*k), std::move(*v));
        return absl::OkStatus();
      }
      case 'u': {
        auto items = popMark();
        if (!items.ok()) return items.status();
        if (items->size() % 2 != 0) return fail("SETITEMS with an odd number of values");
        auto dict = top(PyValue::Kind::kDict, "SETITEMS");
        if (!dict.ok()) return dict.status();
        for (size_t k = 0; k < items->size(); k += 2) {
          if (auto s = nest(**dict, *(*items)[k]); !s.ok()) return s;
          if (auto s = nest(**dict, *(*items)[k + 1]); !s.ok()) return s;
          (*dict)->dict.emplace_back(std::move((*items)[k]), std::move((*items)[k + 1]));
        }
        return absl::OkStatus();
      }
      case 't': {
        auto items = popMark();
        if (!items.ok()) return items.status();
        Ptr t = container(PyValue::Kind::kTuple);
        t->items = std::move(*items);
        if (auto s = nestAll(*t); !s.ok()) return s;
        return push(std::move(t));
      }
      case 0x85:
        return tupleOf(1);
      case 0x86:
        return tupleOf(2);
      case 0x87:
        return tupleOf(3);
      case 0x94:
        return memoPut(m_memo.size());
      case 'q':
        if (!takeUint(1, &n)) return fail("truncated BINPUT");
        return memoPut(n);
      case 'r':
        if (!takeUint(4, &n)) return fail("truncated LONG_BINPUT");
        return memoPut(n);
      case 'h':
        if (!takeUint(1, &n)) return fail("truncated BINGET");
        return memoGet(n);
      case 'j':
        if (!takeUint(4, &n)) return fail("truncated LONG_BINGET");
        return memoGet(n);
      case '0': {
        auto v = pop();
        return v.ok() ? absl::OkStatus() : v.status();
      }
      case '1': {
        auto items = popMark();
        return items.ok() ? absl::OkStatus() : items.status();
      }
      case '2':
        if (m_stack.empty()) return fail("DUP on an empty stack");
        return push(m_stack.back());
      case '.':
        m_stopped = true;
        return absl::OkStatus();
      case 'c':
      case 0x93:
      case 'R':
      case 'b':
      case 0x81:
      case 0x92:
      case 'i':
      case 'o':
      case 0x82:
      case 0x83:
      case 0x84:
      case 'P':
      case 'Q':
        return absl::InvalidArgumentError(
            absl::StrCat("pickle: refused: opcode 0x", absl::Hex(op), " at byte ", at,
                         " refers to a global or builds an object; only plain data is read"));
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("pickle: unsupported opcode 0x", absl::Hex(op), " at byte ", at));
    }
  }

  Ptr container(PyValue::Kind k) {
    Ptr v = make(k);
    v->depth = 1;
    m_containers.push_back(v);
    return v;
  }

  static constexpr size_t kMaxMarks = 1 << 16;
  Ptr m_delivered;  // the value that went out (it holds no cycle)
  std::vector<std::weak_ptr<PyValue>> m_containers;
  std::string_view m_data;
  size_t m_pos = 0;
  bool m_stopped = false;
  std::vector<Ptr> m_stack;
  std::vector<size_t> m_marks;
  std::unordered_map<uint64_t, Ptr> m_memo;
};

}  // namespace

absl::StatusOr<std::shared_ptr<PyValue>> readPickle(std::string_view data) {
  if (data.size() < 2 || static_cast<uint8_t>(data[0]) != 0x80)
    return absl::InvalidArgumentError("not a pickle (protocol 2 or later)");
  return Machine(data).run();
}

}  // namespace tidemark::core
