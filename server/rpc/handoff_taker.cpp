#include "server/rpc/handoff_taker.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>

#include "client/spool_upload.h"
#include "server/rpc/agent_identity.h"
#include "server/store/store.h"
#include "src/base/clock.h"
#include "src/base/daemon_address.h"
#include "src/base/host_name.h"
#include "src/base/private_dir.h"
#include "tidemark/v1/query.pb.h"

namespace tidemark::server {

namespace {

// The file as handed over: opened without following a link, a regular file of `uid` that no one
// else may write, the same file (device, inode) as recorded when known. Returns its descriptor.
absl::StatusOr<int> openHandedFile(const std::string& path, uid_t uid,
                                   std::optional<std::pair<int64_t, int64_t>> same,
                                   struct stat* info) {
  if (path.empty() || path[0] != '/') return absl::InvalidArgumentError("not an absolute path");
  // Non-blocking: a FIFO put there must not hold the daemon.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError("cannot open " + path + ": " + std::strerror(errno));
  auto refuse = [&](const std::string& why) {
    ::close(fd);
    return absl::PermissionDeniedError(path + " " + why);
  };
  if (::fstat(fd, info) != 0) return refuse("cannot be examined");
  if (!S_ISREG(info->st_mode)) return refuse("is not a regular file");
  if (info->st_uid != uid) {
    return refuse("belongs to uid " + std::to_string(info->st_uid) + ", not to uid " +
                  std::to_string(uid) + " who handed it over");
  }
  if ((info->st_mode & (S_IWGRP | S_IWOTH)) != 0) return refuse("is writable by others");
  if (same && (static_cast<int64_t>(info->st_dev) != same->first ||
               static_cast<int64_t>(info->st_ino) != same->second)) {
    return refuse("is not the file that was handed over (replaced since)");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) return refuse("cannot be read");
  return fd;
}

// Its first message, a handshake: the session it resumes.
absl::StatusOr<int64_t> readHandshake(client::SpoolReader& reader, v1::AgentMessage* first) {
  if (!reader.ok()) return absl::DataLossError(reader.error());
  if (!reader.next(first) || !first->has_handshake()) {
    return absl::InvalidArgumentError("not a tidemark spool file" +
                                      (reader.error().empty() ? "" : ": " + reader.error()));
  }
  return static_cast<int64_t>(first->handshake().resume_session_id());
}

// Its first message: the handshake resuming `session` — or, when `store` is given, the rest of
// a run whose first handshake was never answered: the new session's handshake of the process
// that recorded `session`, with the number its agent drew (the daemon's handshake finds the
// session by it; HandoffTaker::leftBehind checked that number).
absl::Status checkResumes(client::SpoolReader& reader, int64_t session, v1::AgentMessage* first,
                          const std::string* store = nullptr) {
  auto resumes = readHandshake(reader, first);
  if (!resumes.ok()) return resumes.status();
  if (session == 0) {  // a run that never got a session: the new session it begins
    if (*resumes == 0) return absl::OkStatus();
    return absl::InvalidArgumentError("it continues session " + std::to_string(*resumes) +
                                      ", it does not begin one");
  }
  if (store != nullptr && *resumes == 0 && first->handshake().agent_instance() != 0) {
    auto record = Store::getSession(*store, session);
    if (!record.ok()) return record.status();
    return sameAgent(first->handshake(), record->header, session);
  }
  if (*resumes != session) {
    return absl::InvalidArgumentError("it continues session " + std::to_string(*resumes) +
                                      ", not session " + std::to_string(session));
  }
  return absl::OkStatus();
}

// A directory of this daemon's own user that no one else may enter.
bool ownPrivateDirectory(const std::string& dir) {
  struct stat info {};
  return !dir.empty() && ::lstat(dir.c_str(), &info) == 0 && S_ISDIR(info.st_mode) &&
         info.st_uid == ::geteuid() && (info.st_mode & 077) == 0;
}

// The agent's two places for the rest of a run (base::defaultHandoffDirectory, else the spool
// directory).
std::vector<std::string> ownFileDirectories() {
  std::vector<std::string> out;
  for (const std::string& dir : {base::defaultHandoffDirectory(), base::defaultSpoolDirectory()})
    if (ownPrivateDirectory(dir)) out.push_back(dir);
  return out;
}

// Files of `dir` whose name begins with one of `prefixes`.
std::vector<std::string> filesNamed(const std::string& dir,
                                    const std::vector<std::string>& prefixes) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    for (const std::string& prefix : prefixes) {
      if (name.rfind(prefix, 0) == 0) {
        out.push_back(entry.path().string());
        break;
      }
    }
  }
  return out;
}

// A file of this daemon's own user in one of its directories (openHandedFile's checks), and the
// handshake it begins with.
struct OwnFile {
  std::string path;
  struct stat info {};
  v1::Handshake hello;
  HandoffRow row(int64_t session) const {
    return {session, path, static_cast<int64_t>(::geteuid()), static_cast<int64_t>(info.st_dev),
            static_cast<int64_t>(info.st_ino)};
  }
};
std::optional<OwnFile> ownFile(const std::string& path) {
  OwnFile file;
  file.path = path;
  auto fd = openHandedFile(path, ::geteuid(), std::nullopt, &file.info);
  if (!fd.ok()) return std::nullopt;
  client::SpoolReader reader(*fd);
  v1::AgentMessage first;
  if (!readHandshake(reader, &first).ok()) return std::nullopt;
  file.hello = first.handshake();
  return file;
}

// OK when the session is live in the store, and recorded by the process whose file begins with
// `hello` (a spool file of another store's session of the same number is not its rest): it
// still waits for the rest.
absl::Status sessionWaits(const std::string& store, int64_t session, const v1::Handshake& hello) {
  auto record = Store::getSession(store, session);
  if (!record.ok()) return record.status();
  if (absl::Status same = sameAgent(hello, record->header, session); !same.ok()) return same;
  if (record->state != v1::SESSION_STATE_LIVE) {
    return absl::FailedPreconditionError("session " + std::to_string(session) + " has ended");
  }
  return absl::OkStatus();
}

// Removes the file at `path` if it is still the one `info` describes (the same device and
// inode); true when removed.
bool removeIfSame(const std::string& path, const struct stat& info) {
  struct stat now {};
  return ::lstat(path.c_str(), &now) == 0 && now.st_dev == info.st_dev &&
         now.st_ino == info.st_ino && ::unlink(path.c_str()) == 0;
}

// Its session in `store` ended whole (endedWhole).
bool sessionEndedWhole(const std::string& store, int64_t session) {
  auto record = Store::getSession(store, session);
  return record.ok() && endedWhole(*record);
}

}  // namespace

HandoffTaker::HandoffTaker(StoreWriter& writer, Access& access)
    : m_writer(writer), m_access(access), m_startWallNs(base::wallNs()) {}

HandoffTaker::~HandoffTaker() { stop(); }

void HandoffTaker::start(grpc::Server& server, const std::string& unixSocket, int tcpPort) {
  m_unixSocket = unixSocket;
  m_tcpPort = tcpPort;
  m_secret = m_access.makeInternalSecret();
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(static_cast<int>(client::SpoolReader::kMaxMessageBytes) + 1024);
  m_channel = server.InProcessChannel(args);
  // From here on the RPC threads (accept) and the sweeper (lookAtSpools), which run before this
  // start, may read the channel, the secret and the addresses (no secret: no file is taken).
  m_started.store(!m_secret.empty(), std::memory_order_release);
  auto pending = Store::pendingHandoffs(m_writer.path(), m_writer.daemonName());
  if (!pending.ok()) {
    std::fprintf(stderr, "tidemarkd: cannot read the handed-over files to take up: %s\n",
                 std::string(pending.status().message()).c_str());
    return;
  }
  std::set<std::string> known;
  for (const HandoffRow& row : *pending) {
    std::fprintf(stderr, "tidemarkd: session %lld: taking up the file its agent handed over (%s)\n",
                 static_cast<long long>(row.sessionId), row.path.c_str());
    known.insert(row.path);
    take(row, true);
  }
  // A daemon stopped between its yes to an agent and the row's commit left a file of a live
  // session its row does not name: in this user's own handoff or spool directory, found here.
  for (const HandoffRow& row : unrecordedHandoffs(known)) {
    std::fprintf(stderr, "tidemarkd: session %lld: taking up the file its agent handed over (%s)\n",
                 static_cast<long long>(row.sessionId), row.path.c_str());
    take(row, false);
  }
}

std::vector<HandoffRow> HandoffTaker::unrecordedHandoffs(const std::set<std::string>& known) {
  std::vector<HandoffRow> out;
  for (const std::string& dir : ownFileDirectories()) {
    for (const std::string& path : filesNamed(dir, {"tidemark-handoff-"})) {
      if (known.count(path) != 0) continue;
      std::optional<OwnFile> file = ownFile(path);
      if (!file || file->hello.resume_session_id() == 0) continue;
      const auto session = static_cast<int64_t>(file->hello.resume_session_id());
      // Its session still waits for the rest, and is this user's.
      if (!sessionWaits(m_writer.path(), session, file->hello).ok() ||
          m_access.ownerOf(session).value_or(std::nullopt) != std::optional<uid_t>(::geteuid())) {
        continue;
      }
      out.push_back(file->row(session));
    }
  }
  return out;
}

std::optional<HandoffRow> HandoffTaker::leftBehind(
    int64_t session, const std::function<bool(uint64_t instance)>& madeFor) {
  if (!m_started.load(std::memory_order_acquire)) return std::nullopt;  // nothing could take it
  if (m_access.ownerOf(session).value_or(std::nullopt) != std::optional<uid_t>(::geteuid())) {
    return std::nullopt;  // another user's: their files are theirs to upload
  }
  auto record = Store::getSession(m_writer.path(), session);
  if (!record.ok() || record->state != v1::SESSION_STATE_LIVE) return std::nullopt;
  const std::string pid = std::to_string(record->header.pid) + "-";
  for (const std::string& dir : ownFileDirectories()) {
    for (const std::string& path :
         filesNamed(dir, {"tidemark-spool-" + pid, "tidemark-handoff-" + pid})) {
      std::optional<OwnFile> file = ownFile(path);
      if (!file) continue;
      const v1::Handshake& hello = file->hello;
      const auto resumes = static_cast<int64_t>(hello.resume_session_id());
      const bool itsRest = resumes == session || (resumes == 0 && hello.agent_instance() != 0 &&
                                                  madeFor(hello.agent_instance()));
      if (itsRest && sameAgent(hello, record->header, session).ok()) return file->row(session);
    }
  }
  return std::nullopt;
}

void HandoffTaker::lookAtSpools(const std::function<bool(uint64_t instance)>& sessionMadeFor) {
  if (!m_started.load(std::memory_order_acquire)) return;
  const std::string dir = base::defaultSpoolDirectory();
  if (!ownPrivateDirectory(dir)) return;
  // The directory unchanged since a look that was not too close to its last change (a file
  // made in the same tick of the file system's clock leaves its time as it was): only the files
  // that look left to look at again. So a directory of many spools that are not this daemon's
  // to deal with costs a stat every call, not a read of each.
  struct stat dirInfo {};
  if (::stat(dir.c_str(), &dirInfo) != 0) return;
  const DirectoryStamp stamp{
      static_cast<int64_t>(dirInfo.st_dev), static_cast<int64_t>(dirInfo.st_ino),
      static_cast<int64_t>(dirInfo.st_mtim.tv_sec) * 1000000000 + dirInfo.st_mtim.tv_nsec};
  const bool unchanged = m_spoolDirSettled && stamp == m_spoolDir;
  std::vector<std::string> paths;
  if (unchanged) {
    paths.swap(m_spoolsAgain);
  } else {
    paths = filesNamed(dir, {"tidemark-spool-"});
    m_spoolsAgain.clear();
  }
  m_spoolDir = stamp;
  m_spoolDirSettled = base::wallNs() - stamp.mtimeNs > 1000000000;
  m_spoolsLookedAt += paths.size();
  ++m_spoolLooks;
  const std::string host = base::hostName();
  std::set<std::pair<int64_t, int64_t>> seen;  // of the files there now (bounds the set)
  for (const std::string& path : paths) {
    struct stat info {};
    if (::lstat(path.c_str(), &info) != 0) continue;
    const std::pair<int64_t, int64_t> key{static_cast<int64_t>(info.st_dev),
                                          static_cast<int64_t>(info.st_ino)};
    if (m_spoolsSeen.count(key) != 0) {
      seen.insert(key);
      continue;
    }
    auto dealtWith = [&] { seen.insert(key); };
    // tidemark-spool-<pid>-<ms>.bin: a process that still runs may still be writing it.
    const std::string name = std::filesystem::path(path).filename().string();
    const long pid = std::strtol(name.c_str() + std::strlen("tidemark-spool-"), nullptr, 10);
    if (pid <= 0) {
      dealtWith();
      continue;
    }
    if (!(::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
      m_spoolsAgain.push_back(path);
      continue;
    }
    ++m_spoolsRead;
    std::optional<OwnFile> file = ownFile(path);
    if (!file || file->hello.pid() != pid || file->hello.hostname() != host) {
      dealtWith();
      continue;
    }
    const v1::Handshake& hello = file->hello;
    if (hello.resume_session_id() != 0) {
      dealtWith();
      const auto session = static_cast<int64_t>(hello.resume_session_id());
      if (addsNothing(session, hello) && removeIfSame(path, info)) {
        std::fprintf(stderr,
                     "tidemarkd: session %lld: removed %s, the spool of its process (pid %ld): "
                     "the session has ended whole, with every event the spool holds\n",
                     static_cast<long long>(session), path.c_str(), pid);
      }
      continue;
    }
    const bool unanswered =
        hello.start_wall_ns() >= m_startWallNs &&
        base::reachesDaemonAt(hello.server_address(), m_unixSocket, m_tcpPort) &&
        (hello.agent_instance() == 0 || !sessionMadeFor(hello.agent_instance()));
    if (!unanswered) {
      dealtWith();
      continue;
    }
    if (!take(file->row(0), true)) {  // another is being sent: at the next call
      m_spoolsAgain.push_back(path);
      continue;
    }
    dealtWith();
    std::fprintf(stderr,
                 "tidemarkd: taking up %s, the spool of a job (pid %ld) that exited before its "
                 "first handshake reached this daemon\n",
                 path.c_str(), pid);
  }
  // The files looked at now and those dealt with before that are still there; a look at the
  // files to look at again keeps the rest.
  if (unchanged) {
    m_spoolsSeen.insert(seen.begin(), seen.end());
  } else {
    m_spoolsSeen.swap(seen);
  }
}

bool HandoffTaker::addsNothing(int64_t session, const v1::Handshake& hello) {
  if (m_access.ownerOf(session).value_or(std::nullopt) != std::optional<uid_t>(::geteuid())) {
    return false;
  }
  auto record = Store::getSession(m_writer.path(), session);
  return record.ok() && sameAgent(hello, record->header, session).ok() && endedWhole(*record);
}

absl::StatusOr<HandoffRow> HandoffTaker::accept(int64_t session, uid_t uid, const std::string& path,
                                                bool* cannotOpen) {
  *cannotOpen = false;
  if (!m_started.load(std::memory_order_acquire)) {
    return absl::UnavailableError("this tidemarkd takes no handed-off file now");
  }
  struct stat info {};
  auto fd = openHandedFile(path, uid, std::nullopt, &info);
  if (!fd.ok()) {
    *cannotOpen = absl::IsNotFound(fd.status());
    return fd.status();
  }
  client::SpoolReader reader(*fd);
  v1::AgentMessage first;
  if (auto s = checkResumes(reader, session, &first); !s.ok()) return s;
  if (auto s = sessionWaits(m_writer.path(), session, first.handshake()); !s.ok()) return s;
  return HandoffRow{session, path, static_cast<int64_t>(uid), static_cast<int64_t>(info.st_dev),
                    static_cast<int64_t>(info.st_ino)};
}

bool HandoffTaker::take(const HandoffRow& row, bool recorded) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (m_stopping || !m_taking.insert(row.sessionId).second) return false;  // one a session
  if (row.sessionId != 0 && m_fileTaken) m_fileTaken(row.sessionId);
  // Recorded for a restart (queued before anything the file brings, so committed before it);
  // the agent is not kept waiting for it: a long commit of other sessions may be under way.
  if (!recorded) m_writer.post([row](Store& s) { return s.addHandoff(row); });
  // Threads of files taken before are joined here (a long-lived daemon keeps none).
  for (auto it = m_threads.begin(); it != m_threads.end();) {
    if (it->done->load()) {
      it->thread.join();
      it = m_threads.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  m_threads.push_back({std::thread([this, row, done] {
                         pthread_setname_np(pthread_self(), "td-handoff");
                         run(row);
                         if (!m_stopping && m_fileDone && row.sessionId != 0) {
                           m_fileDone(row.sessionId);
                         }
                         {
                           std::lock_guard<std::mutex> lock(m_mutex);
                           m_taking.erase(row.sessionId);
                         }
                         done->store(true);
                       }),
                       done});
  return true;
}

bool HandoffTaker::pause(int ms) {
  std::unique_lock<std::mutex> lock(m_mutex);
  return !m_wake.wait_for(lock, std::chrono::milliseconds(ms),
                          [this] { return m_stopping.load(); });
}

void HandoffTaker::run(const HandoffRow& handed) {
  const int64_t session = handed.sessionId;
  const HandoffRow* row = &handed;
  // What the log calls it: its session, or the spool of a run that never got one.
  const std::string whose =
      session != 0 ? "session " + std::to_string(session) : "the spool " + handed.path;
  auto forget = [&] {
    if (session != 0) m_writer.post([session](Store& s) { return s.removeHandoff(session); });
  };
  int backoffMs = 5000;
  while (!m_stopping) {
    struct stat info {};
    const auto uid = static_cast<uid_t>(row->ownerUid);
    auto fd = openHandedFile(row->path, uid, std::make_pair(row->device, row->inode), &info);
    v1::AgentMessage first;
    std::optional<client::SpoolReader> reader;
    absl::Status usable = fd.status();
    if (fd.ok()) {
      reader.emplace(*fd);
      usable = checkResumes(*reader, session, &first, &m_writer.path());
    }
    if (!usable.ok()) {
      // Gone or changed: nothing more to take; the session is closed as its agent left it.
      std::fprintf(stderr, "tidemarkd: %s: cannot take the file its agent handed over: %s\n",
                   whose.c_str(), std::string(usable.message()).c_str());
      forget();
      return;
    }
    // One file sent at a time: the daemon's time goes to live agents first.
    std::unique_lock<std::mutex> sending(m_sendMutex);
    if (m_stopping) return;
    client::SpoolUpload options;
    options.newSessionIfClosed = false;
    options.metadata = {{Access::kInternalKey, m_secret},
                        {Access::kOnBehalfKey, std::to_string(row->ownerUid)}};
    options.stop = &m_stopping;
    // The rest of a run whose first handshake was never answered begins with that new session's
    // handshake: it continues the session made for it (checkResumes said so) — by its number on
    // the daemon that made it, which may have been the one before this one: named here.
    if (session != 0) first.mutable_handshake()->set_resume_session_id(session);
    const client::SpoolUploadResult sent = client::uploadSpool(m_channel, *reader, first, options);
    sending.unlock();
    // Cut short by the daemon's stop: the rest at the next start. (Sent whole just before the
    // stop, it is done with: left there, the next start would take it up again.)
    if (!sent.status.ok() && m_stopping) return;
    // Removed by the daemon only when it is that user's own (and still the same file).
    const auto removeFile = [&] {
      if (::geteuid() == uid && removeIfSame(row->path, info)) return;
      struct stat now {};
      if (::lstat(row->path.c_str(), &now) == 0 && now.st_dev == info.st_dev &&
          now.st_ino == info.st_ino) {
        std::fprintf(stderr, "tidemarkd: %s is left for its owner to remove\n", row->path.c_str());
      }
    };
    if (sent.alreadyWhole || (!sent.status.ok() && sessionEndedWhole(m_writer.path(), session))) {
      // The goodbye was on its stream before the agent decided to hand off (an exit at the
      // moment its second ran out): the stream delivered everything, the file adds nothing.
      forget();
      std::fprintf(stderr,
                   "tidemarkd: session %lld: its stream delivered every event before it ended; "
                   "the file its agent handed over as well adds nothing and is removed\n",
                   static_cast<long long>(session));
      removeFile();
      return;
    }
    if (sent.status.ok() && session == 0) {
      std::fprintf(stderr, "tidemarkd: session %llu: made from %s, %llu events stored%s%s%s\n",
                   static_cast<unsigned long long>(sent.sessionId), row->path.c_str(),
                   static_cast<unsigned long long>(sent.events),
                   sent.readError.empty() ? "" : " (the file ended early: ", sent.readError.c_str(),
                   sent.readError.empty() ? "" : ")");
      removeFile();
      return;
    }
    if (sent.status.ok()) {
      forget();
      std::fprintf(
          stderr,
          "tidemarkd: session %lld: the %llu events its agent handed over are stored%s%s%s\n",
          static_cast<long long>(session), static_cast<unsigned long long>(sent.events),
          sent.readError.empty() ? "" : " (the file ended early: ", sent.readError.c_str(),
          sent.readError.empty() ? "" : ")");
      removeFile();
      return;
    }
    if (sent.status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      // The store cannot be written yet (a full disk): tried again, less and less often.
      std::fprintf(stderr, "tidemarkd: %s: the handed-over file waits (%s); tried again in %d s\n",
                   whose.c_str(), sent.status.error_message().c_str(), backoffMs / 1000);
      if (!pause(backoffMs)) return;
      backoffMs = std::min(backoffMs * 2, 300000);
      continue;
    }
    std::fprintf(stderr,
                 "tidemarkd: %s: the file its agent handed over was refused (%s); it "
                 "stays at %s for `tidemark upload`\n",
                 whose.c_str(), sent.status.error_message().c_str(), row->path.c_str());
    forget();
    return;
  }
}

void HandoffTaker::stop() {
  std::vector<Taking> threads;
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stopping = true;
    threads.swap(m_threads);
  }
  m_wake.notify_all();
  for (Taking& t : threads) {
    if (t.thread.joinable()) t.thread.join();
  }
}

}  // namespace tidemark::server
