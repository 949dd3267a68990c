// Step time of shardtrain's ZeRO (stage 1 by default) on the GPT-2-family Transformer, for the
// side-by-side comparison with PyTorch's ZeroRedundancyOptimizer in bench/zero_torch.py (same
// model, batch, optimizer and launch). Run under a launcher:
//   shardtrain launch --nproc 2 -- build/bench_zero [--d-model 128] [--layers 4] [--heads 4]
//       [--ffn 512] [--vocab 50257] [--seq 128] [--batch 4] [--steps 20] [--warmup 5]
//       [--stage 1]
// --batch is sequences per rank. --stage 0 runs shardtrain's DistributedDataParallel with the
// same optimizer instead, as the baseline the stage is measured against.
// Rank 0 prints one JSON line: the parameter count (so that both sides can be checked to train
// the same model), the median step time (zero_grad to after_optimizer_step) and the median of
// each phase of the step.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "shardtrain/ddp.h"
#include "shardtrain/fused_adamw.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/threads.h"
#include "shardtrain/zero.h"

namespace {

using shardtrain::bench::median;

// Seconds since the previous call (or construction).
class Lap {
 public:
  double operator()() {
    const auto now = std::chrono::steady_clock::now();
    const double seconds = std::chrono::duration<double>(now - last_).count();
    last_ = now;
    return seconds;
  }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
};

}  // namespace

int main(int argc, char** argv) {
  shardtrain::ModelConfig config;  // GPT-2 family, tied head, no dropout below
  config.d_model = 128;
  config.n_layers = 4;
  config.n_heads = 4;
  config.ffn_hidden = 512;
  config.vocab_size = 50257;
  int64_t seq = 128, batch = 4, steps = 20, warmup = 5, stage = 1;
  const std::map<std::string, int64_t*> flags = {{"--d-model", &config.d_model},
                                                 {"--layers", &config.n_layers},
                                                 {"--heads", &config.n_heads},
                                                 {"--ffn", &config.ffn_hidden},
                                                 {"--vocab", &config.vocab_size},
                                                 {"--seq", &seq},
                                                 {"--batch", &batch},
                                                 {"--steps", &steps},
                                                 {"--warmup", &warmup},
                                                 {"--stage", &stage}};
  for (int i = 1; i < argc; i += 2) {
    const auto flag = flags.find(argv[i]);
    if (flag == flags.end() || i + 1 == argc) {
      std::fprintf(stderr, "bench_zero: unknown flag or missing value: %s\n", argv[i]);
      return 2;
    }
    *flag->second = std::atoll(argv[i + 1]);
  }
  config.name = "custom";
  config.n_kv_heads = config.n_heads;
  config.context_length = seq;  // the position table is as long as the sequences trained
  config.dropout = 0.0;

  shardtrain::set_num_threads(1);
  auto world = shardtrain::init_from_environment();
  torch::manual_seed(0);
  shardtrain::Transformer model(config);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();  // the tied head counts once

  // Stage 1-3: the optimizer steps this rank's pieces of the parameters; stage 0: all of them.
  const torch::optim::AdamWOptions adamw = torch::optim::AdamWOptions(1e-3).weight_decay(0.1);
  std::unique_ptr<shardtrain::FullyShardedDataParallel> zero;
  std::unique_ptr<shardtrain::DistributedDataParallel> ddp;
  std::vector<at::Tensor> optimized;
  if (stage == 0) {
    ddp = std::make_unique<shardtrain::DistributedDataParallel>(model.ptr(), world);
    optimized = model->parameters();
  } else {
    const shardtrain::DeviceMesh mesh(
        world, shardtrain::resolve_mesh(shardtrain::MeshShape(), world->size()));
    zero = shardtrain::zero_shard(model, mesh,
                                  shardtrain::ZeroOptions().stage(static_cast<int>(stage)));
    for (const auto& segment : zero->segments()) optimized.push_back(segment.param);
  }
  shardtrain::FusedAdamW optimizer(optimized, adamw);

  // One fixed batch per rank: [batch, seq + 1] tokens, inputs and next-token targets.
  torch::manual_seed(1 + world->rank());
  const at::Tensor tokens = at::randint(config.vocab_size, {batch, seq + 1}, at::kLong);
  const at::Tensor inputs = tokens.narrow(1, 0, seq);
  const at::Tensor targets = tokens.narrow(1, 1, seq).reshape({-1});

  // Under ZeRO-1/2 after_optimizer_step only starts the all-gathers of the updated parameters;
  // the next forward waits for them, so that wait is counted in "forward".
  std::vector<double> total, zero_grad, forward, backward, step, after_step;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    Lap lap;
    if (zero) {
      zero->zero_grad();
    } else {
      optimizer.zero_grad();
    }
    const double t_zero_grad = lap();
    const at::Tensor logits = model->forward(inputs);
    const at::Tensor loss =
        at::cross_entropy_loss(logits.reshape({-1, config.vocab_size}), targets);
    const double t_forward = lap();
    loss.backward();
    const double t_backward = lap();
    optimizer.step();
    const double t_step = lap();
    if (zero) zero->after_optimizer_step();
    const double t_after = lap();
    if (s >= warmup) {
      zero_grad.push_back(t_zero_grad);
      forward.push_back(t_forward);
      backward.push_back(t_backward);
      step.push_back(t_step);
      after_step.push_back(t_after);
      total.push_back(t_zero_grad + t_forward + t_backward + t_step + t_after);
    }
  }
  if (world->rank() == 0) {
    std::printf(
        "{\"impl\": \"shardtrain\", \"ranks\": %d, \"stage\": %d, \"params\": %lld, "
        "\"median_step_s\": %.5f, \"median_phase_s\": {\"zero_grad\": %.5f, "
        "\"forward\": %.5f, \"backward\": %.5f, \"optimizer\": %.5f, "
        "\"after_step\": %.5f}}\n",
        world->size(), static_cast<int>(stage), static_cast<long long>(params), median(total),
        median(zero_grad), median(forward), median(backward), median(step), median(after_step));
  }
  return 0;
}
