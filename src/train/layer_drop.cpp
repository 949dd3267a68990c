#include "train/layer_drop.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace shardtrain::detail {

double layer_drop_theta(const TrainSection& train, int64_t completed) {
  const double t = static_cast<double>(std::max<int64_t>(0, completed - 1));
  return train.layer_drop_theta +
         (1.0 - train.layer_drop_theta) * std::exp(-train.layer_drop_gamma * t);
}

std::vector<double> layer_drop_scales(const TrainSection& train, int64_t completed,
                                      int64_t n_layers, int64_t seed) {
  const double theta = layer_drop_theta(train, completed);
  std::seed_seq seeds{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                      static_cast<uint32_t>(completed), static_cast<uint32_t>(completed >> 32),
                      0x504c44u};  // "PLD": apart from the other streams drawn from the seed
  std::mt19937_64 draw(seeds);
  std::vector<double> scales;
  for (int64_t l = 1; l <= n_layers; ++l) {
    const double keep =
        1.0 - static_cast<double>(l) / static_cast<double>(n_layers) * (1.0 - theta);
    const double u = static_cast<double>(draw() >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    scales.push_back(u < keep ? 1.0 / keep : 0.0);
  }
  return scales;
}

int64_t random_ltd_tokens(const TrainSection& train, int64_t completed) {
  if (completed <= 0) return train.random_ltd_min;
  // Not capped at 1: past random_ltd_steps the count keeps rising until random_ltd_max caps
  // it, so a maximum that is not a multiple of random_ltd_step is reached too (as DeepSpeed).
  const double share = static_cast<double>(completed) / static_cast<double>(train.random_ltd_steps);
  auto tokens = static_cast<int64_t>(
      std::floor(share * static_cast<double>(train.random_ltd_max - train.random_ltd_min) +
                 static_cast<double>(train.random_ltd_min)));
  tokens -= tokens % train.random_ltd_step;
  return std::max<int64_t>(1, std::min(tokens, train.random_ltd_max));
}

TransformerImpl::TokenDrop random_ltd_drop(const TrainSection& train, int64_t completed,
                                           int64_t n_layers, int rank) {
  TransformerImpl::TokenDrop drop;
  drop.layers.assign(static_cast<size_t>(n_layers), false);
  for (int64_t id : train.random_ltd_layers) drop.layers[static_cast<size_t>(id)] = true;
  drop.tokens = random_ltd_tokens(train, completed);
  const auto seed = static_cast<uint64_t>(train.seed);
  std::seed_seq seeds{static_cast<uint32_t>(seed),      static_cast<uint32_t>(seed >> 32),
                      static_cast<uint32_t>(completed), static_cast<uint32_t>(completed >> 32),
                      static_cast<uint32_t>(rank),      0x4c5444u};  // "LTD"
  drop.key = std::mt19937_64(seeds)();
  return drop;
}

}  // namespace shardtrain::detail
