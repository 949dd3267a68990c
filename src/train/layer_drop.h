// Progressive layer dropping (train.layer_drop = "progressive"): the blocks a step runs.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/config.h"
#include "shardtrain/model.h"

namespace shardtrain::detail {

// The share of blocks kept at the step after `completed` steps: DeepSpeed's theta, which its
// engine updates at the end of each step from the count of steps before it, so that steps 1
// and 2 keep every block: layer_drop_theta + (1 - layer_drop_theta) exp(-gamma max(0,
// completed - 1)).
double layer_drop_theta(const TrainSection& train, int64_t completed);

// That step's Transformer::set_layer_drop scales for `n_layers` blocks: block l = 1..L kept with
// probability p_l = 1 - (l / L)(1 - theta) (scale 1 / p_l), else skipped (0). The draw depends
// only on `seed` and the step, so every rank and micro-batch of a step runs the same blocks.
std::vector<double> layer_drop_scales(const TrainSection& train, int64_t completed,
                                      int64_t n_layers, int64_t seed);

// Random layer-token dropping (train.random_ltd_layers): the tokens each listed block runs on at
// the step after `completed` steps. DeepSpeed's fixed_linear schedule, which its engine updates
// at the end of each step from the count of steps so far: random_ltd_min at the first step.
int64_t random_ltd_tokens(const TrainSection& train, int64_t completed);

// That step's Transformer::set_token_drop for `n_layers` blocks on `rank`: the listed blocks, the
// tokens above, and a key from train.seed, the step and the rank alone.
TransformerImpl::TokenDrop random_ltd_drop(const TrainSection& train, int64_t completed,
                                           int64_t n_layers, int rank);

}  // namespace shardtrain::detail
