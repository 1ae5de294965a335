#include "agent/transport/batch_encoder.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace tidemark::agent {

namespace {

// Field numbers of proto/tidemark/v1/events.proto and ingest.proto.
constexpr uint32_t kAgentMessageBatch = 2, kAgentMessageRawRecords = 6;
constexpr uint32_t kRawRecordsRecords = 4;
constexpr uint32_t kBatchSeq = 1, kBatchStrings = 2, kBatchEvents = 3, kBatchCounters = 4;
constexpr uint32_t kStringIid = 1, kStringValue = 2;
constexpr uint32_t kEventSeq = 1, kEventTs = 2, kEventThread = 3;
constexpr uint32_t kEventAlloc = 10, kEventFree = 11, kEventScopeBegin = 12, kEventScopeEnd = 13,
                   kEventPhaseBegin = 14, kEventPhaseEnd = 15, kEventStepBegin = 16,
                   kEventStepEnd = 17, kEventTag = 18, kEventCounter = 19, kEventLaunch = 20,
                   kEventSummarized = 21, kEventStepFigure = 22, kEventStack = 23;

constexpr uint32_t kVarint = 0, kLengthDelimited = 2;

// A fixed buffer for one event: the largest (a restated Alloc with a negative device) takes 64
// bytes.
struct Buffer {
  uint8_t bytes[96];
  size_t size = 0;

  void varint(uint64_t v) noexcept {
    while (v >= 0x80) {
      bytes[size++] = static_cast<uint8_t>(v | 0x80);
      v >>= 7;
    }
    bytes[size++] = static_cast<uint8_t>(v);
  }
  void key(uint32_t field, uint32_t wireType) noexcept { varint((field << 3) | wireType); }
  // proto3 scalars: zero is not written. Signed values are sign-extended to 64 bits.
  void field(uint32_t number, uint64_t v) noexcept {
    if (v == 0) return;
    key(number, kVarint);
    varint(v);
  }
  void signedField(uint32_t number, int64_t v) noexcept { field(number, static_cast<uint64_t>(v)); }
};

size_t varintSize(uint64_t v) noexcept {
  size_t n = 1;
  for (; v >= 0x80; v >>= 7) ++n;
  return n;
}

void append(std::string& out, const Buffer& b) {
  out.append(reinterpret_cast<const char*>(b.bytes), b.size);
}

// The Event message's payload (the oneof member) of a record: its field number and body.
uint32_t encodePayload(const Record& r, Buffer& p) noexcept {
  switch (r.kind) {
    case RecordKind::kAlloc:
      p.field(1, r.address);
      p.field(2, r.sizeBytes);
      p.field(3, r.small);
      p.signedField(4, r.device);
      p.field(6, (r.reserved & kAllocRestated) != 0 ? 1 : 0);
      return kEventAlloc;
    case RecordKind::kFree:
      p.field(1, r.address);
      p.field(2, r.small);
      p.signedField(3, r.device);
      return kEventFree;
    case RecordKind::kScopeBegin:
      p.field(1, r.nameIid);
      p.field(2, r.small);
      p.field(3, static_cast<uint32_t>(r.address));
      return kEventScopeBegin;
    case RecordKind::kScopeEnd:
      p.field(1, r.nameIid);
      p.field(2, r.small);
      return kEventScopeEnd;
    case RecordKind::kLaunch:
      p.field(1, static_cast<uint32_t>(r.address));
      return kEventLaunch;
    case RecordKind::kPhaseBegin:
      p.field(1, r.small);
      return kEventPhaseBegin;
    case RecordKind::kPhaseEnd:
      p.field(1, r.small);
      return kEventPhaseEnd;
    case RecordKind::kStepBegin:
      p.signedField(1, static_cast<int64_t>(r.address));
      return kEventStepBegin;
    case RecordKind::kStepEnd:
      p.signedField(1, static_cast<int64_t>(r.address));
      return kEventStepEnd;
    case RecordKind::kCounter:
      p.field(1, r.nameIid);
      p.signedField(2, static_cast<int64_t>(r.sizeBytes));
      return kEventCounter;
    case RecordKind::kTag:
      p.field(1, r.address);
      p.field(2, r.sizeBytes);
      p.field(3, r.small);
      p.field(4, r.nameIid);
      return kEventTag;
    case RecordKind::kStack:
      p.field(1, r.address);
      p.field(2, r.nameIid);
      return kEventStack;
    case RecordKind::kSummarized:
      p.field(1, r.address);
      p.field(2, r.small != 0 ? 1 : 0);
      return kEventSummarized;
    case RecordKind::kStepSummary:
      p.signedField(1, static_cast<int64_t>(r.address));
      p.signedField(2, r.device);
      p.field(3, r.small);
      p.field(4, r.reserved);
      p.signedField(5, static_cast<int64_t>(r.sizeBytes));
      return kEventStepFigure;
  }
  return 0;  // a kind this build does not know: an event without payload
}

}  // namespace

std::string encodeBatchMessage(uint64_t batchSeq,
                               const std::vector<std::pair<uint32_t, std::string>>& strings,
                               const std::vector<Record>& records, const std::string& counters) {
  std::string body;
  size_t stringBytes = 0;
  for (const auto& s : strings) stringBytes += s.second.size() + 16;
  body.reserve(16 + stringBytes);
  {
    Buffer seq;
    seq.field(kBatchSeq, batchSeq);
    append(body, seq);
  }
  for (const auto& [iid, value] : strings) {
    Buffer head;  // the InternedString's key and length, its iid, and its value's key and length
    Buffer iidField;
    iidField.field(kStringIid, iid);
    const size_t valueHead = value.empty() ? 0 : 1 + varintSize(value.size());
    head.key(kBatchStrings, kLengthDelimited);
    head.varint(iidField.size + valueHead + value.size());
    for (size_t i = 0; i < iidField.size; ++i) head.bytes[head.size++] = iidField.bytes[i];
    if (!value.empty()) {
      head.key(kStringValue, kLengthDelimited);
      head.varint(value.size());
    }
    append(body, head);
    body.append(value);
  }
  // The events, written in place: an event takes at most 70 bytes (key, length, seq, ts,
  // thread and the largest payload), so each one's length and its payload's fit one byte, and
  // the room for all of them is reserved once (a Buffer per event and two appends each made the
  // encoding the exit's longest part).
  // (In a buffer of the thread's, kept: a string's resize would clear the room each time.)
  constexpr size_t kMaxEventBytes = 72;
  thread_local std::vector<uint8_t> events;
  if (events.size() < records.size() * kMaxEventBytes)
    events.resize(records.size() * kMaxEventBytes);
  uint8_t* const start = events.data();
  uint8_t* p = start;
  for (const Record& r : records) {
    Buffer payload;
    const uint32_t number = encodePayload(r, payload);
    uint8_t* const event = p;
    p += 2;  // the event's key and one-byte length
    const auto varint = [&p](uint64_t v) {
      while (v >= 0x80) {
        *p++ = static_cast<uint8_t>(v | 0x80);
        v >>= 7;
      }
      *p++ = static_cast<uint8_t>(v);
    };
    if (r.seq != 0) {
      *p++ = (kEventSeq << 3) | kVarint;
      varint(r.seq);
    }
    if (r.tsNs != 0) {
      *p++ = (kEventTs << 3) | kVarint;
      varint(static_cast<uint64_t>(r.tsNs));
    }
    if (r.threadId != 0) {
      *p++ = (kEventThread << 3) | kVarint;
      varint(r.threadId);
    }
    if (number != 0) {
      varint((number << 3) | kLengthDelimited);  // 10..22: one byte
      *p++ = static_cast<uint8_t>(payload.size);
      std::memcpy(p, payload.bytes, payload.size);
      p += payload.size;
    }
    event[0] = (kBatchEvents << 3) | kLengthDelimited;
    event[1] = static_cast<uint8_t>(p - event - 2);
  }
  const size_t eventBytes = static_cast<size_t>(p - start);
  // The counters, last (field 4); none when "" (counters all zero say nothing).
  Buffer countersHead;
  if (!counters.empty()) {
    countersHead.key(kBatchCounters, kLengthDelimited);
    countersHead.varint(counters.size());
  }
  const size_t tail = countersHead.size + counters.size();
  std::string out;
  out.reserve(body.size() + eventBytes + tail + 8);
  Buffer head;
  head.key(kAgentMessageBatch, kLengthDelimited);
  head.varint(body.size() + eventBytes + tail);
  append(out, head);
  out.append(body);
  out.append(reinterpret_cast<const char*>(start), eventBytes);
  append(out, countersHead);
  out.append(counters);
  return out;
}

std::string rawRecordsHead(uint64_t firstBatchSeq,
                           const std::vector<std::pair<uint32_t, std::string>>& strings,
                           size_t recordBytes) {
  v1::RawRecords raw;
  raw.set_first_batch_seq(firstBatchSeq);
  raw.set_layout(kRecordLayout);
  for (const auto& [iid, value] : strings) {
    v1::InternedString* s = raw.add_strings();
    s->set_iid(iid);
    s->set_value(value);
  }
  std::string inner = raw.SerializeAsString();
  if (recordBytes > 0) {  // field 4, last in number order as protobuf writes it
    Buffer key;
    key.key(kRawRecordsRecords, kLengthDelimited);
    key.varint(recordBytes);
    append(inner, key);
  }
  Buffer head;
  head.key(kAgentMessageRawRecords, kLengthDelimited);
  head.varint(inner.size() + recordBytes);
  std::string out;
  out.reserve(head.size + inner.size());
  append(out, head);
  out.append(inner);
  return out;
}

std::string rawRecordsProblem(const v1::RawRecords& raw) {
  if (raw.layout() != kRecordLayout) {
    return "records of layout " + std::to_string(raw.layout()) + " (this build reads layout " +
           std::to_string(kRecordLayout) + ")";
  }
  if (raw.records().size() % sizeof(Record) != 0) {
    return "raw records of " + std::to_string(raw.records().size()) + " bytes: not whole records";
  }
  return "";
}

std::string rawRecordsBatch(const v1::RawRecords& raw, uint64_t index) {
  const size_t total = raw.records().size() / sizeof(Record);
  const size_t from = std::min<size_t>(total, index * kMaxEventsPerBatch);
  const size_t n = std::min(kMaxEventsPerBatch, total - from);
  std::vector<Record> records(n);
  std::memcpy(records.data(), raw.records().data() + from * sizeof(Record), n * sizeof(Record));
  std::vector<std::pair<uint32_t, std::string>> strings;
  if (index == 0) {
    for (const v1::InternedString& s : raw.strings()) strings.emplace_back(s.iid(), s.value());
  }
  return encodeBatchMessage(raw.first_batch_seq() + index, strings, records);
}

}  // namespace tidemark::agent
