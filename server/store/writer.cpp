#include "server/store/writer.h"

#include <cstdio>

namespace tidemark::server {

StoreWriter::StoreWriter(std::unique_ptr<Store> store)
    : m_store(std::move(store)), m_path(m_store->path()) {
  m_thread = std::thread([this] { run(); });
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
    (priority == Priority::kUrgent ? m_urgent : m_queue)
        .push_back({std::move(op), std::move(done)});
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

void StoreWriter::run() {
  for (;;) {
    std::deque<Item> batch;
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_cv.wait(lock, [this] { return m_stopping || !m_queue.empty() || !m_urgent.empty(); });
      if (m_queue.empty() && m_urgent.empty()) return;  // stopping, and everything is written
      batch.swap(m_urgent.empty() ? m_queue : m_urgent);
    }
    absl::Status txn = m_store->begin();
    std::vector<absl::Status> results;
    results.reserve(batch.size());
    for (Item& item : batch) {
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
    }
    if (txn.ok()) {
      txn = m_store->commit();
      if (!txn.ok()) {
        std::fprintf(stderr, "tidemarkd: commit failed: %s\n", txn.ToString().c_str());
        (void)m_store->rollback();
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i].done->set_value(txn.ok() ? results[i] : txn);
    }
  }
}

}  // namespace tidemark::server
