#include "src/core/device_filter.h"

#include <gtest/gtest.h>

#include "tests/unit/recording_builders.h"

namespace tidemark::core {
namespace {

Block on(int32_t device) {
  Block b = testing::block(0x1000, 64, 1, kOpenSeq);
  b.device = device;
  return b;
}

TEST(DeviceFilterTest, NamesAreParsed) {
  std::string why;
  EXPECT_TRUE(DeviceFilter::parse("", &why)->all());
  EXPECT_TRUE(DeviceFilter::parse("all", &why)->all());
  EXPECT_EQ(DeviceFilter::parse("cpu", &why)->kind, DeviceFilter::Kind::kHost);
  EXPECT_EQ(DeviceFilter::parse("cuda", &why)->kind, DeviceFilter::Kind::kAnyDevice);
  const auto three = DeviceFilter::parse("cuda:3", &why);
  ASSERT_TRUE(three.has_value());
  EXPECT_EQ(three->kind, DeviceFilter::Kind::kDevice);
  EXPECT_EQ(three->device, 3);
  for (const char* bad : {"cuda:", "cuda:-1", "cuda:1x", "gpu0", "CPU"}) {
    EXPECT_FALSE(DeviceFilter::parse(bad, &why).has_value()) << bad;
    EXPECT_EQ(why, std::string("unknown device '") + bad + "' (all, cpu, cuda or cuda:N)");
  }
}

TEST(DeviceFilterTest, KeepsTheBlocksOfItsSide) {
  Recording rec;
  rec.blocks = {on(-1), on(0), on(1), on(0)};
  Recording gpu0 = rec;
  keepDevice(gpu0, *DeviceFilter::parse("cuda:0", nullptr));
  EXPECT_EQ(gpu0.blocks.size(), 2u);
  Recording host = rec;
  keepDevice(host, *DeviceFilter::parse("cpu", nullptr));
  ASSERT_EQ(host.blocks.size(), 1u);
  EXPECT_EQ(host.blocks[0].device, -1);
  Recording gpus = rec;
  keepDevice(gpus, *DeviceFilter::parse("cuda", nullptr));
  EXPECT_EQ(gpus.blocks.size(), 3u);
  Recording all = rec;
  keepDevice(all, *DeviceFilter::parse("", nullptr));
  EXPECT_EQ(all.blocks.size(), 4u);
}

}  // namespace
}  // namespace tidemark::core
