// Offline resharding: rewrites a checkpoint for another number of ranks, one slice at a time.
#include <filesystem>
#include <stdexcept>

#include "checkpoint/safetensors_detail.h"
#include "checkpoint/sharded_index.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

// Every rank file and the index of the resharded checkpoint, into `staging`.
void write_resharded(const ShardedCheckpointReader& reader, const std::string& staging,
                     int world_size, const ReshardProgress& progress) {
  int64_t total = 0, done = 0;
  for (const auto& spec : reader.tensors()) {
    total += spec.numel() * static_cast<int64_t>(c10::elementSize(spec.dtype));
  }
  std::vector<nlohmann::json> files;
  for (int rank = 0; rank < world_size; ++rank) {
    // Before each file too: past the last element, ranks hold no slice (a world larger than the
    // tensors), and a stop must still be heard while their files are written.
    if (progress) progress(done, total);
    std::vector<detail::SliceRef> refs;
    for (const auto& spec : reader.tensors()) {
      const ShardRange range = shard_range(spec.numel(), world_size, rank);
      if (range.numel > 0) refs.push_back({spec.name, range.offset, range.numel, spec.dtype});
    }
    NamedTensors state;
    for (auto& [name, tensor] : reader.rank_state(rank)) state.emplace_back(name, tensor);
    files.push_back(detail::write_rank_file(
        staging, rank, refs,
        [&](size_t i) {
          if (progress) progress(done, total);
          done += refs[i].numel * static_cast<int64_t>(c10::elementSize(refs[i].dtype));
          return reader.read_flat(refs[i].tensor, refs[i].offset, refs[i].numel);
        },
        state));
  }
  if (progress) progress(done, total);
  detail::write_index(staging, reader.tensors(),
                      {{"strategy", "reshard"}, {"world_size", world_size}},
                      nlohmann::json::parse(reader.metadata()), files);
  detail::fsync_path(staging);
}

}  // namespace

void reshard_checkpoint(const std::string& dir, const std::string& out, int world_size,
                        const ReshardProgress& progress) {
  if (world_size < 1) {
    throw std::invalid_argument("reshard: the world size must be at least 1, got " +
                                std::to_string(world_size));
  }
  const ShardedCheckpointReader reader(dir);
  const fs::path target = fs::absolute(out).lexically_normal();
  if (fs::exists(target)) {
    throw std::invalid_argument("reshard: '" + out + "' already exists (it is never overwritten)");
  }
  fs::create_directories(target.parent_path());
  // Written beside the target and renamed into place, so `out` appears only when complete.
  const fs::path staging = target.parent_path() / ("." + target.filename().string() + ".partial");
  fs::remove_all(staging);
  fs::create_directories(staging);

  try {
    write_resharded(reader, staging.string(), world_size, progress);
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(staging, ignored);  // a failed reshard leaves nothing behind
    throw;
  }
  fs::rename(staging, target);
  detail::fsync_path(target.parent_path().string());
}

}  // namespace shardtrain
