// Step time of shardtrain's DDP on an MLP, for the side-by-side comparison with PyTorch's DDP in
// bench/ddp_torch.py (same shape, batch, optimizer and launch). Run under a launcher:
//   shardtrain launch --nproc 2 -- build/bench_ddp [--layers 8] [--width 1024] [--batch 32]
//                                     [--steps 30] [--warmup 5] [--bucket-cap-mb 25]
// Rank 0 prints one JSON line: median step time and the median share of all-reduce time hidden
// behind backward.
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"
#include "shardtrain/ddp.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/threads.h"

using shardtrain::bench::median;

int main(int argc, char** argv) {
  int layers = 8, width = 1024, batch = 32, steps = 30, warmup = 5;
  double bucket_cap_mb = 25.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const int value = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--bucket-cap-mb")) bucket_cap_mb = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--layers")) layers = value;
    else if (!std::strcmp(argv[i], "--width")) width = value;
    else if (!std::strcmp(argv[i], "--batch")) batch = value;
    else if (!std::strcmp(argv[i], "--steps")) steps = value;
    else if (!std::strcmp(argv[i], "--warmup")) warmup = value;
    else {
      std::fprintf(stderr, "bench_ddp: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  shardtrain::set_num_threads(1);
  auto world = shardtrain::init_from_environment();
  torch::manual_seed(0);
  torch::nn::Sequential model;
  for (int l = 0; l < layers; ++l) {
    model->push_back(torch::nn::Linear(width, width));
    model->push_back(torch::nn::ReLU());
  }
  shardtrain::DistributedDataParallel ddp(
      model.ptr(), world, shardtrain::DDPOptions().bucket_cap_mb(bucket_cap_mb));
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.01));
  torch::manual_seed(1 + world->rank());
  const at::Tensor x = at::randn({batch, width});
  const at::Tensor y = at::randn({batch, width});
  std::vector<double> times, forward, backward, hidden;
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::time_point from, clock::time_point to) {
    return std::chrono::duration<double>(to - from).count();
  };
  for (int s = 0; s < warmup + steps; ++s) {
    const auto start = clock::now();
    sgd.zero_grad();
    const at::Tensor loss = (model->forward(x) - y).pow(2).mean();
    const auto forward_end = clock::now();
    loss.backward();  // returns once every bucket's all-reduce has completed
    const auto backward_end = clock::now();
    sgd.step();
    if (s >= warmup) {
      times.push_back(seconds(start, clock::now()));
      forward.push_back(seconds(start, forward_end));
      backward.push_back(seconds(forward_end, backward_end));
      hidden.push_back(ddp.last_timeline().hidden_fraction());
    }
  }
  if (world->rank() == 0) {
    std::printf("{\"impl\": \"shardtrain\", \"ranks\": %d, \"buckets\": %d, "
                "\"median_step_s\": %.5f, \"median_forward_s\": %.5f, "
                "\"median_backward_s\": %.5f, \"median_hidden_fraction\": %.3f}\n",
                world->size(), ddp.num_buckets(), median(times), median(forward),
                median(backward), median(hidden));
  }
  return 0;
}
