#pragma once

#include <cstdint>
#include <string>

namespace tidemark::gui {

// "63.84 MiB", "512 B": the GUI's one way of writing sizes.
std::string humanBytes(int64_t bytes);

}  // namespace tidemark::gui
