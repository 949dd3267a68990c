#include "train/rank_agreement.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>

#include "train/run_manifest.h"

namespace shardtrain::detail {
namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 0xCBF29CE484222325ULL;
  for (unsigned char c : text) hash = (hash ^ c) * 0x100000001B3ULL;
  return hash;
}

// A 64-bit value as two exactly representable doubles, for a collective on a double tensor.
at::Tensor as_pair(uint64_t value) {
  return at::tensor({static_cast<double>(value >> 32), static_cast<double>(value & 0xFFFFFFFFULL)},
                    at::kDouble);
}

// Every rank's `mine` (two doubles); the ranks whose pair differs from rank 0's, as "1, 3".
std::string ranks_unlike_rank0(const at::Tensor& mine, ProcessGroup& world) {
  at::Tensor all = at::empty({2 * world.size()}, at::kDouble);
  world.all_gather(mine, all)->wait();
  const auto pairs = all.view({world.size(), 2});
  std::string out;
  for (int r = 1; r < world.size(); ++r) {
    if (!at::equal(pairs[r], pairs[0])) out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out;
}

}  // namespace

void check_same_config(const TrainConfig& config, ProcessGroup& world) {
  if (world.size() == 1) return;
  nlohmann::ordered_json settings = run_manifest(config, world.size());
  settings["data"] = {{"corpus", config.data.corpus},
                      {"tokenizer", config.data.tokenizer},
                      {"eval_sequences", config.data.eval_sequences}};
  // The schedule and clipping are in the manifest's train section already.
  settings["optimizer"] = {{"weight_decay", config.train.weight_decay},
                           {"betas", {config.train.beta1, config.train.beta2}},
                           {"eps", config.train.eps},
                           {"seed", config.train.seed}};
  settings["run"] = {{"resume", config.run.resume},
                     {"checkpoint_every", config.train.checkpoint_every},
                     {"keep_checkpoints", config.train.keep_checkpoints},
                     {"init_from", config.model.init_from}};
  const std::string differ = ranks_unlike_rank0(as_pair(fnv1a(settings.dump())), world);
  if (!differ.empty()) {
    throw std::invalid_argument(
        "the settings differ across ranks: rank(s) " + differ +
        " do not have rank 0's configuration (model, data, training, parallel or precision "
        "keys); start every rank with the same config file and --set flags");
  }
}

void check_shared_run_dir(const TrainConfig& config, ProcessGroup& world) {
  if (world.size() == 1) return;
  const std::filesystem::path token_file = std::filesystem::path(config.run.dir) / ".run_token";
  uint64_t token = 0;
  if (world.rank() == 0) {
    std::random_device random;
    token = (static_cast<uint64_t>(random()) << 32) ^ random();
    std::ofstream(token_file) << token << "\n";
  }
  at::Tensor shared = as_pair(token);
  world.broadcast(shared, 0)->wait();
  token = (static_cast<uint64_t>(shared[0].item<double>()) << 32) |
          static_cast<uint64_t>(shared[1].item<double>());
  world.barrier()->wait();  // written before anyone reads
  uint64_t seen = 0;
  std::ifstream in(token_file);
  const bool same = static_cast<bool>(in >> seen) && seen == token;
  const std::string differ =
      ranks_unlike_rank0(at::tensor({same ? 1.0 : 0.0, 0.0}, at::kDouble), world);
  if (!differ.empty()) {
    throw std::invalid_argument(
        "rank(s) " + differ + " do not see rank 0's run directory '" + config.run.dir +
        "' (the token rank 0 wrote there is missing or different): run.dir must be one storage "
        "that every host shares (a network file system), at the same path or one that leads "
        "to it");
  }
}

}  // namespace shardtrain::detail
