#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "server/store/store.h"
#include "tidemark/v1/events.pb.h"

namespace tidemark::server {

// An agent's counter (or a sum of them) as a stored figure: saturated at the int64 limit, so
// that a wrong or hostile value never wraps into a negative figure.
int64_t counterValue(std::initializer_list<uint64_t> values);
inline int64_t counterValue(uint64_t value) { return counterValue({value}); }

// Every event the agent counted as lost, added up (the session's events_dropped).
int64_t agentEventsDropped(const v1::AgentCounters& c);

// The agent's counters that are not zero, as a session's stats (agent_* and adapter_failures),
// each with its severity and what it means.
void appendAgentCounterStats(const v1::AgentCounters& c, std::vector<StatRow>* stats);

}  // namespace tidemark::server
