#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tidemark::inject {

// What the injector needs from an ELF file on disk: its class and machine, the first loadable
// segment's address, and the values of its dynamic symbols (the default version where a name has
// several).
class ElfFile {
 public:
  static absl::StatusOr<ElfFile> read(const std::string& path);
  // The first page only: class, machine and (usually) the program headers, not the symbols.
  static absl::StatusOr<ElfFile> readHeader(const std::string& path);
  // From the bytes of a whole file (the tests build headers by hand).
  static absl::StatusOr<ElfFile> parse(std::vector<uint8_t> bytes, const std::string& path);

  bool is64() const { return m_class64; }
  uint16_t machine() const { return m_machine; }
  // The address the first PT_LOAD segment asks for (0 for ordinary shared objects).
  uint64_t firstLoadAddress() const { return m_firstLoad; }
  // A defined dynamic symbol's value (relative to the load bias), or nothing.
  std::optional<uint64_t> symbol(const std::string& name) const;

 private:
  static absl::StatusOr<ElfFile> parseView(std::shared_ptr<const void> owner, const uint8_t* data,
                                           size_t size, const std::string& path);

  // The file's bytes: mapped (read) or owned (parse); m_owner keeps them.
  std::shared_ptr<const void> m_owner;
  const uint8_t* m_data = nullptr;
  size_t m_size = 0;
  bool m_class64 = false;
  uint16_t m_machine = 0;
  uint64_t m_firstLoad = 0;
};

// "x86-64", "32-bit x86", "AArch64", ... for messages.
std::string machineName(bool class64, uint16_t machine);
// OK for a 64-bit x86-64 program; otherwise why tidemark attach cannot inject into it.
absl::Status checkSupported(const ElfFile& exe);

}  // namespace tidemark::inject
