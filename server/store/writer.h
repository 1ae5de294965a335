#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "server/store/store.h"

namespace tidemark::server {

// The single writer: one thread owns the Store's write connection and runs every write in
// batched transactions (all operations queued while it was busy go into one transaction).
class StoreWriter {
 public:
  explicit StoreWriter(std::unique_ptr<Store> store);
  ~StoreWriter();  // drains the queue, then stops
  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  using Operation = std::function<absl::Status(Store&)>;
  // Queues op; the future is set once the transaction holding it has committed (or failed).
  // Urgent: a small write someone waits for (a new session's row for its agent's handshake):
  // committed in a transaction of its own before anything queued normally, so that it never
  // waits behind other sessions' rows (at most behind the one write under way: a transaction of
  // queued writes ends early for it).
  enum class Priority { kNormal, kUrgent };
  std::future<absl::Status> submit(Operation op, Priority priority = Priority::kNormal);
  // Queue op without waiting.
  void post(Operation op);

  const std::string& path() const { return m_path; }
  const std::string& daemonName() const { return m_daemonName; }
  // Stops after everything queued so far is committed.
  void stop();

 private:
  struct Item {
    Operation op;
    std::shared_ptr<std::promise<absl::Status>> done;
  };
  void run();
  // Runs items[from..] in one transaction (up to the first urgent arrival when yieldToUrgent),
  // commits, sets their futures; returns the index after the last one run.
  size_t commitSome(std::deque<Item>& items, size_t from, bool yieldToUrgent);

  std::unique_ptr<Store> m_store;
  std::string m_path;
  std::string m_daemonName;
  std::mutex m_mutex;
  std::condition_variable m_cv;
  std::deque<Item> m_queue;
  std::deque<Item> m_urgent;
  std::atomic<bool> m_urgentWaiting{false};
  bool m_failing = false;  // the last transaction failed (the writer's thread only)
  bool m_stopping = false;
  std::thread m_thread;
};

}  // namespace tidemark::server
