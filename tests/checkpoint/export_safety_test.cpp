// `ckpt export` never replaces files it was not asked to, and a failed export or reshard
// leaves nothing behind.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/hf.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace export_safety_test {

namespace fs = std::filesystem;

class ExportSafetyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_export_safety");
    {
      std::ofstream corpus(dir_ / "corpus.txt");
      for (int i = 0; i < 100; ++i) corpus << "how vexingly quick daft zebras jump " << i << "\n";
    }
    Trainer trainer(testing::tiny_run_config(dir_ / "corpus.txt", dir_ / "run",
                                             {"train.micro_batch=2", "train.steps=1"}));
    trainer.train_step();
    checkpoint_ = trainer.save_checkpoint();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Every file of `dir`, hidden ones included.
  static std::vector<std::string> files_in(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
  std::string checkpoint_;
};

TEST_F(ExportSafetyTest, ANonEmptyTargetIsRefusedUnlessForced) {
  const fs::path out = dir_ / "hf";
  fs::create_directories(out);
  std::ofstream(out / "model.safetensors") << "someone else's model";
  try {
    export_hf_checkpoint(checkpoint_, out.string());
    FAIL() << "a non-empty target was overwritten";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(out.string()), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--force"), std::string::npos) << e.what();
  }
  std::ifstream in(out / "model.safetensors");
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "someone else's model");

  export_hf_checkpoint(checkpoint_, out.string(), /*overwrite=*/true);
  EXPECT_EQ(files_in(out), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_GT(fs::file_size(out / "model.safetensors"), 1000u);

  // Through the CLI: refused with status 2, then --force.
  const std::string command =
      testing::cli() + " ckpt export " + checkpoint_ + " --format hf " + out.string();
  const auto refused = testing::run_command(command);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("--force"), std::string::npos) << refused.output;
  const auto forced = testing::run_command(command + " --force");
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
}

TEST_F(ExportSafetyTest, AFailedExportOrReshardLeavesNoPartialFiles) {
  // Damage the data of the first slice: reading it fails its checksum halfway through the export.
  const auto index = nlohmann::json::parse(std::ifstream(fs::path(checkpoint_) / "index.json"));
  const auto& slice = index.at("files").at(0).at("slices").at(3);
  const fs::path file =
      fs::path(checkpoint_) / index.at("files").at(0).at("name").get<std::string>();
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(slice.at("byte_range").at(0).get<int64_t>());
    f.write("\x7f\x7f\x7f\x7f", 4);
  }
  const fs::path out = dir_ / "hf";
  EXPECT_THROW(export_hf_checkpoint(checkpoint_, out.string()), std::invalid_argument);
  EXPECT_FALSE(fs::exists(out));  // the directory the export made goes too
  // Into a directory that was there (empty): it stays, empty.
  fs::create_directories(out);
  EXPECT_THROW(export_hf_checkpoint(checkpoint_, out.string()), std::invalid_argument);
  EXPECT_TRUE(files_in(out).empty()) << files_in(out).front();

  EXPECT_THROW(reshard_checkpoint(checkpoint_, (dir_ / "resharded").string(), 3),
               std::invalid_argument);
  EXPECT_EQ(files_in(dir_), (std::vector<std::string>{"corpus.txt", "hf", "run"}));
}

}  // namespace export_safety_test
}  // namespace shardtrain
