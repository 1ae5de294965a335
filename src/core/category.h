#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tidemark::core {

// The memory categories of DESIGN §3. The numbers are those of tidemark.v1.Category on the
// wire and in the store; never renumber.
enum class Category : uint8_t {
  kWeight = 1,
  kGradient = 2,
  kOptimizerState = 3,
  kActivation = 4,
  kCheckpointInput = 5,
  kRecomputed = 6,
  kInput = 7,
  kTemporary = 8,
  kWorkspace = 9,
  kAllocatorSlack = 10,
  kUnknown = 11,
};
inline constexpr int kCategoryCount = 11;

// All categories in wire order, for iteration.
inline constexpr std::array<Category, kCategoryCount> kAllCategories = {
    Category::kWeight,         Category::kGradient,        Category::kOptimizerState,
    Category::kActivation,     Category::kCheckpointInput, Category::kRecomputed,
    Category::kInput,          Category::kTemporary,       Category::kWorkspace,
    Category::kAllocatorSlack, Category::kUnknown};

inline constexpr int categoryIndex(Category c) { return static_cast<int>(c) - 1; }

std::string_view categoryName(Category c);
std::optional<Category> categoryFromName(std::string_view name);
std::optional<Category> categoryFromWire(int value);

// When a block received several framework tags, the one with the highest priority decides:
// a parameter saved for backward is still a WEIGHT, a batch saved by an embedding is INPUT.
int tagPriority(Category c);

enum class Phase : uint8_t {
  kNone = 0,
  kForward = 1,
  kBackward = 2,
  kRecompute = 3,
  kOptimizer = 4,
  kEval = 5,  // an evaluation pass (no_grad, or a model no optimizer trains)
};
std::string_view phaseName(Phase p);
std::optional<Phase> phaseFromWire(int value);

}  // namespace tidemark::core
