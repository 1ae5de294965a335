#include "server/rpc/agent_counters.h"

#include <limits>

namespace tidemark::server {

int64_t counterValue(std::initializer_list<uint64_t> values) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t sum = 0;
  for (uint64_t v : values) sum = (v > kMax - sum) ? kMax : sum + v;
  return static_cast<int64_t>(sum);
}

int64_t agentEventsDropped(const v1::AgentCounters& c) {
  return counterValue({c.dropped_ring_full(), c.dropped_no_ring(), c.dropped_table_full(),
                       c.dropped_spool_full(), c.dropped_disconnected(), c.dropped_buffer_full()});
}

void appendAgentCounterStats(const v1::AgentCounters& c, std::vector<StatRow>* stats) {
  auto agentStat = [&](const char* name, uint64_t v, const char* what,
                       const char* severity = "data_loss") {
    if (v != 0) stats->push_back({name, severity, counterValue(v), what});
  };
  agentStat("agent_dropped_ring_full", c.dropped_ring_full(), "agent: a thread's ring was full");
  agentStat("agent_dropped_no_ring", c.dropped_no_ring(), "agent: no ring left for a thread");
  agentStat("agent_dropped_table_full", c.dropped_table_full(), "agent: the block table was full");
  agentStat("agent_dropped_spool_full", c.dropped_spool_full(), "agent: the spool was full");
  agentStat("agent_dropped_disconnected", c.dropped_disconnected(),
            "agent: the stream broke and could not be resumed");
  agentStat("agent_dropped_buffer_full", c.dropped_buffer_full(),
            "agent (lossy or degraded): its buffer (memory and file) was full while the stream "
            "could not take more");
  agentStat("agent_degraded", c.degraded() ? 1 : 0,
            "agent: a thread waited past the deadline for room; full rings dropped from then on");
  agentStat("agent_lossy", c.lossy() ? 1 : 0,
            "agent: lossy mode (TIDEMARK_LOSSY=1): full rings dropped instead of waiting", "info");
  agentStat("agent_ring_waits", c.ring_waits(),
            "agent: times a thread waited for room in its full ring (nothing lost)", "info");
  agentStat("agent_buffered_to_disk", c.events_buffered_to_disk(),
            "agent: records that went through its buffer file (the stream was slower)", "info");
  agentStat("agent_handed_off", c.events_handed_off(),
            "agent: events of the end of the run it handed to the daemon in a file at exit "
            "(stored from the file; nothing lost)",
            "info");
  agentStat("adapter_failures", c.adapter_failures(),
            "adapter: times a hook or wrapper of the Python adapter failed; the job's call went "
            "on, and what that call marks (a module scope, a phase, a tag) may be missing",
            "error");
  agentStat("agent_memory_shortages", c.memory_shortages(),
            "agent: times it could not get memory (the job at its memory limit) and kept its "
            "events in its buffer file or tried again (what was lost is in the dropped counts)",
            "info");
  agentStat("agent_reconnects", c.reconnects(),
            "agent: times the stream broke and the agent resumed the session (nothing lost)",
            "info");
}

}  // namespace tidemark::server
