#include "src/core/category.h"

#include <gtest/gtest.h>

namespace tidemark::core {
namespace {

TEST(CategoryTest, NamesRoundTripAndMatchTheWireNumbers) {
  int expected = 1;
  for (Category c : kAllCategories) {
    EXPECT_EQ(static_cast<int>(c), expected++);
    EXPECT_EQ(categoryFromName(categoryName(c)), c);
    EXPECT_EQ(categoryFromWire(static_cast<int>(c)), c);
  }
  EXPECT_FALSE(categoryFromWire(0).has_value());
  EXPECT_FALSE(categoryFromWire(kCategoryCount + 1).has_value());
  EXPECT_FALSE(categoryFromName("weights").has_value());
}

TEST(CategoryTest, FrameworkStateOutranksActivationTags) {
  EXPECT_GT(tagPriority(Category::kWeight), tagPriority(Category::kActivation));
  EXPECT_GT(tagPriority(Category::kInput), tagPriority(Category::kActivation));
  EXPECT_GT(tagPriority(Category::kCheckpointInput), tagPriority(Category::kActivation));
  EXPECT_GT(tagPriority(Category::kOptimizerState), tagPriority(Category::kGradient));
}

}  // namespace
}  // namespace tidemark::core
