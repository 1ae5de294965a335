// When the daemon closes a detached session, and when it first looks for the rest of its run in a
// file (server/rpc/resumable_sessions.h): a session whose process is gone is looked at once
// (closed unless the rest is found), one whose rest is being taken up waits for it, one found at
// start waits its whole grace after that look, one whose process lives waits its grace.
#include "server/rpc/resumable_sessions.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "src/base/host_name.h"
#include "tests/support/exited_pid.h"

namespace tidemark::server {
namespace {

// Past the 2 s a gone process is given to come back.
void pastTheGoneProcessGrace() { std::this_thread::sleep_for(std::chrono::milliseconds(2300)); }

// A session held by a stream that then broke, its process `pid` on this host.
void brokenStream(ResumableSessions& sessions, int64_t id, int32_t pid) {
  grpc::ServerContext context;
  sessions.hold(id, &context);
  sessions.release(id, true, pid, base::hostName());
}

TEST(ResumableSessionsTest, AGoneProcessIsLookedAtOnceThenItsRestWaitsAsAHandedOverFile) {
  ResumableSessions sessions(std::chrono::seconds(600));
  brokenStream(sessions, 7, test_support::exitedPid());
  EXPECT_TRUE(sessions.takeExpired().empty()) << "closed before the gone process's grace";
  pastTheGoneProcessGrace();
  std::vector<ResumableSessions::Expired> expired = sessions.takeExpired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].id, 7);
  EXPECT_TRUE(expired[0].processGone);
  EXPECT_TRUE(expired[0].due);
  EXPECT_TRUE(sessions.takeExpired().empty()) << "taken twice";
  // Its rest was found in a file: it waits for that, not for its (gone) process.
  sessions.restTakenUp(7);
  pastTheGoneProcessGrace();
  EXPECT_TRUE(sessions.takeExpired().empty());
  // Done with the file and still live (the file ended early): closed at once, not looked at
  // again.
  sessions.fileDone(7);
  expired = sessions.takeExpired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_FALSE(expired[0].processGone);
  EXPECT_TRUE(expired[0].due);
}

TEST(ResumableSessionsTest, AHandedOverFileThatCouldNotBeTakenLeavesOneLookForTheSpool) {
  ResumableSessions sessions(std::chrono::seconds(600));
  brokenStream(sessions, 8, test_support::exitedPid());
  sessions.markHandedOver(8);
  pastTheGoneProcessGrace();
  EXPECT_TRUE(sessions.takeExpired().empty()) << "the handed-over file is waited for";
  sessions.fileDone(8);  // gone before the daemon opened it: the agent spooled instead
  const std::vector<ResumableSessions::Expired> expired = sessions.takeExpired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_TRUE(expired[0].processGone);
}

TEST(ResumableSessionsTest, FoundAtStartItIsLookedAtOnceAndWaitsItsGrace) {
  ResumableSessions sessions(std::chrono::seconds(4));
  sessions.detachAtStart(9, test_support::exitedPid(), base::hostName());
  sessions.detachAtStart(10, static_cast<int32_t>(::getpid()), base::hostName());  // lives
  pastTheGoneProcessGrace();
  std::vector<ResumableSessions::Expired> expired = sessions.takeExpired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].id, 9);
  EXPECT_TRUE(expired[0].processGone);
  EXPECT_FALSE(expired[0].due) << "its agent may have spooled elsewhere: `tidemark upload`";
  sessions.keepWaiting(9);
  EXPECT_TRUE(sessions.takeExpired().empty()) << "looked at twice";
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // the 4 s grace passed
  expired = sessions.takeExpired();
  ASSERT_EQ(expired.size(), 2u);
  for (const ResumableSessions::Expired& e : expired) {
    EXPECT_TRUE(e.due) << e.id;
    EXPECT_FALSE(e.processGone) << e.id;  // 9 looked at already, 10 alive
  }
}

// Its rest is being taken from a file while the store cannot be written (a full disk) for longer
// than the grace: the session waits for the file, not for the grace — closed first, the rest
// would be refused and become a second session. Once the taker is done, the grace closes it.
TEST(ResumableSessionsTest, TheGraceDoesNotCloseASessionWhoseFileIsBeingTaken) {
  ResumableSessions sessions(std::chrono::seconds(0));  // every grace has passed
  brokenStream(sessions, 10, ::getpid());               // its process lives
  sessions.markHandedOver(10);
  EXPECT_TRUE(sessions.takeExpired().empty()) << "closed while its file is being taken";
  sessions.fileDone(10);
  const std::vector<ResumableSessions::Expired> expired = sessions.takeExpired();
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].id, 10);
  EXPECT_TRUE(expired[0].due);
  EXPECT_FALSE(expired[0].processGone);
}

}  // namespace
}  // namespace tidemark::server
