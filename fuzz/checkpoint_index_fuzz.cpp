// A sharded checkpoint's index.json, over real rank files: the index names files, slices and
// byte ranges, so a bad one must be refused before any read trusts it.
#include <stdexcept>

#include "fuzz_target.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain::fuzz {
namespace {

// A one-rank checkpoint of two small tensors and a rank state, written once per process; each
// input replaces its index.json. The index it was written with is kept as index.json.orig (the
// seed corpus holds a copy).
std::string checkpoint_dir() {
  static const std::string dir = [] {
    const std::string root = (scratch_dir() / "root").string();
    std::filesystem::remove_all(root);
    const std::string written = save_sharded_checkpoint(
        root, "step_000001", {{"w", {3, 4}, at::kFloat}, {"b", {5}, at::kBFloat16}},
        {{"w", 0, at::arange(12, at::kFloat)}, {"b", 0, at::ones({5}, at::kBFloat16)}}, nullptr,
        ShardedSaveOptions().rank_state({{"rng", at::zeros({8}, at::kByte)}}));
    std::filesystem::copy_file(written + "/index.json", written + "/index.json.orig");
    return written;
  }();
  return dir;
}

}  // namespace

int checkpoint_index(const uint8_t* data, size_t size) {
  const std::string dir = checkpoint_dir();
  input_file("root/step_000001/index.json", data, size);
  try {
    const ShardedCheckpointReader reader(dir);
    for (const auto& spec : reader.tensors()) reader.read(spec.name);
    reader.rank_state(0);
    reader.verify();
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

}  // namespace shardtrain::fuzz
