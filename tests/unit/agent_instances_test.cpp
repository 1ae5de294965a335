// The daemon's memory of new sessions by their agent's number (server/rpc/agent_instances.h):
// the first handshake with a number makes the session, one sent again finds it (waiting while it
// is being made), another owner or number does not, and a number whose making failed is free.
#include "server/rpc/agent_instances.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

namespace tidemark::server {
namespace {

using Clock = std::chrono::steady_clock;
const auto kWanted = [] { return true; };

TEST(AgentInstancesTest, AHandshakeSentAgainFindsTheSessionItsFirstMade) {
  AgentInstances instances;
  AgentInstances::Found first = instances.claim(1000, 42, Clock::now(), kWanted);
  EXPECT_TRUE(first.claimed);
  instances.made(1000, 42, 7);
  AgentInstances::Found again = instances.claim(1000, 42, Clock::now(), kWanted);
  EXPECT_FALSE(again.claimed);
  EXPECT_EQ(again.session, 7);
  // Another user's number, or another number of the same user: sessions of their own.
  EXPECT_TRUE(instances.claim(1001, 42, Clock::now(), kWanted).claimed);
  EXPECT_TRUE(instances.claim(1000, 43, Clock::now(), kWanted).claimed);
}

TEST(AgentInstancesTest, AHandshakeWaitsWhileTheFirstIsStillMakingTheSession) {
  AgentInstances instances;
  ASSERT_TRUE(instances.claim(1000, 42, Clock::now(), kWanted).claimed);
  auto waiting = std::async(std::launch::async, [&] {
    return instances.claim(1000, 42, Clock::now() + std::chrono::seconds(30), kWanted);
  });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  instances.made(1000, 42, 9);
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const AgentInstances::Found found = waiting.get();
  EXPECT_FALSE(found.claimed);
  EXPECT_EQ(found.session, 9);
}

TEST(AgentInstancesTest, AWaitEndsAtItsDeadlineOrWhenItsStreamIsGone) {
  AgentInstances instances;
  ASSERT_TRUE(instances.claim(1000, 42, Clock::now(), kWanted).claimed);
  const auto begun = Clock::now();
  AgentInstances::Found late =
      instances.claim(1000, 42, Clock::now() + std::chrono::milliseconds(300), kWanted);
  EXPECT_FALSE(late.claimed);
  EXPECT_EQ(late.session, 0);
  EXPECT_GE(Clock::now() - begun, std::chrono::milliseconds(300));
  AgentInstances::Found gone =
      instances.claim(1000, 42, Clock::now() + std::chrono::seconds(30), [] { return false; });
  EXPECT_FALSE(gone.claimed);
  EXPECT_EQ(gone.session, 0);
}

TEST(AgentInstancesTest, ANumberWhoseSessionWasNotMadeIsFreeAgain) {
  AgentInstances instances;
  ASSERT_TRUE(instances.claim(1000, 42, Clock::now(), kWanted).claimed);
  instances.made(1000, 42, 0);  // the store refused the session
  EXPECT_TRUE(instances.claim(1000, 42, Clock::now(), kWanted).claimed);
}

TEST(AgentInstancesTest, TheOldestNumbersAreForgottenPastTheBound) {
  AgentInstances instances;
  for (uint64_t n = 1; n <= AgentInstances::kMaxEntries + 10; ++n) {
    ASSERT_TRUE(instances.claim(1000, n, Clock::now(), kWanted).claimed);
    instances.made(1000, n, static_cast<int64_t>(n));
  }
  EXPECT_TRUE(instances.claim(1000, 1, Clock::now(), kWanted).claimed);  // forgotten
  AgentInstances::Found recent =
      instances.claim(1000, AgentInstances::kMaxEntries + 10, Clock::now(), kWanted);
  EXPECT_FALSE(recent.claimed);
  EXPECT_EQ(recent.session, static_cast<int64_t>(AgentInstances::kMaxEntries + 10));
}

}  // namespace
}  // namespace tidemark::server
