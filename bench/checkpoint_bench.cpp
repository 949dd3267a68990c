// Sharded checkpoint throughput: saving a model from 1 rank and from 2 in-process ranks (each
// writing its half in parallel), reading it back whole, and exporting it as a Hugging Face
// model. Usage: build/bench_checkpoint [DIR] [MB]; prints each round and the medians of 5 rounds
// in GB/s of tensor data, with the 2-rank / 1-rank save ratio.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "shardtrain/hf.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/threads.h"

namespace fs = std::filesystem;
using namespace shardtrain;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const fs::path dir = argc > 1 ? argv[1] : fs::temp_directory_path() / "shardtrain_ckpt_bench";
  const int64_t megabytes = argc > 2 ? std::stoll(argv[2]) : 256;
  shardtrain::set_num_threads(1);
  // A GPT-2-family model whose layer count gives about the requested size.
  ModelConfig config = model_preset("tiny");
  config.vocab_size = 8192;
  config.context_length = 1024;
  config.d_model = 1024;
  config.n_heads = 16;
  config.n_kv_heads = 16;
  config.ffn_hidden = 4096;
  config.n_layers = std::max<int64_t>(1, (megabytes - 36) / 48);
  std::vector<TensorSpec> specs;
  std::vector<at::Tensor> data;
  int64_t bytes = 0;
  for (const auto& p : config.parameter_shapes()) {
    specs.push_back({p.name, p.shape, at::kFloat});
    data.push_back(at::randn({p.numel()}));
    bytes += p.numel() * 4;
  }
  auto slices_of = [&](int world, int rank) {
    std::vector<FlatSlice> slices;
    for (size_t i = 0; i < specs.size(); ++i) {
      const ShardRange r = shard_range(data[i].numel(), world, rank);
      if (r.numel > 0)
        slices.push_back({specs[i].name, r.offset, data[i].narrow(0, r.offset, r.numel)});
    }
    return slices;
  };
  const std::string metadata = R"({"model": {"family": "gpt2", "vocab_size": 8192,
      "context_length": 1024, "d_model": 1024, "n_layers": )" +
                               std::to_string(config.n_layers) + R"(, "n_heads": 16,
      "n_kv_heads": 16, "ffn_hidden": 4096, "norm_eps": 1e-5, "rope_theta": 10000.0,
      "dropout": 0.0, "tie_embeddings": true}})";
  const double gb = static_cast<double>(bytes) / 1e9;
  std::vector<double> save1, save2, load, exported;
  // The two ranks connect once; rank 1 waits while rank 0 times the one-process runs.
  run_local_ranks(2, [&](ProcessGroup& group) {
    const bool lead = group.rank() == 0;
    for (int round = 0; round < 5; ++round) {
      std::string one;
      if (lead) {
        fs::remove_all(dir);
        const auto start = std::chrono::steady_clock::now();
        one = save_sharded_checkpoint((dir / "one").string(), "step_000001", specs, slices_of(1, 0),
                                      nullptr, ShardedSaveOptions().metadata(metadata));
        save1.push_back(gb / seconds_since(start));
      }
      group.barrier()->wait();
      const auto start = std::chrono::steady_clock::now();
      save_sharded_checkpoint((dir / "two").string(), "step_000001", specs,
                              slices_of(2, group.rank()), &group,
                              ShardedSaveOptions().strategy("ddp").metadata(metadata));
      if (lead) save2.push_back(gb / seconds_since(start));
      group.barrier()->wait();
      if (!lead) continue;
      auto phase = std::chrono::steady_clock::now();
      const ShardedCheckpointReader reader((dir / "two" / "step_000001").string());
      for (const auto& spec : specs) reader.read(spec.name);
      load.push_back(gb / seconds_since(phase));
      phase = std::chrono::steady_clock::now();
      export_hf_checkpoint(one, (dir / "hf").string(), /*overwrite=*/true);
      exported.push_back(gb / seconds_since(phase));
      std::printf(
          "round %d: save 1 rank %.2f GB/s, save 2 ranks %.2f GB/s, read %.2f GB/s, "
          "export %.2f GB/s\n",
          round + 1, save1.back(), save2.back(), load.back(), exported.back());
      std::fflush(stdout);
    }
  });
  fs::remove_all(dir);
  std::printf(
      "%.0f MB model (%lld tensors); median save 1 rank %.2f GB/s, 2 ranks %.2f GB/s "
      "(ratio %.2f), read %.2f GB/s, export %.2f GB/s\n",
      static_cast<double>(bytes) / 1e6, static_cast<long long>(specs.size()), median(save1),
      median(save2), median(save2) / median(save1), median(load), median(exported));
  return 0;
}
