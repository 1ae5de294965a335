#pragma once
// Which agent a session was recorded from, as its handshake says: the texts a session's row keeps
// of a handshake, and whether a handshake that resumes a session is that session's own agent.

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "server/store/store.h"
#include "tidemark/v1/ingest.pb.h"

namespace tidemark::server {

// What a session's row keeps of the handshake's texts.
inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxCommandLineBytes = 4096;

// A handshake's text as stored: at most `max` bytes, cut at a character boundary (the wire's
// strings are UTF-8), so that no session's row or listing can grow without bound.
std::string bounded(const std::string& text, size_t max);

// OK when `hello` (resuming session `id`, or a handed-over file's first message) comes from the
// process that session `header` was recorded from: the same pid and host, started at the same
// moment. Session numbers are a store's own: after a daemon came back on another store, or for a
// spool file of another daemon's session, the same number is another job's session, never to be
// continued with this one's events. NotFound otherwise (the answer a missing session gets: it
// tells nothing of the other job).
absl::Status sameAgent(const v1::Handshake& hello, const SessionHeader& header, int64_t id);

// Ended by its agent's goodbye with every event it sent stored and none dropped: nothing a spool
// or handed-over file of its agent holds is missing from the session.
bool endedWhole(const SessionRecord& record);

}  // namespace tidemark::server
