// What a run shows while it runs: what it trains and how (at the start), the progress line with its
// ETA, the bar on a terminal, and the timeline trace of the steps run.trace asks for.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "model/compression.h"
#include "parallel/parallel_model.h"
#include "shardtrain/memory.h"
#include "shardtrain/train.h"
#include "trace/telemetry.h"
#include "train/run_data.h"
#include "train/run_setup.h"

namespace shardtrain {
namespace {

// "42s", "3m07s", "2h05m".
std::string duration_text(double seconds) {
  const auto total = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char text[32];
  if (total < 60) {
    std::snprintf(text, sizeof(text), "%llds", total);
  } else if (total < 3600) {
    std::snprintf(text, sizeof(text), "%lldm%02llds", total / 60, total % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lldh%02lldm", total / 3600, (total % 3600) / 60);
  }
  return text;
}

}  // namespace

bool Trainer::traces(int64_t step) const {
  return config_.run.trace && step >= config_.run.trace_first && step <= config_.train.steps &&
         (config_.run.trace_last == 0 || step <= config_.run.trace_last);
}

bool Trainer::trace_step(int64_t step) {
  const bool on = traces(step);
  if (on) {
    telemetry_->start_tracing();
    trace_unwritten_ = true;
  } else {
    telemetry_->stop_tracing();
  }
  return on;
}

void Trainer::write_trace() {
  if (!telemetry_) return;
  telemetry_->stop_tracing();
  if (!trace_unwritten_) return;
  trace_unwritten_ = false;
  const std::filesystem::path path = std::filesystem::path(config_.run.dir) / "trace" /
                                     ("rank_" + std::to_string(rank()) + ".json");
  telemetry_->write_trace(path.string());
}

void Trainer::print_progress(const StepResult& result, double eval_loss) {
  if (rank() != 0) return;
  // The ETA assumes the remaining steps take as long as this process's steps took on average
  // (the first one included: it is slower, so the estimate errs long early on).
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first_step_at_).count();
  const double eta = elapsed / static_cast<double>(std::max<int64_t>(1, steps_this_process_)) *
                     static_cast<double>(config_.train.steps - step_);
  if (step_ % config_.run.log_every == 0 || step_ == config_.train.steps || step_ == 1) {
    if (progress_bar_) std::printf("\r\033[K");  // the bar's line becomes the log line
    std::printf(
        "step %5lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | %.3f s/step | rss %.1f MiB%s",
        static_cast<long long>(step_), static_cast<long long>(config_.train.steps), result.loss,
        result.lr, result.tokens_per_s, result.step_time_s,
        static_cast<double>(detail::resident_bytes()) / (1 << 20),
        result.skipped ? " | skipped (overflow)" : "");
    std::printf("%s", parallel_->progress_note().c_str());
    if (!std::isnan(eval_loss)) std::printf(" | eval loss %.4f", eval_loss);
    if (step_ < config_.train.steps) std::printf(" | eta %s", duration_text(eta).c_str());
    std::printf("\n");
  }
  if (progress_bar_ && step_ < config_.train.steps) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(kWidth * step_ / std::max<int64_t>(1, config_.train.steps));
    std::printf("\r[%s%s] %lld/%lld eta %s", std::string(filled, '#').c_str(),
                std::string(kWidth - filled, '.').c_str(), static_cast<long long>(step_),
                static_cast<long long>(config_.train.steps), duration_text(eta).c_str());
  }
  std::fflush(stdout);
}

}  // namespace shardtrain

namespace shardtrain {

void Trainer::print_packing() const {
  const SampleShard& samples = *data_->samples;
  int64_t loss_tokens = 0;
  for (int64_t i = 0; i < samples.num_samples(); ++i) {
    loss_tokens += samples.loss_tokens(i, 0, samples.length(i));
  }
  const PackingStats& packed = loader_->packing_stats();
  const double positions = static_cast<double>(packed.rows * config_.data.seq_len);
  std::printf(
      "%s data: %lld samples, %lld tokens (%lld with a loss, %lld masked); %s into %lld "
      "sequences of %lld (%.1f%% padding), %lld cut to %lld tokens, %lld dropped\n",
      config_.data.format.c_str(), static_cast<long long>(samples.num_samples()),
      static_cast<long long>(samples.num_tokens()), static_cast<long long>(loss_tokens),
      static_cast<long long>(samples.num_tokens() - loss_tokens),
      config_.data.packing ? "packed" : "one per row", static_cast<long long>(packed.rows),
      static_cast<long long>(config_.data.seq_len),
      positions > 0 ? 100.0 * static_cast<double>(packed.padding) / positions : 0.0,
      static_cast<long long>(packed.truncated), static_cast<long long>(config_.data.seq_len + 1),
      static_cast<long long>(packed.dropped));
}

void Trainer::print_start() const {
  std::printf(
      "training %s (%s, %.2fM parameters) on %s, %lld steps of %lld sequences x %lld "
      "tokens\n",
      config_.model.name.c_str(), config_.model.model_type().c_str(),
      static_cast<double>(config_.model.num_parameters()) / 1e6, data_->describe().c_str(),
      static_cast<long long>(config_.train.steps),
      static_cast<long long>(loader_->global_batch_size()),
      static_cast<long long>(config_.data.seq_len));
  if (device_.is_cuda()) std::printf("device %s\n", device_.str().c_str());
  if (data_->samples) print_packing();
  if (config_.lora.rank > 0) {
    int64_t trainable = 0, layers = 0;
    for (const auto& item : model_->named_parameters()) {
      if (!item.value().requires_grad()) continue;
      trainable += item.value().numel();
      layers += item.key().find(".lora_A.") != std::string::npos ? 1 : 0;
    }
    std::printf(
        "lora rank %lld on %lld layers: %.3fM trainable parameters (%.2f%%), base "
        "frozen in %s\n",
        static_cast<long long>(config_.lora.rank), static_cast<long long>(layers),
        static_cast<double>(trainable) / 1e6,
        100.0 * static_cast<double>(trainable) /
            static_cast<double>(config_.model.num_parameters()),
        config_.lora.base_dtype.c_str());
  }
  if (compression_) {
    std::printf(
        "compression: weights of %lld linear layers quantized from step %lld, inputs of %lld "
        "from step %lld\n",
        static_cast<long long>(compression_->weight_layers()),
        static_cast<long long>(config_.compression.weight_offset + 1),
        static_cast<long long>(compression_->activation_layers()),
        static_cast<long long>(config_.compression.activation_offset + 1));
  }
  // How the run is parallelized, as parallelize() described it.
  std::printf("%s", parallel_->description().c_str());
  std::fflush(stdout);
}

void Trainer::count_skipped(const StepResult& result) {
  if (!result.skipped && std::isfinite(result.loss)) {
    skipped_in_a_row_ = 0;
    last_finite_loss_ = result.loss;
    last_good_step_ = step_;
  } else if (result.skipped) {
    ++skipped_in_a_row_;
  }
}

void Trainer::check_divergence() const {
  if (skipped_in_a_row_ >= config_.train.max_skipped) {
    char text[64];
    std::snprintf(text, sizeof(text), "%.6g", last_finite_loss_);
    throw std::runtime_error(
        "training diverged: steps " + std::to_string(step_ - skipped_in_a_row_ + 1) + " to " +
        std::to_string(step_) + " all had non-finite gradients (train.max_skipped = " +
        std::to_string(config_.train.max_skipped) + "); the last finite loss was " +
        (last_good_step_ > 0 ? std::string(text) + " at step " + std::to_string(last_good_step_)
                             : std::string("never seen")) +
        ". No checkpoint was written since; lower train.lr or raise train.clip / "
        "train.max_skipped");
  }
}

}  // namespace shardtrain
