// Golden tests, perfetto-style: a small event stream in (tests/golden/<case>.events), sent
// through the real Ingest API to an in-process tidemarkd with a real SQLite file, analysed,
// queried, rendered as text and compared with tests/golden/<case>.expected. Each case runs again
// with a real PostgreSQL store (the tests' server, tests/support/postgres_test_db.h) against the
// same expected text: the two backends' conformance.
//
// Event lines (one event each; `batch` starts a new EventBatch, so batches can arrive out of
// order by listing later sequence numbers first):
//   alloc SEQ ADDR SIZE [THREAD]      free SEQ ADDR [THREAD]
//   device_alloc SEQ ADDR SIZE DEVICE  device_free SEQ ADDR DEVICE  (device memory: a segment)
//   tensor_alloc SEQ ADDR SIZE DEVICE  tensor_free SEQ ADDR DEVICE  (a tensor in a segment)
//   tag SEQ ADDR SIZE CATEGORY NAME    scope_begin SEQ NAME [THREAD]   scope_end SEQ NAME [THREAD]
//   op_begin SEQ NAME [THREAD]         op_end SEQ NAME [THREAD]
//   phase_begin SEQ PHASE              phase_end SEQ PHASE
//   step_begin SEQ STEP                step_end SEQ STEP
// Timestamps are 100 * SEQ. Set TIDEMARK_GOLDEN_UPDATE=1 to rewrite the .expected files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "server/server.h"
#include "server/store/database.h"
#include "src/core/categorize.h"
#include "tests/support/postgres_test_db.h"
#include "tidemark/v1/ingest.grpc.pb.h"
#include "tidemark/v1/query.grpc.pb.h"

namespace tidemark::server {
namespace {

namespace fs = std::filesystem;

const fs::path kGoldenDir = TIDEMARK_GOLDEN_DIR;

// Parses a .events file into agent messages (handshake first, goodbye last).
std::vector<v1::AgentMessage> parseEvents(const fs::path& path, std::string* error) {
  std::ifstream in(path);
  std::vector<v1::AgentMessage> out(1);
  auto* h = out[0].mutable_handshake();
  h->set_magic(kHandshakeMagic);
  h->set_protocol_version(kProtocolVersion);
  h->set_pid(1);
  h->set_command_line(path.filename().string());
  std::map<std::string, uint32_t> names;
  uint64_t events = 0;
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string kind;
    ss >> kind;
    if (kind == "batch") {
      out.emplace_back().mutable_batch()->set_batch_seq(out.size() - 1);
      continue;
    }
    if (out.size() == 1) {
      *error = "line " + std::to_string(lineNo) + ": event before the first `batch`";
      return {};
    }
    v1::EventBatch* batch = out.back().mutable_batch();
    auto intern = [&](const std::string& name) {
      auto [it, added] = names.try_emplace(name, static_cast<uint32_t>(names.size() + 1));
      if (added) {
        auto* s = batch->add_strings();
        s->set_iid(it->second);
        s->set_value(name);
      }
      return it->second;
    };
    uint64_t seq = 0;
    ss >> seq;
    v1::Event* e = batch->add_events();
    e->set_seq(seq);
    e->set_ts_ns(static_cast<int64_t>(seq) * 100);
    e->set_thread_id(1);
    std::string a;
    std::string b;
    uint32_t thread = 0;
    if (kind == "alloc") {
      uint64_t size = 0;
      ss >> a >> size >> thread;
      e->mutable_alloc()->set_address(std::stoull(a, nullptr, 0));
      e->mutable_alloc()->set_size_bytes(size);
    } else if (kind == "free") {
      ss >> a >> thread;
      e->mutable_free()->set_address(std::stoull(a, nullptr, 0));
    } else if (kind == "device_alloc" || kind == "tensor_alloc") {
      uint64_t size = 0;
      int device = 0;
      ss >> a >> size >> device;
      auto* al = e->mutable_alloc();
      al->set_address(std::stoull(a, nullptr, 0));
      al->set_size_bytes(size);
      al->set_kind(kind == "device_alloc" ? v1::MEMORY_KIND_DEVICE : v1::MEMORY_KIND_TENSOR);
      al->set_device(device);
    } else if (kind == "device_free" || kind == "tensor_free") {
      int device = 0;
      ss >> a >> device;
      auto* f = e->mutable_free();
      f->set_address(std::stoull(a, nullptr, 0));
      f->set_kind(kind == "device_free" ? v1::MEMORY_KIND_DEVICE : v1::MEMORY_KIND_TENSOR);
      f->set_device(device);
    } else if (kind == "tag") {
      uint64_t size = 0;
      ss >> a >> size >> b;
      std::string name;
      ss >> name;
      v1::Category c = v1::CATEGORY_UNSPECIFIED;
      if (!v1::Category_Parse("CATEGORY_" + b, &c)) {
        *error = "line " + std::to_string(lineNo) + ": unknown category " + b;
        return {};
      }
      auto* t = e->mutable_tag();
      t->set_address(std::stoull(a, nullptr, 0));
      t->set_size_bytes(size);
      t->set_category(c);
      t->set_name_iid(name.empty() ? 0 : intern(name));
    } else if (kind == "scope_begin" || kind == "scope_end" || kind == "op_begin" ||
               kind == "op_end") {
      ss >> a >> thread;
      const uint32_t iid = intern(a);
      const v1::ScopeKind sk =
          kind.rfind("op_", 0) == 0 ? v1::SCOPE_KIND_OP : v1::SCOPE_KIND_MODULE;
      if (kind == "scope_begin" || kind == "op_begin") {
        e->mutable_scope_begin()->set_name_iid(iid);
        e->mutable_scope_begin()->set_kind(sk);
      } else {
        e->mutable_scope_end()->set_name_iid(iid);
        e->mutable_scope_end()->set_kind(sk);
      }
    } else if (kind == "phase_begin" || kind == "phase_end") {
      ss >> a;
      v1::Phase p = v1::PHASE_UNSPECIFIED;
      for (char& ch : a) ch = static_cast<char>(std::toupper(ch));
      if (!v1::Phase_Parse("PHASE_" + a, &p)) {
        *error = "line " + std::to_string(lineNo) + ": unknown phase " + a;
        return {};
      }
      if (kind == "phase_begin") {
        e->mutable_phase_begin()->set_phase(p);
      } else {
        e->mutable_phase_end()->set_phase(p);
      }
    } else if (kind == "step_begin" || kind == "step_end") {
      int64_t step = 0;
      ss >> step;
      if (kind == "step_begin") {
        e->mutable_step_begin()->set_step(step);
      } else {
        e->mutable_step_end()->set_step(step);
      }
    } else {
      *error = "line " + std::to_string(lineNo) + ": unknown event " + kind;
      return {};
    }
    if (thread != 0) e->set_thread_id(thread);
    ++events;
  }
  out.emplace_back().mutable_goodbye()->mutable_counters()->set_events_sent(events);
  return out;
}

std::string hex(int64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

void renderState(std::ostringstream& out, const v1::Breakdown& b) {
  out << "seq=" << b.seq() << " step=" << b.step()
      << " phase=" << (b.phase().empty() ? "-" : b.phase())
      << " scope=" << (b.scope().empty() ? "-" : b.scope()) << " tracked=" << b.tracked_bytes();
  for (const auto& c : b.categories()) {
    if (c.bytes() != 0 || c.blocks() != 0) out << " " << c.name() << "=" << c.bytes();
  }
  out << "\n";
}

// Everything the golden files pin down, read through the Query API and, for per-block
// categories and rules, straight from the store.
std::string render(v1::Query::Stub& query, const std::string& db, uint64_t session) {
  std::ostringstream out;
  grpc::ClientContext c1;
  v1::GetSessionRequest sr;
  sr.set_session_id(session);
  v1::SessionInfo info;
  if (!query.GetSession(&c1, sr, &info).ok()) return "GetSession failed\n";
  out << "session: state=" << v1::SessionState_Name(info.state()).substr(14)
      << " received=" << info.events_received() << " stored=" << info.events_stored()
      << " blocks=" << info.blocks() << " live_at_end=" << info.live_blocks_at_end()
      << " steps=" << info.steps() << "\n";
  for (const auto& st : info.stats()) out << "stat: " << st.name() << "=" << st.value() << "\n";

  Database d;
  if (!Database::open(db, true, &d).ok()) return "open failed\n";
  std::string codes;
  {
    Statement st =
        d.prepare("SELECT codes FROM block_category WHERE session_id = ?1 ORDER BY chunk");
    st.bind(1, static_cast<int64_t>(session));
    while (st.step()) codes += std::string(st.columnBlob(0));
  }
  Statement blocks = d.prepare(
      "SELECT address, size_bytes, alloc_seq, free_seq, memory_kind, device FROM allocation "
      "WHERE session_id = ?1 ORDER BY id");
  blocks.bind(1, static_cast<int64_t>(session));
  size_t i = 0;
  out << "blocks (address size alloc free category rule):\n";
  while (blocks.step()) {
    const int code = i < codes.size() ? static_cast<unsigned char>(codes[i]) : 0;
    ++i;
    const auto cat = core::categoryFromWire(code & 15);
    out << "  " << hex(blocks.columnInt(0)) << " " << blocks.columnInt(1) << " "
        << blocks.columnInt(2) << " "
        << (blocks.columnNull(3) ? std::string("live") : std::to_string(blocks.columnInt(3))) << " "
        << (cat ? core::categoryName(*cat) : "?") << " "
        << core::ruleName(static_cast<core::CategoryRule>(code >> 4));
    // Host blocks as before; device memory and tensors name their kind and device.
    const int64_t memoryKind = blocks.columnInt(4);
    if (memoryKind != 1)
      out << " " << (memoryKind == 2 ? "device" : "tensor") << ":" << blocks.columnInt(5);
    out << "\n";
  }

  grpc::ClientContext c2;
  v1::PeakRequest pr;
  pr.set_session_id(session);
  v1::Peak peak;
  if (!query.GetPeak(&c2, pr, &peak).ok()) return out.str() + "GetPeak failed\n";
  out << "peak: ";
  renderState(out, peak.breakdown());
  for (const auto& m : peak.modules()) out << "  module " << m.name() << " " << m.bytes() << "\n";
  for (const auto& o : peak.ops()) out << "  op " << o.name() << " " << o.bytes() << "\n";
  for (int64_t step = 1; step <= info.steps(); ++step) {
    grpc::ClientContext c3;
    v1::BreakdownRequest br;
    br.set_session_id(session);
    br.set_has_step(true);
    br.set_step(step);
    v1::Breakdown b;
    if (!query.GetBreakdown(&c3, br, &b).ok()) return out.str() + "GetBreakdown failed\n";
    out << "step " << step << " peak: ";
    renderState(out, b);
  }
  return out.str();
}

// A case and the store it runs on ("sqlite" or "postgresql").
class GoldenTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(GoldenTest, MatchesExpected) {
  const std::string name = std::get<0>(GetParam());
  const bool postgres = std::get<1>(GetParam()) == "postgresql";
  const fs::path events = kGoldenDir / (name + ".events");
  const fs::path expected = kGoldenDir / (name + ".expected");
  std::string error;
  const std::vector<v1::AgentMessage> messages = parseEvents(events, &error);
  ASSERT_TRUE(error.empty()) << events << ": " << error;

  const fs::path dir =
      fs::temp_directory_path() / ("tidemark-golden-" + std::to_string(getpid()) + "-" + name);
  fs::remove_all(dir);
  ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.dbPath = (dir / "store.db").string();
  if (postgres) {
    auto uri = tidemark::test_support::freshPostgresDatabase();
    ASSERT_TRUE(uri.ok()) << uri.status();
    o.dbPath = *uri;
  }
  Server server(o);
  ASSERT_TRUE(server.start().ok());
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto ingest = v1::Ingest::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = ingest->Stream(&ctx);
  for (const auto& m : messages) ASSERT_TRUE(stream->Write(m));
  stream->WritesDone();
  v1::ServerMessage reply;
  uint64_t session = 0;
  while (stream->Read(&reply)) {
    if (reply.has_handshake_reply()) session = reply.handshake_reply().session_id();
  }
  ASSERT_TRUE(stream->Finish().ok());
  server.analysis()->waitIdle();
  auto query = v1::Query::NewStub(channel);
  const std::string actual = render(*query, o.dbPath, session);
  server.shutdown();
  fs::remove_all(dir);

  if (std::getenv("TIDEMARK_GOLDEN_UPDATE") != nullptr && !postgres) {
    std::ofstream(expected) << actual;
    GTEST_SKIP() << "rewrote " << expected;
  }
  std::ifstream in(expected);
  ASSERT_TRUE(in.good()) << expected << " is missing (TIDEMARK_GOLDEN_UPDATE=1 writes it)";
  const std::string want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(actual, want) << "golden case " << name << " on " << std::get<1>(GetParam());
}

std::vector<std::string> cases() {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(kGoldenDir)) {
    if (entry.path().extension() == ".events") out.push_back(entry.path().stem().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest,
                         ::testing::Combine(::testing::ValuesIn(cases()),
                                            ::testing::Values("sqlite", "postgresql")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
}  // namespace tidemark::server
