#include "agent/transport/spool.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "client/spool_reader.h"
#include "tidemark/v1/ingest.pb.h"

namespace tidemark::agent {
namespace {

v1::AgentMessage named(int i, size_t bytes) {
  v1::AgentMessage m;
  m.mutable_handshake()->set_session_name(std::to_string(i) + std::string(bytes, 'x'));
  return m;
}

// Runs `body` in a child process (a file size limit is the process's) and returns its wait
// status; `body` returns the child's exit code.
template <typename Body>
int inChild(Body body) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(body());
  int status = -1;
  if (child < 0 || ::waitpid(child, &status, 0) != child) return -1;
  return status;
}

TEST(SpoolWriterTest, AFileSystemThatFillsRefusesTheMessageItCannotHoldAndKeepsThoseBefore) {
  char dir[] = "/tmp/tidemark-spool-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/spool.bin";
  // In a child (the limit is the process's): a file size limit of 10,000 bytes, set after the
  // writer was made (it caps itself by the limit it finds), stands for a full file system
  // (writes past it fail with EFBIG; SIGXFSZ ignored here). Three messages of ~3,000 bytes fit,
  // the fourth does not, nor anything after it.
  const int status = inChild([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    SpoolWriter file(path, 1u << 30);
    const rlimit limit{10000, 10000};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    int code = 0;
    for (int i = 0; i < 3; ++i)
      if (!file.append(named(i, 3000))) code = 1 + i;
    if (code == 0 && file.append(named(3, 3000))) code = 10;
    if (code == 0 && file.append(named(4, 10))) code = 11;  // nothing after the failure
    if (code == 0 && file.failure().find("cannot write") == std::string::npos) code = 12;
    if (code == 0 && file.bytes() != 3 * (4 + named(0, 3000).ByteSizeLong())) code = 13;
    return code;
  });
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The three whole messages read back; the fourth's part is an end the reader names.
  client::SpoolReader reader(path);
  v1::AgentMessage m;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(reader.next(&m)) << reader.error();
    EXPECT_EQ(m.handshake().session_name(), named(i, 3000).handshake().session_name());
  }
  EXPECT_FALSE(reader.next(&m));
  EXPECT_NE(reader.error(), "");
  std::filesystem::remove_all(dir);
}

TEST(SpoolWriterTest, AFileSizeLimitCapsTheFileAndNeverEndsTheJob) {
  // A job run under `ulimit -f`: a write past the limit would raise SIGXFSZ, whose default ends
  // the process. The writer made under the limit refuses what would pass it instead.
  char dir[] = "/tmp/tidemark-spool-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/spool.bin";
  const int status = inChild([&] {
    const rlimit limit{10000, 10000};
    ::setrlimit(RLIMIT_FSIZE, &limit);
    SpoolWriter file(path, 1u << 30);
    int code = 0;
    for (int i = 0; i < 3; ++i)
      if (!file.append(named(i, 3000))) code = 1 + i;
    if (code == 0 && file.append(named(3, 3000))) code = 10;
    return code;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_LE(std::filesystem::file_size(path), 10000u);
  client::SpoolReader reader(path);
  v1::AgentMessage m;
  int read = 0;
  while (reader.next(&m)) ++read;
  EXPECT_EQ(read, 3);
  EXPECT_EQ(reader.error(), "");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tidemark::agent
