// train.autotune: DeepSpeed's fast autotuning (the micro-batch with the highest measured
// throughput), each candidate trained for a few steps by a Trainer of its own.
#include <torch/types.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "parallel/parallel_model.h"
#include "shardtrain/train.h"

namespace shardtrain {
namespace {

namespace fs = std::filesystem;

struct Trial {
  int64_t micro_batch = 0;
  double tokens_per_s = 0.0;  // rank 0's median
  std::string failure;        // set on every rank when any rank could not run it
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The configuration a search takes: with train.global_batch set, the accumulation follows from
// each micro-batch.
TrainConfig with_micro_batch(const TrainConfig& config, int64_t micro_batch) {
  TrainConfig out = config;
  out.train.autotune = false;
  out.train.micro_batch = micro_batch;
  if (out.train.global_batch > 0) {
    out.train.grad_accum = 1;
    out.parallel.pp_microbatches = 0;
  }
  return out;
}

// `micro_batch` trained for train.autotune_steps steps in a scratch directory under `scratch`.
Trial run_trial(const TrainConfig& config, int64_t micro_batch,
                const std::shared_ptr<ProcessGroup>& world, const fs::path& scratch) {
  TrainConfig trial = with_micro_batch(config, micro_batch);
  trial.train.steps = config.train.autotune_steps;
  trial.train.sample_tokens = 0;
  trial.train.eval_every = 0;
  trial.train.checkpoint_every = 0;
  trial.train.final_checkpoint = false;
  trial.run.dir = (scratch / ("micro_batch_" + std::to_string(micro_batch))).string();
  trial.run.resume.clear();
  trial.run.overwrite = true;
  trial.run.trace = false;
  Trial out{micro_batch, 0.0, ""};
  std::vector<double> timed;
  try {
    Trainer trainer(trial, world);
    for (int64_t step = 1; step <= trial.train.steps; ++step) {
      const StepResult result = trainer.train_step();
      if (step >= config.train.autotune_first_timed) timed.push_back(result.tokens_per_s);
    }
    out.tokens_per_s = median(timed);
  } catch (const std::exception& e) {
    out.failure = e.what();
    out.failure = out.failure.substr(0, out.failure.find('\n'));
  }
  if (world && world->size() > 1) {
    // A micro-batch that failed on any rank failed for all, so every rank stops alike; and every
    // rank goes on with rank 0's measurement.
    if (detail::on_any_rank(*world, !out.failure.empty()) && out.failure.empty()) {
      out.failure = "failed on another rank";
    }
    at::Tensor rate = torch::tensor({out.tokens_per_s}, at::kDouble);
    world->broadcast(rate, 0)->wait();
    out.tokens_per_s = rate.item<double>();
  }
  return out;
}

// Removes the scratch runs however the search ends (rank 0, which made them).
struct ScratchRemover {
  fs::path path;
  bool owner;
  ~ScratchRemover() {
    std::error_code ignored;
    if (owner) fs::remove_all(path, ignored);
  }
};

}  // namespace

TrainConfig autotune_micro_batch(const TrainConfig& config,
                                 const std::shared_ptr<ProcessGroup>& world) {
  const int rank = world ? world->rank() : 0;
  const int world_size = world ? world->size() : 1;
  const int64_t model_ranks = config.parallel.tp * config.parallel.pp * config.parallel.cp;
  const int64_t data_parallel = std::max<int64_t>(1, world_size / model_ranks);
  // Beside the run directory (whatever its spelling: "runs/x/", "."), which the search leaves
  // untouched.
  fs::path run_dir = fs::absolute(config.run.dir).lexically_normal();
  if (!run_dir.has_filename()) run_dir = run_dir.parent_path();
  const ScratchRemover scratch{run_dir.string() + ".autotune", rank == 0};
  const TrainSection& t = config.train;
  std::vector<Trial> trials;
  Trial best;
  for (int64_t micro = t.autotune_min_micro_batch; micro <= t.autotune_max_micro_batch;
       micro = micro > t.autotune_max_micro_batch / 2 ? t.autotune_max_micro_batch + 1
                                                      : micro * 2) {
    if (t.autotune_max_batch > 0 && t.global_batch == 0 &&
        micro > t.autotune_max_batch / (t.grad_accum * data_parallel)) {
      break;
    }
    const Trial trial = run_trial(config, micro, world, scratch.path);
    trials.push_back(trial);
    if (rank == 0) {
      if (trial.failure.empty()) {
        std::printf("autotune: micro-batch %lld: %.0f tokens/s\n", static_cast<long long>(micro),
                    trial.tokens_per_s);
      } else {
        std::printf("autotune: micro-batch %lld cannot run: %s\n", static_cast<long long>(micro),
                    trial.failure.c_str());
      }
      std::fflush(stdout);
    }
    if (!trial.failure.empty()) {
      if (trials.size() == 1) {
        throw std::invalid_argument("train.autotune: the smallest micro-batch (" +
                                    std::to_string(micro) + ") cannot run: " + trial.failure);
      }
      break;
    }
    if (trial.tokens_per_s > best.tokens_per_s) {
      best = trial;
    } else if (trial.tokens_per_s < 0.95 * best.tokens_per_s) {
      break;  // past the peak, as DeepSpeed's tuner stops
    }
  }
  if (trials.empty()) {
    throw std::invalid_argument(
        "train.autotune: no micro-batch from train.autotune_min_micro_batch (" +
        std::to_string(t.autotune_min_micro_batch) + ") fits train.autotune_max_batch (" +
        std::to_string(t.autotune_max_batch) + ") at train.grad_accum " +
        std::to_string(t.grad_accum) + " on " + std::to_string(data_parallel) +
        " data-parallel ranks");
  }
  // Every rank is done with the scratch runs before rank 0 removes them.
  if (world && world->size() > 1) world->barrier()->wait();
  if (rank == 0) {
    std::printf("autotune: train.micro_batch = %lld (%.0f tokens/s)\n",
                static_cast<long long>(best.micro_batch), best.tokens_per_s);
    std::fflush(stdout);
  }
  return with_micro_batch(config, best.micro_batch);
}

std::optional<TrainConfig> micro_batch_of_run(const TrainConfig& config) {
  const fs::path manifest = fs::path(config.run.dir) / "run.json";
  std::ifstream in(manifest);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json run = nlohmann::json::parse(in);
    return with_micro_batch(config, run.at("train").at("micro_batch").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(manifest.string() +
                                ": cannot read the micro-batch the run chose (" + e.what() + ")");
  }
}

}  // namespace shardtrain
