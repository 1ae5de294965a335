#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "agent/recorder/record.h"

namespace tidemark::agent {

// The records the collector took out of the rings and the sender has not taken yet, in order:
// in memory up to a cap, then in an unnamed file of the user's (raw records, unlinked at
// creation, so nothing is left behind and no name can be planted), up to a second cap. Rings
// empty into it whatever the link does until both caps are reached (full()), so a thread
// waiting on a full ring waits on the network only then. What becomes of records over both
// caps is the caller's choice (Overflow).
//
// Order: once records went to the file, later ones follow them there (or, past its cap, into
// memory after it) until the sender has read the file to its end; then the file is emptied and
// memory is used again.
class RecordLog {
 public:
  RecordLog(uint64_t memoryCapBytes, std::string spillDir, uint64_t spillCapBytes);
  ~RecordLog();
  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  // What becomes of records over both caps.
  enum class Overflow {
    kRefuse,  // refused and counted (refused()): the lossy and the degraded modes
    kKeep,    // kept in memory past its cap (lossless: the caller holds back instead, full())
  };
  // Appends n records; returns how many were kept (the others were over both caps).
  size_t append(const Record* records, size_t n, Overflow overflow = Overflow::kRefuse);
  // Both caps reached (the file's counts for nothing while it cannot be written: a file size
  // limit, a full disk): a lossless caller appends nothing more until the sender took some out.
  bool full() const;
  // How many times records were taken out (take, discard), and a wait until that count passes
  // `seen`, wake() is called or timeoutMs passes: room may have been made.
  uint64_t takes() const;
  void awaitTake(uint64_t seen, int timeoutMs);
  void wake();
  // Moves up to max of the oldest records to out (appending); returns how many.
  size_t take(std::vector<Record>& out, size_t max);
  // Shows every record held, oldest first, in runs of consecutive ones (a memory chunk, or a
  // piece of the file), without taking them; stops when fn returns false. False when fn did, or
  // the file could not be read.
  bool visit(const std::function<bool(const Record* records, size_t n)>& fn) const;
  // Forgets the n oldest records (those visit showed first), as take would without the copy.
  void discard(uint64_t n);

  bool empty() const;
  uint64_t size() const;          // records held (memory and file)
  uint64_t spilledTotal() const;  // records that ever went to the file
  uint64_t refused() const;       // records over both caps, or counted in by refuse()
  // Records the caller had and could not hand over (no memory to pass them on): counted with
  // those over both caps.
  void refuse(uint64_t n);
  // How many times a chunk of memory could not be had (the job at its memory limit): the
  // records went to the file instead, or were refused when it could not take them.
  uint64_t memoryRefusals() const;

 private:
  bool openSpill();
  // Under m_mutex: up to n records to the end of `chunks`, within the memory cap if capped;
  // how many.
  size_t toMemory(std::deque<std::vector<Record>>& chunks, const Record* records, size_t n,
                  bool capped);
  // The file read to its end: it starts over, and the records kept after it come next.
  void resetSpill();
  void tookSome();

  mutable std::mutex m_mutex;
  std::deque<std::vector<Record>> m_chunks;  // oldest first
  // Records kept past both caps while the file holds older ones (Overflow::kKeep): after them.
  std::deque<std::vector<Record>> m_after;
  size_t m_frontRead = 0;        // records of m_chunks.front() taken already
  uint64_t m_memoryRecords = 0;  // in m_chunks and m_after
  uint64_t m_memoryCapRecords;

  std::string m_spillDir;
  uint64_t m_spillCapRecords;
  int m_spillFd = -1;
  bool m_spillFailed = false;
  bool m_spillStuck = false;    // a write failed: none tried until the file is read to its end
  uint64_t m_spillWritten = 0;  // records in the file
  uint64_t m_spillRead = 0;     // of which read
  uint64_t m_spilledTotal = 0;
  uint64_t m_refused = 0;
  uint64_t m_memoryRefusals = 0;
  uint64_t m_takes = 0;
  std::condition_variable m_took;
};

}  // namespace tidemark::agent
