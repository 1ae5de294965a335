#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "client/spool_reader.h"

namespace tidemark::client {

// Sends the rest of a spool file to tidemarkd on an Ingest stream: `tidemark upload`, and the
// daemon itself for a file an agent handed over (server/rpc/handoff_taker.h).
struct SpoolUpload {
  // When the session the spool resumes was closed meanwhile: the rest becomes a new session
  // (`tidemark upload`), or the upload fails (the daemon's own, which never makes one).
  bool newSessionIfClosed = true;
  // Extra metadata on the stream.
  std::vector<std::pair<std::string, std::string>> metadata;
  // Said when the spool becomes a new session.
  std::function<void(const std::string&)> note;
  // Checked between messages: set, the stream is cancelled (the daemon keeps what it
  // committed; the rest can be sent again).
  const std::atomic<bool>* stop = nullptr;
  // At most this long for the whole upload (every attempt together), 0 for no limit.
  int deadlineS = 0;
};

struct SpoolUploadResult {
  grpc::Status status;     // the stream's (CANCELLED when stopped)
  uint64_t sessionId = 0;  // the session that took the events
  uint64_t events = 0;     // events sent (those the daemon had already are skipped)
  std::string readError;   // the spool ended with a bad record ("" if read to its end)
  // The session it continues had ended whole: the spool adds nothing (no events sent).
  bool alreadyWhole = false;
};

// `first`: the spool's first message, its handshake (already read from `reader`).
SpoolUploadResult uploadSpool(const std::shared_ptr<grpc::Channel>& channel, SpoolReader& reader,
                              v1::AgentMessage first, const SpoolUpload& options);

}  // namespace tidemark::client
