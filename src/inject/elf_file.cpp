#include "src/inject/elf_file.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tidemark::inject {

namespace {

template <typename T>
bool readAt(const uint8_t* data, size_t size, uint64_t offset, T* out) {
  if (offset > size || size - offset < sizeof(T)) return false;
  std::memcpy(out, data + offset, sizeof(T));
  return true;
}

}  // namespace

absl::StatusOr<ElfFile> ElfFile::read(const std::string& path) {
  // Mapped, not read: `tidemark run` checks the 15 MB agent for its CUDA entry at every start,
  // and a lookup touches only the headers and the dynamic symbols (a copy of the whole file took
  // 8 ms; a character at a time, once, 50 ms).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not an ELF file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* mapped = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapped == MAP_FAILED) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::shared_ptr<const void> owner(
      mapped, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  return parseView(std::move(owner), static_cast<const uint8_t*>(mapped), size, path);
}

absl::StatusOr<ElfFile> ElfFile::readHeader(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::vector<uint8_t> bytes(4096);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  bytes.resize(static_cast<size_t>(in.gcount()));
  return parse(std::move(bytes), path);
}

absl::StatusOr<ElfFile> ElfFile::parse(std::vector<uint8_t> bytes, const std::string& path) {
  auto owned = std::make_shared<const std::vector<uint8_t>>(std::move(bytes));
  const uint8_t* data = owned->data();
  const size_t size = owned->size();
  return parseView(std::move(owned), data, size, path);
}

absl::StatusOr<ElfFile> ElfFile::parseView(std::shared_ptr<const void> owner, const uint8_t* data,
                                           size_t size, const std::string& path) {
  ElfFile f;
  f.m_owner = std::move(owner);
  f.m_data = data;
  f.m_size = size;
  if (size < EI_NIDENT || std::memcmp(data, ELFMAG, SELFMAG) != 0)
    return absl::InvalidArgumentError(absl::StrCat(path, " is not an ELF file"));
  f.m_class64 = data[EI_CLASS] == ELFCLASS64;
  if (!f.m_class64) {
    Elf32_Ehdr eh;
    if (!readAt(data, size, 0, &eh))
      return absl::InvalidArgumentError(path + ": truncated ELF header");
    f.m_machine = eh.e_machine;
    return f;  // 32-bit files are only ever reported, never searched
  }
  Elf64_Ehdr eh;
  if (!readAt(data, size, 0, &eh))
    return absl::InvalidArgumentError(path + ": truncated ELF header");
  f.m_machine = eh.e_machine;
  for (uint16_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    if (!readAt(data, size, eh.e_phoff + uint64_t{i} * eh.e_phentsize, &ph)) break;
    if (ph.p_type == PT_LOAD) {
      f.m_firstLoad = ph.p_vaddr;
      break;
    }
  }
  return f;
}

std::optional<uint64_t> ElfFile::symbol(const std::string& name) const {
  if (!m_class64) return std::nullopt;
  Elf64_Ehdr eh;
  if (!readAt(m_data, m_size, 0, &eh)) return std::nullopt;
  auto section = [&](uint32_t i, Elf64_Shdr* sh) {
    return i < eh.e_shnum && readAt(m_data, m_size, eh.e_shoff + uint64_t{i} * eh.e_shentsize, sh);
  };
  Elf64_Shdr dynsym{}, strtab{}, versym{};
  bool haveDynsym = false, haveVersym = false;
  for (uint32_t i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    if (!section(i, &sh)) return std::nullopt;
    if (sh.sh_type == SHT_DYNSYM) {
      dynsym = sh;
      haveDynsym = section(sh.sh_link, &strtab);
    } else if (sh.sh_type == SHT_GNU_versym) {
      versym = sh;
      haveVersym = true;
    }
  }
  if (!haveDynsym || dynsym.sh_entsize != sizeof(Elf64_Sym)) return std::nullopt;
  std::optional<uint64_t> found;
  const uint64_t count = dynsym.sh_size / sizeof(Elf64_Sym);
  for (uint64_t i = 0; i < count; ++i) {
    Elf64_Sym sym;
    if (!readAt(m_data, m_size, dynsym.sh_offset + i * sizeof(Elf64_Sym), &sym)) break;
    if (sym.st_shndx == SHN_UNDEF || sym.st_name >= strtab.sh_size) continue;
    const uint64_t at = strtab.sh_offset + sym.st_name;
    if (at >= m_size) continue;
    const char* s = reinterpret_cast<const char*>(m_data + at);
    const size_t room = m_size - at;
    if (strnlen(s, room) == room || name != s) continue;
    uint16_t version = 0;
    const bool hidden = haveVersym && readAt(m_data, m_size, versym.sh_offset + i * 2, &version) &&
                        (version & 0x8000) != 0;
    if (!hidden) return sym.st_value;  // the default version
    if (!found) found = sym.st_value;
  }
  return found;
}

std::string machineName(bool class64, uint16_t machine) {
  switch (machine) {
    case EM_X86_64:
      return class64 ? "x86-64" : "x32";
    case EM_386:
      return "32-bit x86";
    case EM_AARCH64:
      return "AArch64";
    case EM_ARM:
      return "32-bit ARM";
    case EM_PPC64:
      return "POWER";
    case EM_RISCV:
      return "RISC-V";
    case EM_S390:
      return "s390x";
    default:
      return absl::StrCat("machine ", machine);
  }
}

absl::Status checkSupported(const ElfFile& exe) {
  if (exe.is64() && exe.machine() == EM_X86_64) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "unsupported architecture: the process runs a ", machineName(exe.is64(), exe.machine()),
      " program; tidemark attach injects into x86-64 processes only"));
}

}  // namespace tidemark::inject
