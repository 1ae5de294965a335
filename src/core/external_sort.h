#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <queue>
#include <string>
#include <type_traits>
#include <vector>

namespace tidemark::core {

// A temporary file in `dir` that no other process can open and the kernel removes once it is
// closed (O_TMPFILE; else a named file, unlinked at once): its descriptor, or -1 (errno set).
inline int openScratchFile(const std::string& dir) {
  int fd = -1;
#ifdef O_TMPFILE
  fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
  if (fd < 0) {
    std::string name = dir + "/tidemark-scratch-XXXXXX";
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.c_str());
  }
  return fd;
}

// All of n bytes written at offset `at` of fd, or read from there (false: errno says why; a read
// past the end fails with errno 0).
inline bool writeAllAt(int fd, const void* data, size_t n, uint64_t at) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t done = ::pwrite(fd, p, n, static_cast<off_t>(at));
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return false;
    p += done;
    n -= static_cast<size_t>(done);
    at += static_cast<uint64_t>(done);
  }
  return true;
}
inline bool readAllAt(int fd, void* data, size_t n, uint64_t at) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t done = ::pread(fd, p, n, static_cast<off_t>(at));
    if (done < 0 && errno == EINTR) continue;
    if (done == 0) errno = 0;
    if (done <= 0) return false;
    p += done;
    n -= static_cast<size_t>(done);
    at += static_cast<uint64_t>(done);
  }
  return true;
}

// Sorts more fixed-size records than memory holds: records gather in a buffer of
// `memoryBytes`; a full buffer is sorted and written to a temporary file in `tempDir` (removed
// by the kernel once closed) as one run; reading merges the runs. Memory stays at about
// memoryBytes whatever the number of records (reading takes at most as much again, split among
// the runs). A sorter that never fills its buffer touches no file.
//
// Errors (a full disk, an unwritable directory) are values: add() and finish() return false and
// error() says why; nothing throws.
template <typename T, typename Less>
class ExternalSorter {
  static_assert(std::is_trivially_copyable_v<T>, "records are written as bytes");

 public:
  ExternalSorter(std::string tempDir, size_t memoryBytes, Less less = Less())
      : m_dir(std::move(tempDir)),
        m_capacity(std::max<size_t>(1024, memoryBytes / sizeof(T))),
        m_less(less) {}
  ~ExternalSorter() {
    if (m_fd >= 0) ::close(m_fd);
  }
  ExternalSorter(const ExternalSorter&) = delete;
  ExternalSorter& operator=(const ExternalSorter&) = delete;

  bool add(const T& v) {
    if (!m_error.empty()) return false;
    if (m_buffer.size() == m_buffer.capacity())  // grow by doubling, never past the budget
      m_buffer.reserve(std::min(m_capacity, std::max<size_t>(1024, 2 * m_buffer.capacity())));
    m_buffer.push_back(v);
    ++m_size;
    return m_buffer.size() < m_capacity || spill();
  }
  // Sorts what is buffered; then read() may be called, as often as needed.
  bool finish() {
    if (!m_error.empty()) return false;
    if (m_runs.empty()) {
      std::stable_sort(m_buffer.begin(), m_buffer.end(), m_less);
      return true;
    }
    if (!m_buffer.empty() && !spill()) return false;
    std::vector<T>().swap(m_buffer);
    return true;
  }
  // Drops every record and the temporary file (its disk space goes back at once).
  void release() {
    if (m_fd >= 0) ::close(m_fd);
    m_fd = -1;
    std::vector<T>().swap(m_buffer);
    m_runs.clear();
    m_written = 0;
  }
  uint64_t size() const { return m_size; }
  uint64_t spilledRuns() const { return m_runs.size(); }
  const std::string& error() const { return m_error; }

  // The records in order; next() is false at the end or on a read error (then error() says).
  class Reader {
   public:
    bool next(T& out) {
      if (m_sorter->m_runs.empty()) {
        if (m_memoryPos >= m_sorter->m_buffer.size()) return false;
        out = m_sorter->m_buffer[m_memoryPos++];
        return true;
      }
      if (m_heap.empty()) return false;
      const size_t r = m_heap.top();
      m_heap.pop();
      Run& run = m_runs[r];
      out = run.buffer[run.pos++];
      if (refill(r)) m_heap.push(r);
      return true;
    }
    const std::string& error() const { return m_error; }

   private:
    friend class ExternalSorter;
    struct Run {
      uint64_t offset;  // next record to read, in records from the file's start
      uint64_t left;    // records of the run not read yet from the file
      std::vector<T> buffer;
      size_t pos = 0;
    };
    struct After {  // a min-heap on the runs' current records; ties: the earlier run first
      const Reader* r;
      bool operator()(size_t a, size_t b) const {
        const T& x = r->m_runs[a].buffer[r->m_runs[a].pos];
        const T& y = r->m_runs[b].buffer[r->m_runs[b].pos];
        if (r->m_sorter->m_less(y, x)) return true;
        if (r->m_sorter->m_less(x, y)) return false;
        return a > b;
      }
    };
    explicit Reader(const ExternalSorter* s) : m_sorter(s), m_heap(After{this}) {
      if (s->m_runs.empty()) return;
      const size_t perRun = std::max<size_t>(256, s->m_capacity / s->m_runs.size());
      m_runs.reserve(s->m_runs.size());
      for (const auto& [offset, count] : s->m_runs) m_runs.push_back({offset, count, {}, 0});
      for (Run& run : m_runs) run.buffer.reserve(std::min<uint64_t>(perRun, run.left));
      m_perRun = perRun;
      for (size_t r = 0; r < m_runs.size(); ++r)
        if (refill(r)) m_heap.push(r);
    }
    // True when run r has a record at pos (reading its next part from the file if needed).
    bool refill(size_t r) {
      Run& run = m_runs[r];
      if (run.pos < run.buffer.size()) return true;
      if (run.left == 0) return false;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(m_perRun, run.left));
      run.buffer.resize(n);
      if (!m_sorter->readAt(run.offset, run.buffer.data(), n, &m_error)) {
        run.left = 0;
        return false;
      }
      run.offset += n;
      run.left -= n;
      run.pos = 0;
      return true;
    }
    const ExternalSorter* m_sorter;
    std::vector<Run> m_runs;
    size_t m_perRun = 0;
    size_t m_memoryPos = 0;
    std::priority_queue<size_t, std::vector<size_t>, After> m_heap;
    std::string m_error;
  };
  Reader read() const { return Reader(this); }

 private:
  bool fail(const std::string& what) {
    m_error = what + ": " + std::strerror(errno);
    return false;
  }
  bool openFile() {
    m_fd = openScratchFile(m_dir);
    return m_fd >= 0 || fail("temporary file in " + m_dir);
  }
  bool spill() {
    if (m_fd < 0 && !openFile()) return false;
    std::stable_sort(m_buffer.begin(), m_buffer.end(), m_less);
    if (!writeAllAt(m_fd, m_buffer.data(), m_buffer.size() * sizeof(T), m_written * sizeof(T)))
      return fail("writing a sort run");
    m_runs.emplace_back(m_written, m_buffer.size());
    m_written += m_buffer.size();
    m_buffer.clear();
    return true;
  }
  bool readAt(uint64_t record, T* out, size_t count, std::string* error) const {
    if (readAllAt(m_fd, out, count * sizeof(T), record * sizeof(T))) return true;
    *error =
        std::string("reading a sort run: ") + (errno == 0 ? "short file" : std::strerror(errno));
    return false;
  }

  std::string m_dir;
  size_t m_capacity;
  Less m_less;
  std::vector<T> m_buffer;
  std::vector<std::pair<uint64_t, uint64_t>> m_runs;  // (first record, count) in the file
  uint64_t m_written = 0;
  uint64_t m_size = 0;
  int m_fd = -1;
  std::string m_error;
};

}  // namespace tidemark::core
