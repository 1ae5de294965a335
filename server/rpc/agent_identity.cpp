#include "server/rpc/agent_identity.h"

#include "tidemark/v1/query.pb.h"

namespace tidemark::server {

std::string bounded(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

absl::Status sameAgent(const v1::Handshake& hello, const SessionHeader& header, int64_t id) {
  if (header.pid == hello.pid() && header.hostname == bounded(hello.hostname(), kMaxNameBytes) &&
      header.startTsNs == hello.start_ts_ns() && header.startWallNs == hello.start_wall_ns()) {
    return absl::OkStatus();
  }
  return absl::NotFoundError("session " + std::to_string(id) +
                             " of this store was not recorded by this process");
}

bool endedWhole(const SessionRecord& record) {
  return record.state == v1::SESSION_STATE_ENDED && record.eventsSent &&
         record.eventsStored == *record.eventsSent && record.eventsDropped.value_or(0) == 0;
}

}  // namespace tidemark::server
