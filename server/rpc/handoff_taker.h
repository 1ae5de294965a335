#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/rpc/access.h"
#include "server/store/store.h"
#include "server/store/writer.h"
#include "tidemark/v1/ingest.pb.h"

namespace tidemark::server {

// The files of the rest of a live session that agents hand over at their exit (Ingest's
// Handoff), so that a job's exit never waits for the daemon's pace: each is sent through the
// daemon's own in-process channel, resuming its session as `tidemark upload` would, and then
// the file and its row in the store go. A file the store cannot take yet (full disk) is tried
// again later; one left by a daemon that stopped or crashed is taken up at its next start.
//
// A file is taken only from a caller whose uid the kernel gives (Unix socket, loopback; never on
// a token's word), only when it is a regular file owned by that uid, writable by no one else,
// that resumes the very session of the stream it was offered on; it is checked again (the same
// device and inode) whenever it is read. The daemon removes it once stored only when it runs as
// that uid (a daemon serving other users never deletes their files).
class HandoffTaker {
 public:
  HandoffTaker(StoreWriter& writer, Access& access);
  ~HandoffTaker();
  HandoffTaker(const HandoffTaker&) = delete;
  HandoffTaker& operator=(const HandoffTaker&) = delete;

  // Once the gRPC server runs: files go through its in-process channel; the store's pending
  // handoffs are taken up. unixSocket and tcpPort: where this daemon listens ("", 0: not
  // there), which lookAtSpools compares with the address a spool's agent was aimed at.
  void start(grpc::Server& server, const std::string& unixSocket, int tcpPort);
  // Checks the file an agent offers for its session: what to take, or why not (the agent then
  // goes on as without). *cannotOpen: refused because the file could not be opened where it lies.
  absl::StatusOr<HandoffRow> accept(int64_t session, uid_t uid, const std::string& path,
                                    bool* cannotOpen);
  // Sends a file on a thread of its own (resuming its session ends the agent's stream), one at a
  // time per session; `recorded`: its row is in the store already, else it is written first.
  // Session 0: a spool of a run that never got a session (lookAtSpools), sent as the new
  // session it begins; no row. False when not taken now (stopping, or that session's file is
  // being sent).
  bool take(const HandoffRow& row, bool recorded = false);
  // The rest of a live session's run that its agent left in a file of this daemon's own user —
  // its spool, or a handoff file — when that agent's process has gone: found in the user's
  // handoff and spool directories (a name of the session's pid), beginning with the handshake
  // resuming the session from the process that recorded it, or with the new session's handshake
  // it sent again, its number (Handshake.agent_instance) one `madeFor` says made this session
  // (an exit before its first handshake was answered). nullopt when there is none.
  std::optional<HandoffRow> leftBehind(int64_t session,
                                       const std::function<bool(uint64_t instance)>& madeFor);
  // The spools in this user's spool directory of jobs that have exited (kill(pid, 0): no such
  // process), looked at now and then (IngestService):
  // - a job that never got a session from this daemon — its first handshake had not reached it
  //   when the job exited (a daemon loaded by many jobs at once): its spool, whose handshake says
  //   it was aimed at this daemon's address, from a process of this host that started after
  //   this daemon, and for which no session was made (`sessionMadeFor`, by its
  //   Handshake.agent_instance: such a spool is the rest of that session, leftBehind's), is
  //   taken up as `tidemark upload` would, as the session it begins, and removed once stored;
  // - a spool that adds nothing: the rest of a session of this user that ended whole (its
  //   goodbye came, every event sent stored, none dropped) from the same process — an exit
  //   that gave up waiting for the daemon's answer after the daemon had the whole run, by its
  //   stream or a handed-over file — is removed (an upload would only repeat the run).
  // Each file is read once, until it is dealt with or found to be neither; one whose process
  // still runs is looked at again at the next call. While the directory is unchanged (its
  // modification time), a call looks at those alone: a stat of the directory, not a read of
  // each file there. Called from one thread.
  void lookAtSpools(const std::function<bool(uint64_t instance)>& sessionMadeFor);
  // For tests: how many calls looked, at how many files, and how many of them they read.
  uint64_t spoolLooks() const { return m_spoolLooks; }
  uint64_t spoolsLookedAt() const { return m_spoolsLookedAt; }
  uint64_t spoolsRead() const { return m_spoolsRead; }
  // Called when a session's file is taken (before it is sent), and when done with it (stored, or
  // given up; not when stopped).
  void setFileTaken(std::function<void(int64_t session)> taken) { m_fileTaken = std::move(taken); }
  void setFileDone(std::function<void(int64_t session)> done) { m_fileDone = std::move(done); }
  // Stops sending (what was sent is committed, the rest is taken up at the next start).
  void stop();

 private:
  void run(const HandoffRow& row);
  // Files of live sessions in this user's own handoff and spool directories that no row names.
  std::vector<HandoffRow> unrecordedHandoffs(const std::set<std::string>& known);
  // Whether a spool resuming `session` from the process of `hello` adds nothing to it: a session
  // of this daemon's user, recorded by that process, that ended whole.
  bool addsNothing(int64_t session, const v1::Handshake& hello);
  // Waits up to `ms` unless stopped; false when stopped.
  bool pause(int ms);

  StoreWriter& m_writer;
  Access& m_access;
  std::function<void(int64_t)> m_fileTaken;
  std::function<void(int64_t)> m_fileDone;
  std::string m_secret;
  std::shared_ptr<grpc::Channel> m_channel;
  std::atomic<bool> m_started{false};  // start() set the channel, a secret and the addresses
  std::atomic<bool> m_stopping{false};
  std::mutex m_mutex;
  std::condition_variable m_wake;
  struct Taking {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Taking> m_threads;
  std::set<int64_t> m_taking;  // sessions whose file is being sent (0: an unanswered spool's)
  // Where this daemon listens and since when (base::wallNs), for lookAtSpools; the spools
  // (device, inode) it dealt with or found not to be its to deal with.
  std::string m_unixSocket;
  int m_tcpPort = 0;
  int64_t m_startWallNs = 0;
  std::set<std::pair<int64_t, int64_t>> m_spoolsSeen;  // of files still there at the last look
  struct DirectoryStamp {
    int64_t device = 0, inode = 0, mtimeNs = 0;
    bool operator==(const DirectoryStamp&) const = default;
  };
  DirectoryStamp m_spoolDir;               // the spool directory at the last look
  bool m_spoolDirSettled = false;          // its last change was over a second before that look
  std::vector<std::string> m_spoolsAgain;  // to look at again (a process that still runs)
  std::atomic<uint64_t> m_spoolLooks{0}, m_spoolsLookedAt{0}, m_spoolsRead{0};
  std::mutex m_sendMutex;  // held while a file is sent: one at a time
};

}  // namespace tidemark::server
