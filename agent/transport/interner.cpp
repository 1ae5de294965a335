#include "agent/transport/interner.h"

#include <iterator>
#include <new>

namespace tidemark::agent {

uint32_t Interner::intern(std::string_view value) {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto [it, inserted] = m_ids.try_emplace(std::string(value), 0);
  if (inserted) {
    it->second = static_cast<uint32_t>(m_ids.size());
    m_new.emplace_back(it->second, it->first);
  }
  return it->second;
}

std::vector<std::pair<uint32_t, std::string>> Interner::takeNew() {
  std::lock_guard<std::mutex> lock(m_mutex);
  std::vector<std::pair<uint32_t, std::string>> out;
  out.swap(m_new);
  return out;
}

void Interner::giveBack(std::vector<std::pair<uint32_t, std::string>>&& strings) noexcept {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (m_new.empty()) {
    m_new.swap(strings);
    return;
  }
  try {
    m_new.insert(m_new.end(), std::make_move_iterator(strings.begin()),
                 std::make_move_iterator(strings.end()));
  } catch (const std::bad_alloc&) {
  }
}

std::vector<std::pair<uint32_t, std::string>> Interner::all() {
  std::lock_guard<std::mutex> lock(m_mutex);
  std::vector<std::pair<uint32_t, std::string>> out;
  out.reserve(m_ids.size());
  for (const auto& [value, id] : m_ids) out.emplace_back(id, value);
  return out;
}

}  // namespace tidemark::agent
