// `tidemark import FILE`: a recording made by another tool (a PyTorch memory snapshot, a Kineto /
// PyTorch-profiler trace) becomes a session. The file is read and converted here, completely,
// before anything is sent: a file that does not parse stores nothing.
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <unordered_map>

#include "cli/client.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "server/rpc/ingest_service.h"
#include "src/advisor/planner.h"
#include "src/importers/kineto_trace.h"
#include "src/importers/memory_snapshot.h"
#include "tidemark/v1/ingest.grpc.pb.h"

namespace tidemark::cli {

namespace {

// The most a file may hold, compressed or inflated, unless --max-size says otherwise.
constexpr uint64_t kDefaultMaxBytes = uint64_t{1} << 30;
constexpr int kEventsPerBatch = 10000;

bool readAll(const std::string& path, uint64_t maxBytes, std::string* out, std::string* error) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    *error = "cannot read " + path;
    return false;
  }
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<uint64_t>(size) > maxBytes) {
    *error = path + " is larger than " + humanBytes(static_cast<int64_t>(maxBytes)) +
             " (raise the limit with --max-size)";
    return false;
  }
  in.seekg(0);
  out->resize(static_cast<size_t>(size));
  if (!in.read(out->data(), size)) {
    *error = "cannot read " + path;
    return false;
  }
  return true;
}

// Inflates gzip data; false with *error on anything that is not a complete gzip stream.
bool gunzip(const std::string& in, uint64_t maxBytes, std::string* out, std::string* error) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) {
    *error = "zlib failed to start";
    return false;
  }
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  char buf[1 << 16];
  int rc = Z_OK;
  while (rc == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) break;
    out->append(buf, sizeof buf - z.avail_out);
    if (out->size() > maxBytes) {
      inflateEnd(&z);
      *error = "the file inflates to more than " + humanBytes(static_cast<int64_t>(maxBytes)) +
               " (raise the limit with --max-size)";
      return false;
    }
    if (rc == Z_OK && z.avail_in == 0 && z.avail_out != 0) {
      rc = Z_BUF_ERROR;  // input ended inside the stream
      break;
    }
  }
  inflateEnd(&z);
  if (rc != Z_STREAM_END) {
    *error = std::string("not valid gzip data (") + (z.msg ? z.msg : "truncated") + ")";
    return false;
  }
  return true;
}

// Progress on stderr while a terminal watches; nothing otherwise.
class Progress {
 public:
  explicit Progress(bool quiet) : m_on(!quiet && isatty(STDERR_FILENO)) {}
  void say(const std::string& what) {
    if (m_on) std::fprintf(stderr, "\r\033[Ktidemark import: %s", what.c_str());
  }
  void done() {
    if (m_on) std::fprintf(stderr, "\r\033[K");
  }

 private:
  bool m_on;
};

v1::Event toEvent(const core::ImportEvent& e, uint64_t seq,
                  std::unordered_map<std::string, uint32_t>& interned,
                  std::vector<std::pair<uint32_t, std::string>>& newStrings) {
  auto intern = [&](const std::string& s) -> uint32_t {
    if (s.empty()) return 0;
    auto it = interned.find(s);
    if (it != interned.end()) return it->second;
    const auto id = static_cast<uint32_t>(interned.size() + 1);
    interned.emplace(s, id);
    newStrings.emplace_back(id, s);
    return id;
  };
  v1::Event ev;
  ev.set_seq(seq);
  ev.set_ts_ns(e.tsNs);
  ev.set_thread_id(e.thread);
  const v1::MemoryKind kind = e.device >= 0 ? v1::MEMORY_KIND_DEVICE : v1::MEMORY_KIND_HOST;
  switch (e.kind) {
    case core::ImportEvent::Kind::kAlloc: {
      v1::Alloc* a = ev.mutable_alloc();
      a->set_address(e.address);
      a->set_size_bytes(e.sizeBytes);
      a->set_kind(kind);
      a->set_device(e.device);
      a->set_stream(e.stream);
      break;
    }
    case core::ImportEvent::Kind::kFree: {
      v1::Free* f = ev.mutable_free();
      f->set_address(e.address);
      f->set_kind(kind);
      f->set_device(e.device);
      f->set_stream(e.stream);
      break;
    }
    case core::ImportEvent::Kind::kTag: {
      v1::Tag* t = ev.mutable_tag();
      t->set_address(e.address);
      t->set_size_bytes(e.sizeBytes);
      t->set_category(static_cast<v1::Category>(static_cast<int>(e.category)));
      t->set_name_iid(intern(e.name));
      break;
    }
    case core::ImportEvent::Kind::kScopeBegin:
      ev.mutable_scope_begin()->set_name_iid(intern(e.name));
      ev.mutable_scope_begin()->set_kind(e.kernel ? v1::SCOPE_KIND_KERNEL
                                         : e.op   ? v1::SCOPE_KIND_OP
                                                  : v1::SCOPE_KIND_MODULE);
      break;
    case core::ImportEvent::Kind::kScopeEnd:
      ev.mutable_scope_end()->set_name_iid(intern(e.name));
      ev.mutable_scope_end()->set_kind(e.kernel ? v1::SCOPE_KIND_KERNEL
                                       : e.op   ? v1::SCOPE_KIND_OP
                                                : v1::SCOPE_KIND_MODULE);
      break;
    case core::ImportEvent::Kind::kStepBegin:
      ev.mutable_step_begin()->set_step(e.step);
      break;
    case core::ImportEvent::Kind::kStepEnd:
      ev.mutable_step_end()->set_step(e.step);
      break;
    case core::ImportEvent::Kind::kStack:
      ev.mutable_stack()->set_address(e.address);
      ev.mutable_stack()->set_frames_iid(intern(e.name));
      break;
    case core::ImportEvent::Kind::kCounter:
      ev.mutable_counter()->set_name_iid(intern(e.name));
      ev.mutable_counter()->set_value(e.value);
      break;
  }
  return ev;
}

}  // namespace

int importCommand(const GlobalOptions& g, const std::vector<std::string>& args) {
  static const char* kUsage =
      "usage: tidemark import FILE [--name NAME] [--max-size SIZE] [--quiet] [--json]\n\n"
      "Stores a recording made by another tool as a session:\n"
      "  a PyTorch CUDA memory snapshot (torch.cuda.memory._dump_snapshot / _snapshot(),\n"
      "  a pickle; read without running anything in it), or\n"
      "  a PyTorch profiler / Kineto trace (Chrome trace JSON, .json or .json.gz).\n"
      "The file is converted completely before anything is sent: a file that does not parse\n"
      "stores nothing. Progress goes to stderr on a terminal (--quiet: none).\n"
      "--max-size: the most the file may hold, compressed or inflated (default 1GiB;\n"
      "  e.g. 4GiB): a larger one is refused before it is read.\n";
  std::string path, name;
  bool quiet = false;
  uint64_t maxBytes = kDefaultMaxBytes;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else if (a == "--quiet") {
      quiet = true;
    } else if (a == "--name" && i + 1 < args.size()) {
      name = args[++i];
    } else if (a == "--max-size" && i + 1 < args.size()) {
      const absl::StatusOr<core::BudgetSpec> size = core::parseBudget(args[++i]);
      if (!size.ok() || size->bytes <= 0) {
        std::fprintf(stderr, "tidemark import: bad --max-size '%s' (examples: 4GiB, 500MB)\n",
                     args[i].c_str());
        return kExitUsage;
      }
      maxBytes = static_cast<uint64_t>(size->bytes);
    } else if (!a.empty() && a[0] == '-') {
      std::fprintf(stderr, "tidemark import: unknown option '%s'\n%s", a.c_str(), kUsage);
      return kExitUsage;
    } else if (path.empty()) {
      path = a;
    } else {
      std::fprintf(stderr, "tidemark import: one FILE at a time\n");
      return kExitUsage;
    }
  }
  if (path.empty()) {
    std::fputs(kUsage, stderr);
    return kExitUsage;
  }
  Progress progress(quiet || g.json);
  std::string data, error;
  progress.say("reading " + path);
  if (!readAll(path, maxBytes, &data, &error)) {
    progress.done();
    std::fprintf(stderr, "tidemark import: %s\n", error.c_str());
    return kExitUsage;
  }
  if (data.size() >= 2 && static_cast<uint8_t>(data[0]) == 0x1f &&
      static_cast<uint8_t>(data[1]) == 0x8b) {
    progress.say("inflating " + path);
    std::string raw;
    if (!gunzip(data, maxBytes, &raw, &error)) {
      progress.done();
      std::fprintf(stderr, "tidemark import: %s: %s\n", path.c_str(), error.c_str());
      return kExitError;
    }
    data.swap(raw);
  } else if (path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0) {
    progress.done();
    std::fprintf(stderr, "tidemark import: %s: named .gz but not gzip data\n", path.c_str());
    return kExitError;
  }
  progress.say("parsing " + humanBytes(static_cast<int64_t>(data.size())));
  absl::StatusOr<core::ImportedRecording> rec;
  const size_t first = data.find_first_not_of(" \t\r\n");
  if (!data.empty() && static_cast<uint8_t>(data[0]) == 0x80) {
    rec = core::importMemorySnapshot(data);
  } else if (first != std::string::npos && (data[first] == '{' || data[first] == '[')) {
    rec = core::importKinetoTrace(data);
  } else {
    rec = absl::InvalidArgumentError(
        "not a PyTorch memory snapshot (pickle) nor a Kineto trace (JSON)");
  }
  data.clear();
  data.shrink_to_fit();
  if (!rec.ok()) {
    progress.done();
    std::fprintf(stderr, "tidemark import: %s: %s (nothing stored)\n", path.c_str(),
                 std::string(rec.status().message()).c_str());
    return kExitError;
  }
  if (rec->events.empty()) {
    progress.done();
    std::fprintf(stderr, "tidemark import: %s: no memory or op events to store (nothing stored)\n",
                 path.c_str());
    return kExitError;
  }

  int refused = kExitOk;
  const std::shared_ptr<grpc::Channel> channel = channelFor(g, &refused);
  if (!channel) return refused;
  auto stub = v1::Ingest::NewStub(channel);
  grpc::ClientContext ctx;
  // No limit of its own (a large trace takes long), --deadline's when given.
  if (g.deadlineS > 0) withDeadline(g, ctx, 0);
  auto stream = stub->Stream(&ctx);
  v1::AgentMessage hello;
  v1::Handshake* h = hello.mutable_handshake();
  h->set_magic(server::kHandshakeMagic);
  h->set_protocol_version(server::kProtocolVersion);
  h->set_pid(0);
  h->set_command_line("tidemark import " + path + " (" + rec->format + ")");
  h->set_session_name(name.empty() ? path.substr(path.rfind('/') + 1) : name);
  h->set_start_ts_ns(rec->events.front().tsNs);
  h->set_start_wall_ns(std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count());
  h->set_agent_version("import");
  h->set_first_batch_seq(1);
  v1::ServerMessage reply;
  if (!stream->Write(hello) || !stream->Read(&reply) || !reply.has_handshake_reply()) {
    progress.done();
    return reportError(g, "import", stream->Finish());
  }
  const uint64_t id = reply.handshake_reply().session_id();
  std::unordered_map<std::string, uint32_t> interned;
  uint64_t seq = 0, batchSeq = 0;
  const size_t total = rec->events.size();
  bool broken = false;
  for (size_t i = 0; i < total && !broken;) {
    v1::AgentMessage m;
    v1::EventBatch* batch = m.mutable_batch();
    batch->set_batch_seq(++batchSeq);
    std::vector<std::pair<uint32_t, std::string>> strings;
    for (int k = 0; k < kEventsPerBatch && i < total; ++k, ++i)
      *batch->add_events() = toEvent(rec->events[i], ++seq, interned, strings);
    for (auto& [iid, value] : strings) {
      v1::InternedString* s = batch->add_strings();
      s->set_iid(iid);
      s->set_value(std::move(value));
    }
    broken = !stream->Write(m);
    if (batchSeq % 20 == 0)
      progress.say("sent " + groupDigits(static_cast<int64_t>(i)) + " of " +
                   groupDigits(static_cast<int64_t>(total)) + " events");
  }
  if (!broken) {
    v1::AgentMessage bye;
    bye.mutable_goodbye()->mutable_counters()->set_events_recorded(seq);
    bye.mutable_goodbye()->mutable_counters()->set_events_sent(seq);
    bye.mutable_goodbye()->set_end_ts_ns(rec->events.back().tsNs);
    bye.mutable_goodbye()->set_exit_code(0);
    stream->Write(bye);
  }
  stream->WritesDone();
  while (stream->Read(&reply)) {
  }
  const grpc::Status s = stream->Finish();
  progress.done();
  if (!s.ok()) return reportError(g, "import", s);
  if (g.json) {
    std::string notes;
    for (const std::string& n : rec->notes) notes += (notes.empty() ? "" : ", ") + jsonString(n);
    std::printf(
        "{\"session\": %llu, \"format\": %s, \"events\": %llu, \"reserved_bytes\": %lld, "
        "\"allocated_at_end_bytes\": %lld, \"stated_peak_bytes\": %lld, "
        "\"preexisting_bytes\": %lld, \"modules\": %lld, \"ops\": %lld, "
        "\"kernels\": %lld, \"notes\": [%s]}\n",
        static_cast<unsigned long long>(id), jsonString(rec->format).c_str(),
        static_cast<unsigned long long>(seq), static_cast<long long>(rec->reservedBytes),
        static_cast<long long>(rec->allocatedAtEndBytes),
        static_cast<long long>(rec->statedPeakBytes), static_cast<long long>(rec->preexistingBytes),
        static_cast<long long>(rec->modules), static_cast<long long>(rec->ops),
        static_cast<long long>(rec->kernels), notes.c_str());
  } else {
    std::printf("imported %s as session %llu: %s events\n", rec->format.c_str(),
                static_cast<unsigned long long>(id),
                groupDigits(static_cast<int64_t>(seq)).c_str());
    if (rec->reservedBytes >= 0)
      std::printf("  reserved by the allocator: %s\n", humanBytes(rec->reservedBytes).c_str());
    if (rec->allocatedAtEndBytes >= 0)
      std::printf("  allocated at the dump:     %s\n",
                  humanBytes(rec->allocatedAtEndBytes).c_str());
    if (rec->statedPeakBytes >= 0)
      std::printf("  peak the file states:      %s\n", humanBytes(rec->statedPeakBytes).c_str());
    if (rec->ops || rec->kernels)
      std::printf("  ops %s, kernels %s\n", groupDigits(rec->ops).c_str(),
                  groupDigits(rec->kernels).c_str());
    for (const std::string& n : rec->notes) std::printf("  note: %s\n", n.c_str());
  }
  return kExitOk;
}

}  // namespace tidemark::cli
