// base::preload*: how the agent and the CLI find the agent among LD_PRELOAD's entries, whatever
// file name it was given. Real files: a library, a copy, a link to it.
#include "src/base/preload_list.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace tidemark::base {
namespace {

class PreloadListTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / ("tidemark-preload-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    agent = (dir / "libprofiler.so").string();
    std::ofstream(agent) << "the agent";
    other = (dir / "libjemalloc.so").string();
    std::ofstream(other) << "another library";
    link = (dir / "via-link.so").string();
    std::filesystem::create_symlink(agent, link);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  std::filesystem::path dir;
  std::string agent, other, link;
};

TEST_F(PreloadListTest, AnEntryIsTheAgentByItsFileNotItsName) {
  EXPECT_TRUE(preloadEntryIs(agent, agent));
  EXPECT_TRUE(preloadEntryIs(link, agent));              // another path to the same file
  EXPECT_TRUE(preloadEntryIs("libprofiler.so", agent));  // a bare name: the loader's search
  EXPECT_FALSE(preloadEntryIs(other, agent));
  EXPECT_FALSE(preloadEntryIs("libjemalloc.so", agent));
  EXPECT_FALSE(preloadEntryIs((dir / "missing.so").string(), agent));
  EXPECT_FALSE(preloadEntryIs(agent, ""));  // the agent's own file unknown: nothing is it
  // The installed name is always the agent's, whichever file `agent` is.
  EXPECT_TRUE(preloadEntryIsAgent("/opt/x/lib/libtidemark_agent.so", agent));
  EXPECT_TRUE(preloadEntryIsAgent(link, agent));
  EXPECT_FALSE(preloadEntryIsAgent(other, agent));
}

TEST_F(PreloadListTest, TheAgentIsTakenOutAndTheOthersKeptInOrder) {
  const auto isAgent = [&](std::string_view e) { return preloadEntryIsAgent(e, agent); };
  // ':' and spaces both separate entries, as for the dynamic loader; empty entries vanish.
  const std::string preload = other + ":" + link + " /usr/lib/libfoo.so::" + agent;
  EXPECT_TRUE(preloadNames(preload.c_str(), isAgent));
  EXPECT_EQ(preloadWithout(preload.c_str(), isAgent), other + ":/usr/lib/libfoo.so");
  EXPECT_FALSE(preloadNames(other.c_str(), isAgent));
  EXPECT_EQ(preloadWithout(other.c_str(), isAgent), other);
  EXPECT_EQ(preloadWithout(agent.c_str(), isAgent), "");
  EXPECT_FALSE(preloadNames(nullptr, isAgent));
  EXPECT_EQ(preloadWithout(nullptr, isAgent), "");
}

}  // namespace
}  // namespace tidemark::base
