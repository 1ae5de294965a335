#pragma once

#include <cstdint>
#include <string>

namespace tidemark::gui {

// "63.84 MiB", "512 B": the GUI's one way of writing sizes.
std::string humanBytes(int64_t bytes);

// What the job said beside an applied plan's "applied" (its steps took another path than the
// recorded one: "applied; but in step 31 ..."): the note to show, "" when there is none.
std::string appliedPlanNote(const std::string& message);

}  // namespace tidemark::gui
