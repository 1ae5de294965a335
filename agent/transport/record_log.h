#pragma once

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
// empty into it whatever the link does, so a thread waiting on a full ring never waits on the
// network. Records over both caps are refused and counted (the caller says so).
//
// Order: once records went to the file, later ones follow them there until the sender has read
// the file to its end; then the file is emptied and memory is used again.
class RecordLog {
 public:
  RecordLog(uint64_t memoryCapBytes, std::string spillDir, uint64_t spillCapBytes);
  ~RecordLog();
  RecordLog(const RecordLog&) = delete;
  RecordLog& operator=(const RecordLog&) = delete;

  // Appends n records; returns how many were kept (the others were over both caps).
  size_t append(const Record* records, size_t n);
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
  uint64_t refused() const;       // records over both caps

 private:
  bool openSpill();

  mutable std::mutex m_mutex;
  std::deque<std::vector<Record>> m_chunks;  // oldest first
  size_t m_frontRead = 0;                    // records of m_chunks.front() taken already
  uint64_t m_memoryRecords = 0;
  uint64_t m_memoryCapRecords;

  std::string m_spillDir;
  uint64_t m_spillCapRecords;
  int m_spillFd = -1;
  bool m_spillFailed = false;
  uint64_t m_spillWritten = 0;  // records in the file
  uint64_t m_spillRead = 0;     // of which read
  uint64_t m_spilledTotal = 0;
  uint64_t m_refused = 0;
};

}  // namespace tidemark::agent
