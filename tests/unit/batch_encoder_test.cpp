#include "agent/transport/batch_encoder.h"

#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <limits>
#include <random>

#include "agent/transport/spool.h"
#include "client/spool_reader.h"
#include "tidemark/v1/ingest.pb.h"

namespace tidemark::agent {
namespace {

// The same batch built the slow way: protobuf's message objects, field by field.
v1::AgentMessage reference(uint64_t batchSeq,
                           const std::vector<std::pair<uint32_t, std::string>>& strings,
                           const std::vector<Record>& records) {
  v1::AgentMessage m;
  v1::EventBatch* b = m.mutable_batch();
  b->set_batch_seq(batchSeq);
  for (const auto& [iid, value] : strings) {
    auto* s = b->add_strings();
    s->set_iid(iid);
    s->set_value(value);
  }
  for (const Record& r : records) {
    v1::Event* e = b->add_events();
    e->set_seq(r.seq);
    e->set_ts_ns(r.tsNs);
    e->set_thread_id(r.threadId);
    switch (r.kind) {
      case RecordKind::kAlloc: {
        auto* a = e->mutable_alloc();
        a->set_address(r.address);
        a->set_size_bytes(r.sizeBytes);
        a->set_kind(static_cast<v1::MemoryKind>(r.small));
        a->set_device(r.device);
        a->set_restated((r.reserved & kAllocRestated) != 0);
        break;
      }
      case RecordKind::kFree: {
        auto* f = e->mutable_free();
        f->set_address(r.address);
        f->set_kind(static_cast<v1::MemoryKind>(r.small));
        f->set_device(r.device);
        break;
      }
      case RecordKind::kScopeBegin: {
        auto* s = e->mutable_scope_begin();
        s->set_name_iid(r.nameIid);
        s->set_kind(static_cast<v1::ScopeKind>(r.small));
        s->set_correlation_id(static_cast<uint32_t>(r.address));
        break;
      }
      case RecordKind::kScopeEnd:
        e->mutable_scope_end()->set_name_iid(r.nameIid);
        e->mutable_scope_end()->set_kind(static_cast<v1::ScopeKind>(r.small));
        break;
      case RecordKind::kLaunch:
        e->mutable_launch()->set_correlation_id(static_cast<uint32_t>(r.address));
        break;
      case RecordKind::kPhaseBegin:
        e->mutable_phase_begin()->set_phase(static_cast<v1::Phase>(r.small));
        break;
      case RecordKind::kPhaseEnd:
        e->mutable_phase_end()->set_phase(static_cast<v1::Phase>(r.small));
        break;
      case RecordKind::kStepBegin:
        e->mutable_step_begin()->set_step(static_cast<int64_t>(r.address));
        break;
      case RecordKind::kStepEnd:
        e->mutable_step_end()->set_step(static_cast<int64_t>(r.address));
        break;
      case RecordKind::kCounter:
        e->mutable_counter()->set_name_iid(r.nameIid);
        e->mutable_counter()->set_value(static_cast<int64_t>(r.sizeBytes));
        break;
      case RecordKind::kTag: {
        auto* t = e->mutable_tag();
        t->set_address(r.address);
        t->set_size_bytes(r.sizeBytes);
        t->set_category(static_cast<v1::Category>(r.small));
        t->set_name_iid(r.nameIid);
        break;
      }
      case RecordKind::kStack:
        e->mutable_stack()->set_address(r.address);
        e->mutable_stack()->set_frames_iid(r.nameIid);
        break;
      case RecordKind::kSummarized:
        e->mutable_summarized()->set_last_seq(r.address);
        e->mutable_summarized()->set_unused(r.small != 0);
        break;
      case RecordKind::kStepSummary: {
        auto* f = e->mutable_step_figure();
        f->set_step(static_cast<int64_t>(r.address));
        f->set_device(r.device);
        f->set_figure(static_cast<v1::SummaryFigure>(r.small));
        f->set_category(static_cast<v1::Category>(r.reserved));
        f->set_value(static_cast<int64_t>(r.sizeBytes));
        break;
      }
    }
  }
  return m;
}

Record record(RecordKind kind, uint64_t seq) {
  Record r{};
  r.kind = kind;
  r.seq = seq;
  return r;
}

TEST(BatchEncoderTest, WritesWhatProtobufWritesForEveryKindAndExtreme) {
  std::vector<Record> records;
  uint64_t seq = 1;
  // Every kind with all fields zero (an empty payload must still select the oneof member) ...
  for (uint8_t k = 1; k <= 14; ++k) records.push_back(record(static_cast<RecordKind>(k), seq++));
  // ... with the largest and the negative values each field can hold ...
  for (uint8_t k = 1; k <= 14; ++k) {
    Record r = record(static_cast<RecordKind>(k), std::numeric_limits<uint64_t>::max() - k);
    r.small = 3;
    r.reserved = k == 1 ? kAllocRestated : 11;  // a restated alloc; a figure's category
    r.threadId = std::numeric_limits<uint32_t>::max();
    r.tsNs = std::numeric_limits<int64_t>::min();
    r.address = std::numeric_limits<uint64_t>::max();  // a step of -1, a correlation id cut
    r.sizeBytes = static_cast<uint64_t>(-5);           // a negative counter
    r.nameIid = std::numeric_limits<uint32_t>::max();
    r.device = -1;
    records.push_back(r);
  }
  // ... and at random.
  std::mt19937_64 random(11);
  for (int i = 0; i < 2000; ++i) {
    Record r = record(static_cast<RecordKind>(1 + random() % 14), random() >> (random() % 64));
    r.small = static_cast<uint8_t>(random() % 4);
    r.reserved = static_cast<uint16_t>(random() % 12);
    r.threadId = static_cast<uint32_t>(random() >> (random() % 64));
    r.tsNs = static_cast<int64_t>(random() >> (random() % 64));
    r.address = random() >> (random() % 64);
    r.sizeBytes = random() >> (random() % 64);
    r.nameIid = static_cast<uint32_t>(random() >> (random() % 64));
    r.device = static_cast<int32_t>(random() % 9) - 1;
    records.push_back(r);
  }
  const std::vector<std::pair<uint32_t, std::string>> strings = {
      {1, "model.blocks.0.attn"}, {2, ""}, {0xffffffffu, std::string(300, 'x')}, {7, "a\0b"}};
  for (uint64_t batchSeq : {uint64_t{0}, uint64_t{1}, std::numeric_limits<uint64_t>::max()}) {
    const std::string ours = encodeBatchMessage(batchSeq, strings, records);
    EXPECT_EQ(ours, reference(batchSeq, strings, records).SerializeAsString());
    v1::AgentMessage parsed;
    ASSERT_TRUE(parsed.ParseFromString(ours));
    ASSERT_EQ(parsed.batch().events_size(), static_cast<int>(records.size()));
    EXPECT_EQ(parsed.batch().events(0).payload_case(), v1::Event::kAlloc);
    EXPECT_EQ(parsed.batch().events(15).free().device(), -1);  // the extreme Free
    EXPECT_TRUE(parsed.batch().events(14).alloc().restated());
    EXPECT_EQ(parsed.batch().events(26).step_figure().step(), -1);
    EXPECT_EQ(parsed.batch().events(27).stack().frames_iid(), 0xffffffffu);
  }
  // Nothing at all: an AgentMessage whose batch is present and empty.
  EXPECT_EQ(encodeBatchMessage(0, {}, {}), reference(0, {}, {}).SerializeAsString());
  // The agent's counters, after the events (field 4), as protobuf writes them: every field at
  // its largest, and a few set; with events and strings, and alone.
  v1::AgentCounters full;
  const google::protobuf::Reflection* reflection = full.GetReflection();
  const google::protobuf::Descriptor* descriptor = full.GetDescriptor();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = descriptor->field(i);
    if (f->type() == google::protobuf::FieldDescriptor::TYPE_BOOL) {
      reflection->SetBool(&full, f, true);
    } else {
      reflection->SetUInt64(&full, f, std::numeric_limits<uint64_t>::max() - i);
    }
  }
  v1::AgentCounters some;
  some.set_events_sent(12);
  some.set_adapter_failures(3);
  for (const v1::AgentCounters* c : {&full, &some}) {
    v1::AgentMessage expected = reference(9, strings, records);
    *expected.mutable_batch()->mutable_counters() = *c;
    EXPECT_EQ(encodeBatchMessage(9, strings, records, c->SerializeAsString()),
              expected.SerializeAsString());
    v1::AgentMessage alone = reference(10, {}, {});
    *alone.mutable_batch()->mutable_counters() = *c;
    const std::string ours = encodeBatchMessage(10, {}, {}, c->SerializeAsString());
    EXPECT_EQ(ours, alone.SerializeAsString());
    v1::AgentMessage parsed;
    ASSERT_TRUE(parsed.ParseFromString(ours));
    EXPECT_EQ(parsed.batch().counters().adapter_failures(), c->adapter_failures());
  }
}

// The agent's exit writes what its buffer holds raw (rawRecordsHead, then the records as they lie
// in memory) into the handed-off file; whoever reads the file gets exactly the batches the sender
// would have made of the same records: the same numbers, at most kMaxEventsPerBatch events each,
// the strings in the first.
TEST(BatchEncoderTest, RawRecordsInAFileReadBackAsTheSendersBatches) {
  std::vector<Record> records;
  std::mt19937_64 random(5);
  for (uint64_t seq = 1; seq <= 2 * kMaxEventsPerBatch + 100; ++seq) {
    Record r = record(static_cast<RecordKind>(1 + random() % 14), seq);
    r.threadId = static_cast<uint32_t>(random());
    r.tsNs = static_cast<int64_t>(random() >> 4);
    r.address = random();
    r.sizeBytes = random() >> 20;
    r.device = -1;
    records.push_back(r);
  }
  const std::vector<std::pair<uint32_t, std::string>> strings = {{3, "model.fc"}, {4, ""}};
  char dir[] = "/tmp/tidemark-raw-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/handoff.bin";
  {
    SpoolWriter file(path, 1u << 30);
    // Two runs of the buffer (a whole chunk, then the rest), then a message of strings alone.
    const size_t first = kMaxEventsPerBatch;
    ASSERT_TRUE(file.appendSerialized(rawRecordsHead(7, strings, first * sizeof(Record)),
                                      records.data(), first * sizeof(Record)));
    const size_t rest = records.size() - first;
    ASSERT_TRUE(file.appendSerialized(rawRecordsHead(8, {}, rest * sizeof(Record)),
                                      records.data() + first, rest * sizeof(Record)));
    ASSERT_TRUE(file.appendSerialized(rawRecordsHead(10, {{9, "late"}}, 0), nullptr, 0));
  }
  client::SpoolReader reader(path);
  std::vector<std::string> got;
  v1::AgentMessage message;
  while (reader.next(&message)) got.push_back(message.SerializeAsString());
  EXPECT_EQ(reader.error(), "");
  auto part = [&](size_t from, size_t n) {
    return std::vector<Record>(records.begin() + static_cast<long>(from),
                               records.begin() + static_cast<long>(from + n));
  };
  const size_t k = kMaxEventsPerBatch;
  const std::vector<std::string> expected = {reference(7, strings, part(0, k)).SerializeAsString(),
                                             reference(8, {}, part(k, k)).SerializeAsString(),
                                             reference(9, {}, part(2 * k, 100)).SerializeAsString(),
                                             reference(10, {{9, "late"}}, {}).SerializeAsString()};
  EXPECT_EQ(got, expected);

  // Another build's layout, or bytes that are not whole records: refused, never misread.
  const std::string other = std::string(dir) + "/other.bin";
  {
    SpoolWriter file(other, 1u << 30);
    v1::AgentMessage m;
    m.mutable_raw_records()->set_layout(kRecordLayout + 1);
    m.mutable_raw_records()->set_records(std::string(sizeof(Record), '\0'));
    ASSERT_TRUE(file.append(m));
  }
  client::SpoolReader bad(other);
  EXPECT_FALSE(bad.next(&message));
  EXPECT_NE(bad.error().find("layout"), std::string::npos) << bad.error();
  v1::RawRecords torn;
  torn.set_layout(kRecordLayout);
  torn.set_records(std::string(sizeof(Record) + 1, '\0'));
  const std::string why = rawRecordsProblem(torn);
  EXPECT_NE(why.find("not whole records"), std::string::npos) << why;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tidemark::agent
