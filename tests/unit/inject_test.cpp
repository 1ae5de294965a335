// The attach injector's pieces that need no other process: ELF files (class, machine, dynamic
// symbols with versions) and /proc/PID/maps.
#include <dlfcn.h>
#include <elf.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>

#include "src/inject/elf_file.h"
#include "src/inject/proc_maps.h"

namespace tidemark::inject {
namespace {

std::vector<uint8_t> header(unsigned char elfClass, uint16_t machine) {
  std::vector<uint8_t> b(64, 0);
  std::memcpy(b.data(), ELFMAG, SELFMAG);
  b[EI_CLASS] = elfClass;
  b[EI_DATA] = ELFDATA2LSB;
  b[EI_VERSION] = EV_CURRENT;
  // e_machine sits at byte 18 in both classes.
  b[18] = static_cast<uint8_t>(machine & 0xff);
  b[19] = static_cast<uint8_t>(machine >> 8);
  return b;
}

TEST(ElfFile, OnlyX8664IsSupported) {
  auto self = ElfFile::readHeader("/proc/self/exe");
  ASSERT_TRUE(self.ok()) << self.status();
  EXPECT_TRUE(checkSupported(*self).ok());

  auto i386 = ElfFile::parse(header(ELFCLASS32, EM_386), "i386");
  ASSERT_TRUE(i386.ok());
  const absl::Status s = checkSupported(*i386);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("32-bit x86"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("x86-64 processes only"), std::string::npos);

  auto arm = ElfFile::parse(header(ELFCLASS64, EM_AARCH64), "arm");
  ASSERT_TRUE(arm.ok());
  EXPECT_NE(checkSupported(*arm).message().find("AArch64"), std::string::npos);

  EXPECT_FALSE(ElfFile::parse({'#', '!', '/', 'b'}, "script").ok());
}

TEST(ElfFile, DynamicSymbolsMatchTheLoader) {
  // dlopen in this process's C library, found in the file, lands where the loader put it.
  const auto maps = readMaps(getpid());
  ASSERT_TRUE(maps.ok());
  const auto libc = findObject(*maps, "/libc.so.6");
  ASSERT_TRUE(libc.has_value());
  auto elf = ElfFile::read(libc->path);
  ASSERT_TRUE(elf.ok()) << elf.status();
  for (const char* name : {"dlopen", "dlerror", "free"}) {
    const auto value = elf->symbol(name);
    ASSERT_TRUE(value.has_value()) << name;
    void* real = dlsym(RTLD_DEFAULT, name);
    Dl_info info{};
    ASSERT_NE(dladdr(real, &info), 0);
    EXPECT_EQ(
        libc->begin - (elf->firstLoadAddress() & ~uint64_t{0xfff}) + *value,
        reinterpret_cast<uint64_t>(dlsym(dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY), name)))
        << name;
  }
  EXPECT_FALSE(elf->symbol("tidemark_no_such_symbol").has_value());
}

TEST(ProcMaps, ParsesLinesAndFindsCode) {
  const auto maps = parseMaps(
      "55d0c0a00000-55d0c0a21000 r--p 00000000 08:01 1 /usr/bin/python3.11\n"
      "7f00aa000000-7f00aa028000 r--p 00000000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7f00aa028000-7f00aa1bd000 r-xp 00028000 08:01 2 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7ffd1c000000-7ffd1c021000 rw-p 00000000 00:00 0 [stack]\n"
      "not a line\n"
      "7f00bb000000-7f00bb001000 rw-p 00000000 00:00 0\n");
  ASSERT_EQ(maps.size(), 5u);
  EXPECT_EQ(maps[1].begin, 0x7f00aa000000u);
  EXPECT_EQ(maps[2].offset, 0x28000u);
  EXPECT_TRUE(maps[2].executable());
  EXPECT_EQ(maps[4].path, "");
  const auto libc = findObject(maps, "/libc.so.6");
  ASSERT_TRUE(libc.has_value());
  EXPECT_EQ(libc->begin, 0x7f00aa000000u);  // the mapping at offset 0
  EXPECT_FALSE(findObject(maps, "/libtidemark_agent.so").has_value());
  EXPECT_TRUE(inCodeOf(maps, 0x7f00aa030000, {"/libc.so"}));
  EXPECT_FALSE(inCodeOf(maps, 0x7f00aa001000, {"/libc.so"}));  // not executable
  EXPECT_FALSE(inCodeOf(maps, 0x55d0c0a00010, {"/libc.so"}));
}

}  // namespace
}  // namespace tidemark::inject
