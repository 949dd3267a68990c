// One validation of safetensors headers and checkpoint indexes, used by every reader: files and
// indexes that break the format's rules are refused with a message naming the file and tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/checkpoint.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "support.h"

namespace shardtrain {
namespace header_validation_test {

namespace fs = std::filesystem;

class HeaderValidationTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::fresh_test_dir("shardtrain_headers"); }
  void TearDown() override { fs::remove_all(dir_); }

  // A safetensors file with `header` as its JSON and `data_bytes` bytes of data after it.
  std::string file_with(const nlohmann::json& header, int64_t data_bytes) {
    const std::string path = (dir_ / ("f" + std::to_string(++files_) + ".safetensors")).string();
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    std::ofstream out(path, std::ios::binary);
    const uint64_t length = text.size();
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << text << std::string(static_cast<size_t>(data_bytes), '\x01');
    return path;
  }

  // The message load_safetensors gives for `path`; fails the test when it loads.
  static std::string refusal(const std::string& path) {
    try {
      load_safetensors(path);
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      return e.what();
    }
    ADD_FAILURE() << path << " loaded";
    return "";
  }

  static nlohmann::json f32(std::vector<int64_t> shape, int64_t begin, int64_t end) {
    return {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {begin, end}}};
  }

  fs::path dir_;
  int files_ = 0;
};

TEST_F(HeaderValidationTest, SafetensorsThatBreakTheFormatsRulesAreRefused) {
  // The good file these variations start from loads.
  EXPECT_EQ(load_safetensors(file_with({{"a", f32({2}, 0, 8)}, {"b", f32({2}, 8, 16)}}, 16))
                .size(),
            2u);
  // Overlapping byte ranges (b reuses half of a's bytes).
  EXPECT_NE(refusal(file_with({{"a", f32({2}, 0, 8)}, {"b", f32({2}, 4, 12)}}, 12))
                .find("overlap those of tensor 'a'"),
            std::string::npos);
  // Every tensor shifted by 4 bytes: the first 4 belong to nobody.
  EXPECT_NE(refusal(file_with({{"a", f32({2}, 4, 12)}}, 12)).find("belong to no tensor"),
            std::string::npos);
  // Bytes after the last tensor.
  EXPECT_NE(refusal(file_with({{"a", f32({2}, 0, 8)}}, 12)).find("after its last tensor"),
            std::string::npos);
  // A negative size and an element count that overflows.
  EXPECT_NE(refusal(file_with({{"a", f32({-1, 2}, 0, 8)}}, 8)).find("negative size"),
            std::string::npos);
  EXPECT_NE(refusal(file_with({{"a", f32({int64_t{1} << 40, int64_t{1} << 40}, 0, 8)}}, 8))
                .find("overflows"),
            std::string::npos);
  EXPECT_NE(refusal(file_with({{"a", f32({int64_t{1} << 62}, 0, 8)}}, 8)).find("overflows"),
            std::string::npos);
  // A shape that disagrees with the byte range names both, and the tensor.
  const std::string mismatch = refusal(file_with({{"a", f32({3}, 0, 8)}}, 8));
  EXPECT_NE(mismatch.find("tensor 'a'"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("12 bytes"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("span 8 bytes"), std::string::npos) << mismatch;
  // Offsets backwards, an unknown dtype, a header larger than the format allows.
  EXPECT_NE(refusal(file_with({{"a", f32({0}, 8, 0)}}, 8)).find("data_offsets"),
            std::string::npos);
  EXPECT_NE(refusal(file_with({{"a", {{"dtype", "Q4"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}},
                              1))
                .find("'Q4'"),
            std::string::npos);
  const std::string huge = (dir_ / "huge.safetensors").string();
  {
    std::ofstream out(huge, std::ios::binary);
    const uint64_t length = uint64_t{1} << 40;
    out.write(reinterpret_cast<const char*>(&length), 8);
    out << "{}";
  }
  EXPECT_NE(refusal(huge).find("limit"), std::string::npos);
}

TEST_F(HeaderValidationTest, InspectReadsAPlainSafetensorsFile) {
  const std::string good = file_with({{"alpha", f32({2, 3}, 0, 24)}}, 24);
  const auto listed = testing::run_command(testing::cli() + " ckpt inspect " + good + " --verify");
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_NE(listed.output.find("alpha"), std::string::npos) << listed.output;
  EXPECT_NE(listed.output.find("[2, 3]"), std::string::npos) << listed.output;
  const std::string bad = file_with({{"a", f32({2}, 0, 8)}, {"b", f32({2}, 4, 12)}}, 12);
  const auto refused = testing::run_command(testing::cli() + " ckpt inspect " + bad);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find("overlap"), std::string::npos) << refused.output;
}

// A 2-rank checkpoint of one 8-element tensor, and its index as JSON to edit.
class IndexValidationTest : public HeaderValidationTest {
 protected:
  std::string save() {
    std::string saved;
    run_local_ranks(2, [&](ProcessGroup& group) {
      const at::Tensor w = at::arange(8, at::kFloat);
      const ShardRange mine = shard_range(8, 2, group.rank());
      const std::string dir = save_sharded_checkpoint(
          (dir_ / "root").string(), "step_000001", {{"w", {8}, at::kFloat}},
          {{"w", mine.offset, w.narrow(0, mine.offset, mine.numel)}}, &group,
          ShardedSaveOptions().strategy("ddp").rank_state(
              {{"rng", at::full({4}, group.rank(), at::kByte)}}));
      if (group.rank() == 0) saved = dir;
    });
    return saved;
  }
  static nlohmann::json index_of(const std::string& dir) {
    std::ifstream in(fs::path(dir) / "index.json");
    return nlohmann::json::parse(in);
  }
  static void write_index(const std::string& dir, const nlohmann::json& index) {
    std::ofstream(fs::path(dir) / "index.json", std::ios::trunc) << index.dump(1);
  }
  static std::string refusal(const std::string& dir, bool verify = false) {
    try {
      const ShardedCheckpointReader reader(dir);
      if (verify) reader.verify();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    ADD_FAILURE() << "the index was accepted";
    return "";
  }
};

TEST_F(IndexValidationTest, OverlappingOrOutOfRangeSlicesAreRefused) {
  const std::string dir = save();
  const nlohmann::json good = index_of(dir);
  ShardedCheckpointReader(dir).verify();

  // Rank 1's slice claims elements 2..5 (overlapping rank 0's 0..3) with the same bytes.
  nlohmann::json overlap = good;
  overlap["files"][1]["slices"][0]["offset"] = 2;
  write_index(dir, overlap);
  EXPECT_NE(refusal(dir).find("overlap at element"), std::string::npos) << refusal(dir);

  // A slice running past its tensor's end.
  nlohmann::json past = good;
  past["files"][1]["slices"][0]["offset"] = 6;
  write_index(dir, past);
  EXPECT_NE(refusal(dir).find("outside its 8 elements"), std::string::npos) << refusal(dir);

  // Two records of one file sharing bytes: the rank state moved onto the slice's bytes.
  nlohmann::json shared = good;
  auto& state = shared["files"][0]["rank_state"][0];
  const int64_t slice_begin = shared["files"][0]["slices"][0]["byte_range"][0].get<int64_t>();
  state["byte_range"] = {slice_begin, slice_begin + 4};
  write_index(dir, shared);
  EXPECT_NE(refusal(dir).find("overlapping byte ranges"), std::string::npos) << refusal(dir);

  // Negative and overflowing tensor shapes.
  nlohmann::json negative = good;
  negative["tensors"][0]["shape"] = {-8};
  write_index(dir, negative);
  EXPECT_NE(refusal(dir).find("negative size"), std::string::npos) << refusal(dir);
  nlohmann::json overflow = good;
  overflow["tensors"][0]["shape"] = {int64_t{1} << 62, 16};
  write_index(dir, overflow);
  EXPECT_NE(refusal(dir).find("overflows"), std::string::npos) << refusal(dir);

  // A slice moved 4 bytes back (into the header's padding) passes the index's own checks, but
  // verify() sees that the file's header holds no tensor there.
  nlohmann::json shifted = good;
  auto& range = shifted["files"][0]["slices"][0]["byte_range"];
  range = {range[0].get<int64_t>() - 4, range[1].get<int64_t>() - 4};
  write_index(dir, shifted);
  ShardedCheckpointReader{dir};
  const std::string verify = refusal(dir, /*verify=*/true);
  EXPECT_NE(verify.find("holds no tensor at bytes"), std::string::npos) << verify;
  EXPECT_NE(verify.find("rank_00000.safetensors"), std::string::npos) << verify;

  write_index(dir, good);
  ShardedCheckpointReader(dir).verify();
}

}  // namespace header_validation_test
}  // namespace shardtrain
