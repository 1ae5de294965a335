#include "src/core/category.h"

namespace tidemark::core {

std::string_view categoryName(Category c) {
  switch (c) {
    case Category::kWeight:
      return "WEIGHT";
    case Category::kGradient:
      return "GRADIENT";
    case Category::kOptimizerState:
      return "OPTIMIZER_STATE";
    case Category::kActivation:
      return "ACTIVATION";
    case Category::kCheckpointInput:
      return "CHECKPOINT_INPUT";
    case Category::kRecomputed:
      return "RECOMPUTED";
    case Category::kInput:
      return "INPUT";
    case Category::kTemporary:
      return "TEMPORARY";
    case Category::kWorkspace:
      return "WORKSPACE";
    case Category::kAllocatorSlack:
      return "ALLOCATOR_SLACK";
    case Category::kUnknown:
      return "UNKNOWN";
  }
  return "UNKNOWN";
}

std::optional<Category> categoryFromName(std::string_view name) {
  for (Category c : kAllCategories) {
    if (categoryName(c) == name) return c;
  }
  return std::nullopt;
}

std::optional<Category> categoryFromWire(int value) {
  if (value < 1 || value > kCategoryCount) return std::nullopt;
  return static_cast<Category>(value);
}

int tagPriority(Category c) {
  switch (c) {
    case Category::kWeight:
      return 100;
    case Category::kOptimizerState:
      return 90;
    case Category::kGradient:
      return 80;
    case Category::kInput:
      return 70;
    case Category::kCheckpointInput:
      return 60;
    case Category::kActivation:
      return 50;
    case Category::kRecomputed:
      return 40;
    case Category::kWorkspace:
      return 30;
    case Category::kTemporary:
      return 20;
    case Category::kAllocatorSlack:
      return 10;
    case Category::kUnknown:
      return 0;
  }
  return 0;
}

std::string_view phaseName(Phase p) {
  switch (p) {
    case Phase::kNone:
      return "";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kOptimizer:
      return "optimizer";
    case Phase::kEval:
      return "eval";
  }
  return "";
}

std::optional<Phase> phaseFromWire(int value) {
  if (value < 1 || value > 5) return std::nullopt;
  return static_cast<Phase>(value);
}

}  // namespace tidemark::core
