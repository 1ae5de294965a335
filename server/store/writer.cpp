#include "server/store/writer.h"

#include <pthread.h>

#include <cstdio>

namespace tidemark::server {

StoreWriter::StoreWriter(std::unique_ptr<Store> store)
    : m_store(std::move(store)), m_path(m_store->path()), m_daemonName(m_store->daemonName()) {
  m_thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "td-store");
    run();
  });
}

StoreWriter::~StoreWriter() { stop(); }

std::future<absl::Status> StoreWriter::submit(Operation op, Priority priority) {
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = done->get_future();
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (m_stopping) {
      done->set_value(absl::UnavailableError("the store is closing"));
      return f;
    }
    if (priority == Priority::kUrgent) {
      m_urgent.push_back({std::move(op), std::move(done)});
      m_urgentWaiting.store(true, std::memory_order_release);
    } else {
      m_queue.push_back({std::move(op), std::move(done)});
    }
  }
  m_cv.notify_one();
  return f;
}

void StoreWriter::post(Operation op) { submit(std::move(op)); }

void StoreWriter::stop() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stopping = true;
  }
  m_cv.notify_one();
  if (m_thread.joinable()) m_thread.join();
}

size_t StoreWriter::commitSome(std::deque<Item>& items, size_t from, bool yieldToUrgent) {
  absl::Status txn = m_store->begin();
  std::vector<absl::Status> results;
  size_t end = from;
  while (end < items.size()) {
    Item& item = items[end++];
    if (!txn.ok()) {
      results.push_back(txn);
      continue;
    }
    // Each operation runs in a savepoint: one failing write is undone whole, and does not
    // undo the others of the transaction.
    (void)m_store->exec("SAVEPOINT op");
    absl::Status s = item.op(*m_store);
    if (s.ok()) {
      (void)m_store->exec("RELEASE op");
    } else {
      (void)m_store->exec("ROLLBACK TO op; RELEASE op");
      std::fprintf(stderr, "tidemarkd: write failed: %s\n", s.ToString().c_str());
    }
    results.push_back(s);
    // An urgent write came meanwhile: this transaction ends here so that it goes next.
    if (yieldToUrgent && m_urgentWaiting.load(std::memory_order_acquire)) break;
  }
  if (txn.ok()) {
    txn = m_store->commit();
    if (!txn.ok()) {
      std::fprintf(stderr, "tidemarkd: commit failed: %s\n", txn.ToString().c_str());
      (void)m_store->rollback();
    }
  }
  // An outage of the store (a full disk, a PostgreSQL server down) said once, and its end.
  if (!txn.ok() && !m_failing) {
    std::fprintf(stderr,
                 "tidemarkd: the store cannot be written: %s (the agents keep their events and "
                 "retry)\n",
                 std::string(txn.message()).c_str());
    m_failing = true;
  } else if (txn.ok() && m_failing) {
    std::fprintf(stderr, "tidemarkd: the store can be written again\n");
    m_failing = false;
  }
  for (size_t i = from; i < end; ++i) {
    items[i].done->set_value(txn.ok() ? results[i - from] : txn);
  }
  return end;
}

void StoreWriter::run() {
  for (;;) {
    std::deque<Item> batch;
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_cv.wait(lock, [this] { return m_stopping || !m_queue.empty() || !m_urgent.empty(); });
      if (m_queue.empty() && m_urgent.empty()) return;  // stopping, and everything is written
      batch.swap(m_queue);
    }
    // The queued writes in as few transactions as possible, each cut short for urgent ones.
    size_t done = 0;
    do {
      std::deque<Item> urgent;
      {
        std::lock_guard<std::mutex> lock(m_mutex);
        urgent.swap(m_urgent);
        m_urgentWaiting.store(false, std::memory_order_release);
      }
      if (!urgent.empty()) commitSome(urgent, 0, false);
      if (done < batch.size()) done = commitSome(batch, done, true);
    } while (done < batch.size() || m_urgentWaiting.load(std::memory_order_acquire));
  }
}

}  // namespace tidemark::server
