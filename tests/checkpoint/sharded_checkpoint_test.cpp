#include "shardtrain/sharded_checkpoint.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/rendezvous.h"
#include "support.h"

namespace shardtrain {
namespace sharded_checkpoint_test {

namespace fs = std::filesystem;

// Tensors of several dtypes and ranks, a 0-dim one and an empty one.
NamedTensors sample_tensors() {
  at::manual_seed(7);
  return {{"w", at::randn({5, 7})},
          {"b", at::randn({11}).to(at::kBFloat16)},
          {"ids", at::arange(13, at::kLong).view({13})},
          {"step", at::scalar_tensor(42, at::kLong)},
          {"empty", at::zeros({0, 3})},
          {"v", at::randn({2, 3, 4}, at::kDouble)}};
}

std::vector<TensorSpec> specs_of(const NamedTensors& tensors) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : tensors) specs.push_back({name, t.sizes().vec(), t.scalar_type()});
  return specs;
}

// FSDP-like ownership: within each dtype, the tensors are laid end to end and rank r owns the
// r-th equal range of that flat buffer, so a rank's slices start and end inside tensors.
std::vector<FlatSlice> flat_slices_of(const NamedTensors& tensors, int world, int rank) {
  std::vector<FlatSlice> slices;
  int64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.numel();
  const ShardRange mine = shard_range(total, world, rank);
  int64_t start = 0;
  for (const auto& [name, t] : tensors) {
    const int64_t lo = std::max(start, mine.offset);
    const int64_t hi = std::min(start + t.numel(), mine.offset + mine.numel);
    if (lo < hi)
      slices.push_back({name, lo - start, t.reshape({-1}).narrow(0, lo - start, hi - lo)});
    start += t.numel();
  }
  return slices;
}

class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::fresh_test_dir("shardtrain_sharded"); }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves sample_tensors() from `world` in-process ranks; returns the checkpoint directory.
  std::string save_from(int world, const std::string& name = "step_000001") {
    const auto tensors = sample_tensors();
    std::string saved;
    run_local_ranks(world, [&](ProcessGroup& group) {
      const std::string dir = save_sharded_checkpoint(
          (dir_ / "root").string(), name, specs_of(tensors),
          flat_slices_of(tensors, world, group.rank()), &group,
          ShardedSaveOptions()
              .strategy("fsdp")
              .metadata(R"({"step": 3})")
              .rank_state({{"rng", at::full({4}, group.rank(), at::kByte)}}));
      if (group.rank() == 0) saved = dir;
    });
    return saved;
  }

  fs::path dir_;
};

TEST_F(ShardedCheckpointTest, ReadsEveryTensorAndAnyRangeBackFromThreeRanks) {
  const std::string dir = save_from(3);
  EXPECT_EQ(dir, (dir_ / "root" / "step_000001").string());
  const ShardedCheckpointReader reader(dir);
  EXPECT_EQ(reader.world_size(), 3);
  EXPECT_EQ(reader.strategy(), "fsdp");
  EXPECT_EQ(nlohmann::json::parse(reader.metadata()).at("step"), 3);
  ASSERT_EQ(reader.files().size(), 3u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(fs::exists(fs::path(dir) / reader.files()[r].name));
    EXPECT_TRUE(at::equal(reader.rank_state(r).at("rng"), at::full({4}, r, at::kByte)));
  }
  EXPECT_TRUE(reader.rank_state(3).empty());
  for (const auto& [name, t] : sample_tensors()) {
    ASSERT_NE(reader.find(name), nullptr) << name;
    EXPECT_EQ(reader.find(name)->dtype, t.scalar_type());
    const at::Tensor full = reader.read(name);
    EXPECT_TRUE(full.sizes().equals(t.sizes())) << name;
    EXPECT_TRUE(at::equal(full, t)) << name;
    // Every range of the flattening, wherever the slice boundaries fall.
    const at::Tensor flat = t.reshape({-1});
    for (int64_t lo = 0; lo < t.numel(); lo += 3) {
      for (int64_t n : {int64_t{1}, int64_t{4}, t.numel() - lo}) {
        if (lo + n > t.numel()) continue;
        EXPECT_TRUE(at::equal(reader.read_flat(name, lo, n), flat.narrow(0, lo, n)))
            << name << " [" << lo << ", " << lo + n << ")";
      }
    }
  }
  EXPECT_EQ(reader.find("missing"), nullptr);
  EXPECT_THROW(reader.read("missing"), std::invalid_argument);
  EXPECT_THROW(reader.read_flat("w", 30, 10), std::invalid_argument);
  reader.verify();
}

TEST_F(ShardedCheckpointTest, SlicesThatMissOrOverlapAreRefusedAndNothingIsCommitted) {
  const auto tensors = sample_tensors();
  const std::string root = (dir_ / "root").string();
  save_sharded_checkpoint(root, "step_000001", specs_of(tensors), flat_slices_of(tensors, 1, 0),
                          nullptr);
  auto gap = flat_slices_of(tensors, 1, 0);
  gap[0].data = gap[0].data.narrow(0, 0, 30);  // "w" has 35 elements
  try {
    save_sharded_checkpoint(root, "step_000002", specs_of(tensors), gap, nullptr);
    FAIL() << "a gap was saved";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("30 of its 35"), std::string::npos) << e.what();
  }
  // Two in-process ranks that both write all of "b": the overlap is named on every rank.
  std::vector<std::string> errors(2);
  run_local_ranks(2, [&](ProcessGroup& group) {
    auto slices = flat_slices_of(tensors, 2, group.rank());
    if (group.rank() == 1) slices.push_back({"b", 0, tensors[1].second.reshape({-1})});
    try {
      save_sharded_checkpoint(root, "step_000003", specs_of(tensors), slices, &group);
    } catch (const std::invalid_argument& e) {
      errors[group.rank()] = e.what();
    }
  });
  for (const auto& e : errors) EXPECT_NE(e.find("tensor 'b' overlap"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(fs::path(root) / "step_000002"));
  EXPECT_FALSE(fs::exists(fs::path(root) / "step_000003"));
  // Nor is anything of the failed saves left behind.
  EXPECT_FALSE(fs::exists(fs::path(root) / ".step_000002.partial"));
  EXPECT_FALSE(fs::exists(fs::path(root) / ".step_000003.partial"));
  EXPECT_EQ(resolve_checkpoint(root, "latest"), (fs::path(root) / "step_000001").string());
  // What a save killed before its end left (no unwinding then) goes with the next save.
  fs::create_directories(fs::path(root) / ".step_000004.partial");
  std::ofstream(fs::path(root) / ".step_000004.partial" / "rank_00000.safetensors") << "half";
  save_sharded_checkpoint(root, "step_000005", specs_of(tensors), flat_slices_of(tensors, 1, 0),
                          nullptr);
  EXPECT_FALSE(fs::exists(fs::path(root) / ".step_000004.partial"));
}

TEST_F(ShardedCheckpointTest, TruncatedAndBitFlippedFilesAreRefusedNamingTheFile) {
  const std::string dir = save_from(2);
  const std::string file = (fs::path(dir) / "rank_00001.safetensors").string();
  const std::string original = (dir_ / "original").string();
  fs::copy_file(file, original);

  // One flipped bit in the data of rank 1 (the end of the file holds its rank state and the
  // last slices): reading the touched tensor and verifying both fail naming the file.
  const ShardedCheckpointReader before(dir);
  std::string touched;
  int64_t byte = 0;
  {
    const auto index = nlohmann::json::parse(before.index_json());
    const auto& slice = index.at("files").at(1).at("slices").at(0);
    touched = slice.at("tensor").get<std::string>();
    byte = slice.at("byte_range").at(0).get<int64_t>();
  }
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(byte);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(byte);
    f.write(&c, 1);
  }
  const ShardedCheckpointReader flipped(dir);  // sizes still match
  try {
    flipped.read(touched);
    FAIL() << "a bit flip went unnoticed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + touched + "'"), std::string::npos) << e.what();
  }
  try {
    flipped.verify();
    FAIL() << "verify missed a bit flip";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }

  fs::copy_file(original, file, fs::copy_options::overwrite_existing);
  fs::resize_file(file, fs::file_size(file) - 5);
  try {
    ShardedCheckpointReader truncated(dir);
    FAIL() << "a truncated file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  fs::remove(file);
  try {
    ShardedCheckpointReader missing(dir);
    FAIL() << "a missing file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
  std::ofstream(fs::path(dir) / "index.json", std::ios::trunc) << "{\"format\": ";
  try {
    ShardedCheckpointReader corrupt(dir);
    FAIL() << "a corrupt index was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("index.json"), std::string::npos) << e.what();
  }
}

TEST_F(ShardedCheckpointTest, ReshardRewritesAnyRankCountWithTheSameTensors) {
  const std::string dir = save_from(3);
  const std::string two = (dir_ / "two").string();
  reshard_checkpoint(dir, two, 2);
  const ShardedCheckpointReader reader(two);
  EXPECT_EQ(reader.world_size(), 2);
  ASSERT_EQ(reader.files().size(), 2u);
  EXPECT_EQ(nlohmann::json::parse(reader.metadata()).at("step"), 3);
  for (const auto& [name, t] : sample_tensors())
    EXPECT_TRUE(at::equal(reader.read(name), t)) << name;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::equal(reader.rank_state(r).at("rng"), at::full({4}, r, at::kByte)));
  }
  reader.verify();
  // One file holds everything; resharding into an existing directory is refused.
  const std::string one = (dir_ / "one").string();
  reshard_checkpoint(two, one, 1);
  EXPECT_EQ(ShardedCheckpointReader(one).files().size(), 1u);
  EXPECT_TRUE(at::equal(ShardedCheckpointReader(one).read("v"), sample_tensors()[5].second));
  EXPECT_THROW(reshard_checkpoint(dir, two, 4), std::invalid_argument);
  EXPECT_THROW(reshard_checkpoint(dir, (dir_ / "zero").string(), 0), std::invalid_argument);

  // Progress reaches every byte; a stop asked for halfway (an interrupt) leaves nothing.
  int64_t last = -1, total = 0;
  reshard_checkpoint(dir, (dir_ / "four").string(), 4, [&](int64_t done, int64_t all) {
    EXPECT_GE(done, last);
    last = done;
    total = all;
  });
  EXPECT_EQ(last, total);
  EXPECT_GT(total, 0);
  EXPECT_THROW(reshard_checkpoint(dir, (dir_ / "five").string(), 5,
                                  [&](int64_t done, int64_t all) {
                                    if (done * 2 >= all) throw std::runtime_error("interrupted");
                                  }),
               std::runtime_error);
  EXPECT_FALSE(fs::exists(dir_ / "five"));
  EXPECT_FALSE(fs::exists(dir_ / ".five.partial"));

  // More ranks than elements: the last ranks' files hold no slice, and a stop asked for while
  // they are written is heard too.
  int calls = 0;
  EXPECT_THROW(reshard_checkpoint(dir, (dir_ / "wide").string(), 100000,
                                  [&](int64_t done, int64_t all) {
                                    if (done == all && ++calls == 50) {
                                      throw std::runtime_error("interrupted");
                                    }
                                  }),
               std::runtime_error);
  EXPECT_EQ(calls, 50);
  EXPECT_FALSE(fs::exists(dir_ / "wide"));
  EXPECT_FALSE(fs::exists(dir_ / ".wide.partial"));
}

TEST_F(ShardedCheckpointTest, CommandLineInspectsVerifiesAndReshards) {
  const std::string dir = save_from(2);
  auto inspect = testing::run_command(testing::cli() + " ckpt inspect " + dir + " --verify");
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("strategy \"fsdp\" on 2 ranks"), std::string::npos)
      << inspect.output;
  EXPECT_NE(inspect.output.find("[2, 3, 4]"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("verified"), std::string::npos) << inspect.output;
  auto json = testing::run_command(testing::cli() + " ckpt inspect " + dir + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  EXPECT_EQ(nlohmann::json::parse(json.output).at("tensors").size(), sample_tensors().size());

  const std::string out = (dir_ / "three").string();
  auto reshard =
      testing::run_command(testing::cli() + " ckpt reshard " + dir + " " + out + " --world-size 3");
  ASSERT_EQ(reshard.exit_code, 0) << reshard.output;
  EXPECT_EQ(ShardedCheckpointReader(out).files().size(), 3u);
  // It says how far it is, from the start to the end.
  EXPECT_NE(reshard.output.find("(0%)"), std::string::npos) << reshard.output;
  EXPECT_NE(reshard.output.find("(100%)"), std::string::npos) << reshard.output;

  fs::resize_file(fs::path(dir) / "rank_00000.safetensors", 100);
  auto bad = testing::run_command(testing::cli() + " ckpt inspect " + dir);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("rank_00000.safetensors"), std::string::npos) << bad.output;
}

}  // namespace sharded_checkpoint_test
}  // namespace shardtrain
