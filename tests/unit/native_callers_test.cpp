#include "agent/hooks/native_callers.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tidemark::agent::native_callers {
namespace {

// Code of this test program (never the tensor allocator's library below).
__attribute__((noinline)) int codeHere(int x) { return x + 1; }

// libc plays the framework's tensor allocator: its malloc is a caller "inside" it.
const void* insideTheAllocatorLibrary() { return dlsym(RTLD_DEFAULT, "malloc"); }

struct Identification {
  std::map<uint32_t, std::string> names;             // interned: iid -> name
  std::vector<std::pair<uint64_t, uint32_t>> early;  // (address, name iid) told
  bool found = false;

  void run(std::string_view prefix) {
    found = identifyTensorAllocator(
        prefix,
        [this](std::string_view name) {
          for (const auto& [iid, value] : names)
            if (value == name) return iid;
          const auto iid = static_cast<uint32_t>(names.size() + 1);
          names[iid] = std::string(name);
          return iid;
        },
        [this](uint64_t address, uint32_t name) { early.emplace_back(address, name); });
  }
};

class NativeCallersTest : public ::testing::Test {
 protected:
  void SetUp() override { reset(); }
  void TearDown() override { reset(); }
};

TEST_F(NativeCallersTest, NothingIsToldApartUntilALibraryIsNamed) {
  EXPECT_EQ(nativeNameOf(0x1000, reinterpret_cast<const void*>(&codeHere)), 0u);
  Identification id;
  id.run("libno-such-library.so");
  EXPECT_FALSE(id.found);
  EXPECT_TRUE(id.early.empty());
  EXPECT_EQ(nativeNameOf(0x2000, reinterpret_cast<const void*>(&codeHere)), 0u);
}

TEST_F(NativeCallersTest, CallersOutsideTheNamedLibraryAreNamedAfterTheirOwn) {
  Identification id;
  id.run("libc.so");
  ASSERT_TRUE(id.found);
  EXPECT_EQ(nativeNameOf(0x1000, insideTheAllocatorLibrary()), 0u);
  const uint32_t here = nativeNameOf(0x1000, reinterpret_cast<const void*>(&codeHere));
  ASSERT_NE(here, 0u);
  EXPECT_EQ(id.names[here], "[native] tidemark_unit_tests");
  // An address in no object loaded at the identification (code loaded later, or none).
  const uint32_t later = nativeNameOf(0x1000, reinterpret_cast<const void*>(uintptr_t{16}));
  ASSERT_NE(later, 0u);
  EXPECT_EQ(id.names[later], "[native] (a library loaded later)");
  EXPECT_NE(later, here);
}

TEST_F(NativeCallersTest, EarlyAllocationsAreToldByTheLastOneAtEachAddress) {
  const auto* native = reinterpret_cast<const void*>(&codeHere);
  // Before identification: noted, nothing told.
  EXPECT_EQ(nativeNameOf(0x1000, native), 0u);
  EXPECT_EQ(nativeNameOf(0x2000, native), 0u);
  EXPECT_EQ(nativeNameOf(0x2000, insideTheAllocatorLibrary()), 0u);  // reused by a tensor
  EXPECT_EQ(nativeNameOf(0x3000, insideTheAllocatorLibrary()), 0u);
  EXPECT_EQ(nativeNameOf(0x3000, native), 0u);  // reused by a native library
  Identification id;
  id.run("libc.so");
  ASSERT_TRUE(id.found);
  std::map<uint64_t, std::string> told;
  for (const auto& [address, name] : id.early) told[address] = id.names[name];
  EXPECT_EQ(told, (std::map<uint64_t, std::string>{{0x1000, "[native] tidemark_unit_tests"},
                                                   {0x3000, "[native] tidemark_unit_tests"}}));
  // Once: a second identification tells no early block again.
  Identification again;
  again.run("libc.so");
  EXPECT_TRUE(again.early.empty());
}

TEST_F(NativeCallersTest, AnOverflowedEarlyLogTellsNothing) {
  const auto* native = reinterpret_cast<const void*>(&codeHere);
  // One allocation more than the log holds: a block at a noted address may be a later one's.
  for (uint64_t i = 0; i <= kEarlyCallers; ++i) nativeNameOf(0x1000 + 64 * i, native);
  Identification id;
  id.run("libc.so");
  ASSERT_TRUE(id.found);
  EXPECT_TRUE(id.early.empty());
  // Told apart from now on all the same.
  EXPECT_NE(nativeNameOf(0x1000, native), 0u);
}

}  // namespace
}  // namespace tidemark::agent::native_callers
