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
  auto devicesKept = [&](const char* filter) {
    Recording r = rec;
    keepDevice(r, *DeviceFilter::parse(filter, nullptr));
    std::vector<int32_t> devices;
    for (const Block& b : r.blocks) devices.push_back(b.device);
    return devices;
  };
  EXPECT_EQ(devicesKept("cuda:0"), (std::vector<int32_t>{0, 0}));
  EXPECT_EQ(devicesKept("cpu"), (std::vector<int32_t>{-1}));
  EXPECT_EQ(devicesKept("cuda"), (std::vector<int32_t>{0, 1, 0}));
  EXPECT_EQ(devicesKept(""), (std::vector<int32_t>{-1, 0, 1, 0}));
}

TEST(DeviceFilterTest, TheAdvisorKeepsTheTensorsWhereThereAreAny) {
  Recording rec;
  rec.blocks = {on(-1), on(0), on(0)};
  rec.blocks[2].kind = MemoryKind::kTensor;  // a tensor in device 0's segment
  Recording gpu = rec;
  EXPECT_TRUE(keepTensorLevel(gpu));
  ASSERT_EQ(gpu.blocks.size(), 1u);
  EXPECT_EQ(gpu.blocks[0].kind, MemoryKind::kTensor);
  rec.blocks.pop_back();  // no tensor view: every block stays
  EXPECT_FALSE(keepTensorLevel(rec));
  EXPECT_EQ(rec.blocks.size(), 2u);
}

}  // namespace
}  // namespace tidemark::core
