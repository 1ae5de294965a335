// agent::jobMemberFrom / isLauncherOnly: which job a process is a rank of, from the variables
// launchers set (docs/jobs.md).
#include "agent/job_member.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace tidemark::agent {
namespace {

// A process's environment, as getenv reads it.
struct Env {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> reader() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(JobMemberTest, TheKeyComesFromTheNameTheRunIdOrTheMasterAddress) {
  v1::JobMember m;
  EXPECT_FALSE(jobMemberFrom(Env{}.reader(), &m));                 // a process of its own
  EXPECT_FALSE(jobMemberFrom(Env{{{"RANK", "3"}}}.reader(), &m));  // a rank of no known job
  // torchrun without a rendezvous id says "none": no key, the master address is.
  Env torchrun{{{"TORCHELASTIC_RUN_ID", "none"},
                {"MASTER_ADDR", "10.0.0.1"},
                {"MASTER_PORT", "29500"},
                {"RANK", "3"},
                {"LOCAL_RANK", "1"},
                {"WORLD_SIZE", "8"}}};
  ASSERT_TRUE(jobMemberFrom(torchrun.reader(), &m));
  EXPECT_EQ(m.key(), "10.0.0.1:29500");
  EXPECT_EQ(m.rank(), 3);
  EXPECT_EQ(m.local_rank(), 1);
  EXPECT_EQ(m.world_size(), 8);
  torchrun.vars["TORCHELASTIC_RUN_ID"] = "4e1c-run";
  ASSERT_TRUE(jobMemberFrom(torchrun.reader(), &m));
  EXPECT_EQ(m.key(), "4e1c-run");
  torchrun.vars["TIDEMARK_JOB"] = "sweep-7";  // `tidemark run --job` wins
  ASSERT_TRUE(jobMemberFrom(torchrun.reader(), &m));
  EXPECT_EQ(m.key(), "sweep-7");
  // An address without a port is no key.
  EXPECT_FALSE(jobMemberFrom(Env{{{"MASTER_ADDR", "10.0.0.1"}}}.reader(), &m));
}

TEST(JobMemberTest, MalformedPlacesAreUnknownAndLongKeysCut) {
  v1::JobMember m;
  Env env{{{"TIDEMARK_JOB", std::string(300, 'k')},
           {"RANK", "x3"},
           {"LOCAL_RANK", "-1"},
           {"WORLD_SIZE", "99999999999"}}};
  ASSERT_TRUE(jobMemberFrom(env.reader(), &m));
  EXPECT_EQ(m.key().size(), 256u);  // what the daemon takes
  EXPECT_EQ(m.rank(), -1);
  EXPECT_EQ(m.local_rank(), -1);
  EXPECT_EQ(m.world_size(), 0);
}

TEST(JobMemberTest, OnlyTheLauncherItselfIsLeftUnrecorded) {
  EXPECT_FALSE(isLauncherOnly(Env{}.reader()));
  EXPECT_TRUE(isLauncherOnly(Env{{{"TIDEMARK_LAUNCHER", "1"}}}.reader()));
  // The ranks it starts inherit the mark and have a RANK: they record.
  EXPECT_FALSE(isLauncherOnly(Env{{{"TIDEMARK_LAUNCHER", "1"}, {"RANK", "0"}}}.reader()));
  EXPECT_FALSE(isLauncherOnly(Env{{{"TIDEMARK_LAUNCHER", "0"}}}.reader()));
}

}  // namespace
}  // namespace tidemark::agent
