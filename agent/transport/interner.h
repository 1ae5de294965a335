#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tidemark::agent {

// Interns names (module paths, tensor names) to small non-zero ids that records carry.
// Called from the C ABI, never from an allocator hook: it locks and allocates.
class Interner {
 public:
  uint32_t intern(std::string_view value);
  // Strings interned since the last call, to be sent before any record that uses them.
  std::vector<std::pair<uint32_t, std::string>> takeNew();
  // Strings takeNew gave that could not be sent (no memory to batch them): they come again,
  // with the next takeNew. (Only when no memory can be had for both lists are they lost: the
  // records naming them show no name.)
  void giveBack(std::vector<std::pair<uint32_t, std::string>>&& strings) noexcept;
  // Every string interned so far (a new session needs them again).
  std::vector<std::pair<uint32_t, std::string>> all();

 private:
  std::mutex m_mutex;
  std::unordered_map<std::string, uint32_t> m_ids;
  std::vector<std::pair<uint32_t, std::string>> m_new;
};

}  // namespace tidemark::agent
