#include "agent/transport/record_log.h"

#include "agent/transport/batch_encoder.h"
#include "agent/transport/spool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <new>
#include <type_traits>

namespace tidemark::agent {

namespace {
// A chunk is a sender's batch (384 KiB), which take hands over whole.
constexpr size_t kChunkRecords = kMaxEventsPerBatch;

// pwrite or pread of the whole range, across short transfers and signals.
template <typename Buffer, typename Op>
bool transferAll(int fd, Buffer* data, size_t bytes, off_t offset, Op op) {
  auto* p = reinterpret_cast<std::conditional_t<std::is_const_v<Buffer>, const char, char>*>(data);
  while (bytes > 0) {
    const ssize_t n = op(fd, p, bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += n;
  }
  return true;
}

bool writeAll(int fd, const void* data, size_t bytes, off_t offset) {
  return transferAll(fd, data, bytes, offset, ::pwrite);
}

bool readAll(int fd, void* data, size_t bytes, off_t offset) {
  return transferAll(fd, data, bytes, offset, ::pread);
}
}  // namespace

RecordLog::RecordLog(uint64_t memoryCapBytes, std::string spillDir, uint64_t spillCapBytes)
    : m_memoryCapRecords(std::max<uint64_t>(memoryCapBytes / sizeof(Record), 1)),
      m_spillDir(std::move(spillDir)),
      m_spillCapRecords(spillCapBytes / sizeof(Record)) {
  // Opened now, while memory can be had: a job that later reaches its memory limit (`ulimit -v`)
  // leaves the agent no memory for a chunk, nor for the file's path, and the file is then what
  // keeps the records. (Unnamed and empty: nothing on disk until it is written to.)
  try {
    if (m_spillCapRecords > 0) openSpill();
  } catch (const std::bad_alloc&) {  // tried again when first needed
  }
}

RecordLog::~RecordLog() {
  if (m_spillFd >= 0) ::close(m_spillFd);
}

bool RecordLog::openSpill() {
  if (m_spillFd >= 0) return true;
  if (m_spillFailed) return false;
  if (!prepareSpoolDirectory(m_spillDir).empty()) {
    m_spillFailed = true;
    return false;
  }
  // Unnamed: O_TMPFILE where the file system has it, else a name made unique by mkstemp
  // (O_EXCL) and removed at once.
  m_spillFd = ::open(m_spillDir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (m_spillFd < 0) {
    std::string name = m_spillDir + "/.tidemark-log-XXXXXX";
    m_spillFd = ::mkostemp(name.data(), O_CLOEXEC);
    if (m_spillFd >= 0) ::unlink(name.c_str());
  }
  if (m_spillFd < 0) m_spillFailed = true;
  return m_spillFd >= 0;
}

size_t RecordLog::toMemory(std::deque<std::vector<Record>>& chunks, const Record* records, size_t n,
                           bool capped) {
  size_t kept = 0;
  while (kept < n && (!capped || m_memoryRecords < m_memoryCapRecords)) {
    if (chunks.empty() || chunks.back().size() == chunks.back().capacity()) {
      // A chunk that cannot be had (the job at its memory limit: `ulimit -v`) takes nothing:
      // the caller goes on to the file, or counts what neither took. Never an exception into
      // the collector, which would end the job.
      try {
        chunks.emplace_back();
        chunks.back().reserve(std::min<uint64_t>(kChunkRecords, m_memoryCapRecords));
      } catch (const std::bad_alloc&) {
        if (!chunks.empty() && chunks.back().capacity() == 0) chunks.pop_back();
        ++m_memoryRefusals;
        break;
      }
    }
    std::vector<Record>& chunk = chunks.back();
    // Within what the chunk reserved: an insert never allocates.
    size_t room = chunk.capacity() - chunk.size();
    if (capped) room = std::min<uint64_t>(room, m_memoryCapRecords - m_memoryRecords);
    const size_t k = std::min(room, n - kept);
    chunk.insert(chunk.end(), records + kept, records + kept + k);
    kept += k;
    m_memoryRecords += k;
  }
  return kept;
}

void RecordLog::resetSpill() {
  // Its blocks go back to the file system, and it may be written again.
  if (::ftruncate(m_spillFd, 0) != 0) {
  }
  m_spillRead = m_spillWritten = 0;
  m_spillStuck = false;
  // What came after the file's records is next.
  for (std::vector<Record>& chunk : m_after) m_chunks.push_back(std::move(chunk));
  m_after.clear();
}

size_t RecordLog::append(const Record* records, size_t n, Overflow overflow) {
  std::lock_guard<std::mutex> lock(m_mutex);
  size_t kept = 0;
  // Memory first, unless the file still holds records not read (they are older).
  if (m_spillWritten == m_spillRead) kept = toMemory(m_chunks, records, n, true);
  bool spill = false;
  if (kept < n && m_after.empty()) {
    try {
      spill = openSpill();
    } catch (const std::bad_alloc&) {  // its path's strings: tried again at the next append
      ++m_memoryRefusals;
    }
  }
  if (spill) {
    const uint64_t held = m_spillWritten - m_spillRead;
    const size_t k = static_cast<size_t>(
        std::min<uint64_t>(m_spillCapRecords > held ? m_spillCapRecords - held : 0, n - kept));
    if (k > 0) {
      if (writeAll(m_spillFd, records + kept, k * sizeof(Record),
                   static_cast<off_t>(m_spillWritten * sizeof(Record)))) {
        m_spillWritten += k;
        m_spilledTotal += k;
        kept += k;
      } else {
        m_spillStuck = true;  // a file size limit, a full disk: not tried again until it is read
      }
    }
  }
  if (kept < n && overflow == Overflow::kKeep) {
    // Past the caps, in memory: after the file's records when it holds some.
    kept += toMemory(m_spillWritten == m_spillRead ? m_chunks : m_after, records + kept, n - kept,
                     false);
  }
  m_refused += n - kept;
  return kept;
}

bool RecordLog::full() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  const bool fileUsable = !m_spillFailed && !m_spillStuck;
  return m_memoryRecords + (m_spillWritten - m_spillRead) >=
         m_memoryCapRecords + (fileUsable ? m_spillCapRecords : 0);
}

uint64_t RecordLog::takes() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_takes;
}

void RecordLog::awaitTake(uint64_t seen, int timeoutMs) {
  std::unique_lock<std::mutex> lock(m_mutex);
  m_took.wait_for(lock, std::chrono::milliseconds(timeoutMs), [&] { return m_takes != seen; });
}

void RecordLog::wake() {
  std::lock_guard<std::mutex> lock(m_mutex);
  tookSome();
}

void RecordLog::tookSome() {
  ++m_takes;
  m_took.notify_all();
}

bool RecordLog::empty() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_memoryRecords == 0 && m_spillRead >= m_spillWritten;  // (m_after is counted in memory)
}

uint64_t RecordLog::size() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_memoryRecords + (m_spillWritten - m_spillRead);
}

size_t RecordLog::take(std::vector<Record>& out, size_t max) {
  std::lock_guard<std::mutex> lock(m_mutex);
  size_t taken = 0;
  while (taken < max && !m_chunks.empty()) {
    std::vector<Record>& chunk = m_chunks.front();
    if (out.empty() && m_frontRead == 0 && chunk.size() <= max &&
        (chunk.size() == kChunkRecords || m_chunks.size() > 1)) {
      // A whole chunk no longer written to: its buffer changes hands, no record is copied (the
      // taker's old buffer goes with the chunk).
      out.swap(chunk);
      taken = out.size();
      m_memoryRecords -= taken;
      m_chunks.pop_front();
      continue;
    }
    const size_t k = std::min(max - taken, chunk.size() - m_frontRead);
    out.insert(out.end(), chunk.begin() + static_cast<long>(m_frontRead),
               chunk.begin() + static_cast<long>(m_frontRead + k));
    m_frontRead += k;
    taken += k;
    m_memoryRecords -= k;
    if (m_frontRead == chunk.size()) {
      m_chunks.pop_front();
      m_frontRead = 0;
    }
  }
  if (taken < max && m_spillRead < m_spillWritten) {
    const size_t k =
        static_cast<size_t>(std::min<uint64_t>(max - taken, m_spillWritten - m_spillRead));
    const size_t at = out.size();
    out.resize(at + k);
    if (readAll(m_spillFd, out.data() + at, k * sizeof(Record),
                static_cast<off_t>(m_spillRead * sizeof(Record)))) {
      m_spillRead += k;
      taken += k;
    } else {
      // Unreadable: what the file holds is lost; counted, and the file starts over.
      out.resize(at);
      m_refused += m_spillWritten - m_spillRead;
      m_spillRead = m_spillWritten;
    }
    if (m_spillRead == m_spillWritten) resetSpill();  // read to its end: the file starts over
  }
  if (taken > 0) tookSome();
  return taken;
}

bool RecordLog::visit(const std::function<bool(const Record* records, size_t n)>& fn) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  size_t from = m_frontRead;
  for (const std::vector<Record>& chunk : m_chunks) {
    if (chunk.size() > from && !fn(chunk.data() + from, chunk.size() - from)) return false;
    from = 0;
  }
  std::vector<Record> piece;
  for (uint64_t at = m_spillRead; at < m_spillWritten;) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(kChunkRecords, m_spillWritten - at));
    piece.resize(k);
    if (!readAll(m_spillFd, piece.data(), k * sizeof(Record),
                 static_cast<off_t>(at * sizeof(Record))) ||
        !fn(piece.data(), k))
      return false;
    at += k;
  }
  for (const std::vector<Record>& chunk : m_after) {
    if (!chunk.empty() && !fn(chunk.data(), chunk.size())) return false;
  }
  return true;
}

void RecordLog::discard(uint64_t n) {
  std::lock_guard<std::mutex> lock(m_mutex);
  // Memory, then the file; once the file is read to its end, what came after it is memory again.
  for (bool again = true; again;) {
    while (n > 0 && !m_chunks.empty()) {
      const size_t k =
          static_cast<size_t>(std::min<uint64_t>(n, m_chunks.front().size() - m_frontRead));
      m_frontRead += k;
      m_memoryRecords -= k;
      n -= k;
      if (m_frontRead == m_chunks.front().size()) {
        m_chunks.pop_front();
        m_frontRead = 0;
      }
    }
    const uint64_t k = std::min<uint64_t>(n, m_spillWritten - m_spillRead);
    m_spillRead += k;
    n -= k;
    again = false;
    if (m_spillFd >= 0 && m_spillRead == m_spillWritten && m_spillWritten != 0) {
      resetSpill();
      again = n > 0;
    }
  }
  tookSome();
}

uint64_t RecordLog::spilledTotal() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_spilledTotal;
}

uint64_t RecordLog::refused() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_refused;
}

void RecordLog::refuse(uint64_t n) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_refused += n;
}

uint64_t RecordLog::memoryRefusals() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_memoryRefusals;
}

}  // namespace tidemark::agent
