// Per-parameter FSDP (fully_shard on each block, then the root) against the flat-parameter FSDP
// (FullyShardedDataParallel, one flat parameter per block) on the same GPT-2-family Transformer,
// batch and optimizer. Both build the model deferred and materialize only their shards. Run
// under a launcher, one layout per run:
//   shardtrain launch --nproc 2 -- build/bench_fsdp_layout --layout per_param|flat
//       [--d-model 768] [--layers 12] [--heads 12] [--ffn 3072] [--vocab 50257] [--seq 64]
//       [--batch 1] [--steps 6] [--warmup 2]
// Every rank prints one JSON line: median step time (zero_grad to after the optimizer step)
// and the process's peak RSS (getrusage), measured from outside the library's own counts.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "shardtrain/fsdp.h"
#include "shardtrain/fully_shard.h"
#include "shardtrain/fused_adamw.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/threads.h"

using shardtrain::bench::median;

int main(int argc, char** argv) {
  shardtrain::ModelConfig config;  // GPT-2 124M's shape by default
  config.d_model = 768;
  config.n_layers = 12;
  config.n_heads = 12;
  config.ffn_hidden = 3072;
  config.vocab_size = 50257;
  int64_t seq = 64, batch = 1, steps = 6, warmup = 2;
  std::string layout = "per_param";
  const std::map<std::string, int64_t*> flags = {
      {"--d-model", &config.d_model}, {"--layers", &config.n_layers},
      {"--heads", &config.n_heads},   {"--ffn", &config.ffn_hidden},
      {"--vocab", &config.vocab_size}, {"--seq", &seq},
      {"--batch", &batch},            {"--steps", &steps},
      {"--warmup", &warmup}};
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 < argc && std::strcmp(argv[i], "--layout") == 0) {
      layout = argv[i + 1];
      continue;
    }
    const auto flag = flags.find(argv[i]);
    if (flag == flags.end() || i + 1 == argc) {
      std::fprintf(stderr, "bench_fsdp_layout: unknown flag or missing value: %s\n", argv[i]);
      return 2;
    }
    *flag->second = std::atoll(argv[i + 1]);
  }
  if (layout != "per_param" && layout != "flat") {
    std::fprintf(stderr, "bench_fsdp_layout: --layout is per_param or flat, not %s\n",
                 layout.c_str());
    return 2;
  }
  config.name = "custom";
  config.n_kv_heads = config.n_heads;
  config.context_length = seq;
  config.dropout = 0.0;

  shardtrain::set_num_threads(1);
  auto world = shardtrain::init_from_environment();
  const shardtrain::DeviceMesh mesh(
      world, shardtrain::resolve_mesh(shardtrain::MeshShape(), world->size()));
  shardtrain::Transformer model(config, shardtrain::ModelInit().seed(0).deferred());
  const shardtrain::ParameterInitializer init = model->initializer();

  std::unique_ptr<shardtrain::FullyShardedDataParallel> flat;
  std::shared_ptr<shardtrain::FSDPModule> root;
  std::vector<at::Tensor> optimized;
  if (layout == "flat") {
    flat = std::make_unique<shardtrain::FullyShardedDataParallel>(model, mesh);
    for (const auto& segment : flat->segments()) optimized.push_back(segment.param);
  } else {
    const auto blocks = model->hook_points();
    for (size_t i = 0; i < blocks.size(); ++i) {
      const std::string prefix = "blocks." + std::to_string(i) + ".";
      shardtrain::fully_shard(
          blocks[i], mesh,
          shardtrain::FullyShardOptions().init(
              [init, prefix](const std::string& name, int64_t begin, const at::Tensor& out) {
                init(prefix + name, begin, out);
              }));
    }
    root = shardtrain::fully_shard(model.ptr(), mesh, shardtrain::FullyShardOptions().init(init));
    optimized = root->parameters();
  }
  shardtrain::FusedAdamW optimizer(optimized, torch::optim::AdamWOptions(1e-4).weight_decay(0.1));

  torch::manual_seed(1 + world->rank());
  const at::Tensor tokens = at::randint(config.vocab_size, {batch, seq + 1}, at::kLong);
  const at::Tensor inputs = tokens.narrow(1, 0, seq);
  const at::Tensor targets = tokens.narrow(1, 1, seq).reshape({-1});

  std::vector<double> times;
  std::string losses;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    if (flat) {
      flat->zero_grad();
    } else {
      optimizer.zero_grad();
    }
    const at::Tensor logits = shardtrain::call(model, inputs);
    const at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, config.vocab_size}), targets);
    loss.backward();
    optimizer.step();
    if (flat) flat->after_optimizer_step();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (s >= warmup) times.push_back(seconds);
    losses += (losses.empty() ? "" : ", ") + std::to_string(loss.item<double>());
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf(
      "{\"layout\": \"%s\", \"ranks\": %d, \"rank\": %d, \"median_step_s\": %.4f, "
      "\"peak_rss_mib\": %.1f, \"losses\": [%s]}\n",
      layout.c_str(), world->size(), world->rank(), median(times),
      static_cast<double>(usage.ru_maxrss) / 1024.0, losses.c_str());
  return 0;
}
