#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "shardtrain/checkpoint.h"

namespace shardtrain {
namespace safetensors_test {

namespace fs = std::filesystem;

TEST(SafetensorsTest, RoundTripsEveryDtypeAndRefusesDamage) {
  const fs::path dir = fs::temp_directory_path() / ("shardtrain_st_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string file = (dir / "t.safetensors").string();
  NamedTensors tensors = {{"w", at::randn({3, 4})},
                          {"b", at::randn({5}).to(at::kBFloat16)},
                          {"i", at::arange(6, at::kLong).view({2, 3})},
                          {"s", at::tensor(2.5)}};
  save_safetensors(file, tensors, {{"format", "pt"}});
  const auto loaded = load_safetensors(file);
  ASSERT_EQ(loaded.size(), 4u);
  for (const auto& [name, tensor] : tensors)
    EXPECT_TRUE(at::equal(loaded.at(name), tensor)) << name;

  fs::resize_file(file, fs::file_size(file) - 4);
  try {
    load_safetensors(file);
    FAIL() << "a truncated file loaded";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
  std::ofstream(file, std::ios::trunc) << "garbage";
  EXPECT_THROW(load_safetensors(file), std::invalid_argument);
  EXPECT_THROW(load_safetensors((dir / "none").string()), std::invalid_argument);
  fs::remove_all(dir);
}

TEST(SafetensorsTest, AFailedWriteSaysWhy) {
  // /dev/full takes the open and refuses every write with ENOSPC, as a full disk does.
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  try {
    save_safetensors("/dev/full", {{"w", at::ones({1024, 1024})}});
    FAIL() << "a write to a full device succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot write '/dev/full': No space left on device"),
              std::string::npos)
        << e.what();
  }
}

TEST(SafetensorsTest, CheckpointDirectoriesAppearWhenCompleteAndOldOnesAreRemoved) {
  const fs::path root = fs::temp_directory_path() / ("shardtrain_ckpt_" + std::to_string(getpid()));
  fs::remove_all(root);
  for (int step : {1, 2, 3}) {
    CheckpointWriter writer(root.string(), "step_00000" + std::to_string(step), 2);
    save_safetensors(writer.staging_dir() + "/x.safetensors", {{"x", at::ones({2})}});
    EXPECT_FALSE(fs::exists(root / ("step_00000" + std::to_string(step))));
    writer.commit();
  }
  EXPECT_FALSE(fs::exists(root / "step_000001"));
  EXPECT_TRUE(fs::exists(root / "step_000002"));
  EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), (root / "step_000003").string());
  // A save that never commits leaves `latest` and the complete checkpoints alone.
  { CheckpointWriter abandoned(root.string(), "step_000004", 2); }
  EXPECT_EQ(resolve_checkpoint(root.string(), "latest"), (root / "step_000003").string());
  EXPECT_THROW(resolve_checkpoint((root / "nothing").string(), "latest"), std::invalid_argument);
  fs::remove_all(root);
}

}  // namespace safetensors_test
}  // namespace shardtrain
