// The trainer's checkpoints (model, optimizer, data position, RNG, loss scale) and metrics.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/model_description.h"
#include "checkpoint/safetensors_detail.h"
#include "comm/join.h"
#include "comm/replica_world.h"
#include "common/file_error.h"
#include "model/fp8.h"
#include "parallel/parallel_model.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "trace/telemetry.h"
#include "train/lora_base.h"
#include "train/run_data.h"
#include "train/run_setup.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

// Steps after a resumed checkpoint are measured again: drops their metrics lines.
void drop_metrics_after(const fs::path& metrics, int64_t step) {
  std::ifstream old(metrics);
  if (!old) return;
  std::vector<std::string> kept;
  for (std::string line; std::getline(old, line);) {
    try {
      if (nlohmann::json::parse(line).at("step").get<int64_t>() <= step) kept.push_back(line);
    } catch (const std::exception&) {
      // a line cut short by the interruption
    }
  }
  // Replaced whole: a resume that cannot write (a full disk) leaves the metrics as they were.
  std::string text;
  for (const auto& line : kept) text += line + "\n";
  detail::replace_file(metrics.string(), text);
}

int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) {
    if (t.defined()) total += static_cast<int64_t>(t.nbytes());
  }
  return total;
}

// The model's tensors must be the checkpoint's, in name, shape and dtype: names the first that
// is not (in parameter order), then any tensor of the checkpoint the model lacks.
// `whole`: the model is the whole model (not one pipeline stage's parts).
void check_model_tensors(const ShardedCheckpointReader& reader, const NamedTensors& model,
                         bool whole) {
  std::set<std::string> names;
  for (const auto& [name, tensor] : model) {
    names.insert(name);
    const TensorSpec* spec = reader.find(name);
    if (!spec) {
      throw std::invalid_argument("checkpoint '" + reader.dir() + "' has no tensor '" + name +
                                  "' (it was written for another model)");
    }
    if (!tensor.sizes().equals(spec->shape) || tensor.scalar_type() != spec->dtype) {
      throw std::invalid_argument("checkpoint '" + reader.dir() + "': tensor '" + name + "' is " +
                                  c10::str(c10::IntArrayRef(spec->shape)) + " " +
                                  c10::toString(spec->dtype) + ", the model expects " +
                                  c10::str(tensor.sizes()) + " " +
                                  c10::toString(tensor.scalar_type()));
    }
  }
  for (const auto& spec : reader.tensors()) {
    if (whole && spec.name.rfind("optim.", 0) != 0 && !names.count(spec.name)) {
      throw std::invalid_argument("checkpoint '" + reader.dir() + "' has tensor '" + spec.name +
                                  "', which the model does not have (it was written for another "
                                  "model)");
    }
  }
}

}  // namespace

std::string Trainer::save_checkpoint_on_replicas() {
  if (!replicas_) return save_checkpoint();
  try {
    return save_checkpoint();
  } catch (const std::exception& e) {
    // As after a failed step's body: the groups are given up, so that peers still in them fail
    // at once; the incomplete checkpoint was removed by rank 0 (or is never committed).
    replicas_->abandon();
    parallel_->after_save();
    if (!replicas_->member_lost(kReplicaLossWait)) throw;  // this rank's own error
    if (rank() == 0) {
      std::fprintf(stderr,
                   "shardtrain: the checkpoint of step %lld is not written: a replica failed "
                   "during the save: %s\n",
                   static_cast<long long>(step_), detail::first_line(e.what()).c_str());
    }
    return "";
  }
}

std::string Trainer::save_checkpoint() {
  fail_if_injected(InjectionPoint::kSave);
  detail::TelemetryScope telemetry(telemetry_);
  const bool async = config_.run.checkpoint_async;
  if (async) wait_for_checkpoint();  // one save at a time
  detail::TraceSpan span(async ? "checkpoint copy" : "checkpoint save", "checkpoint");
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(step_));
  CheckpointContents contents = parallel_->checkpoint_contents(*optimizer_);
  const nlohmann::json training = {
      {"step", step_},
      {"samples", samples_},
      {"global_batch", loader_->global_batch_size()},
      {"seq_len", config_.data.seq_len},
      {"loss_scale", scaler_.scale()},
      {"loss_scale_good_steps", scaler_.good_steps()},
      {"loss_scale_skipped", scaler_.skipped_steps()},
      {"loss_scale_hysteresis_left", scaler_.hysteresis_left()},
      {"schedule",
       {{"lr", schedule_.lr},
        {"min_lr", schedule_.min_lr},
        {"warmup", schedule_.warmup},
        {"steps", schedule_.total_steps},
        {"kind", schedule_.kind},
        {"warmup_type", schedule_.warmup_type}}},
      {"tokenizer", tokenizer_->name()},
      // What `shardtrain generate` reads the checkpoint with.
      {"tokenizer_path", detail::tokenizer_path(config_)},
      {"chat_template",
       chat_template_ && config_.data.format == "chat" ? chat_template_->origin() : std::string()},
      {"format", config_.data.format}};
  nlohmann::json metadata = {{"model", detail::describe_model(config_.model)},
                             {"training", training}};
  if (config_.lora.rank > 0) {
    // What export needs to rebuild the adapted model: the adapters' settings and the base.
    metadata["lora"] = {{"rank", config_.lora.rank},
                        {"alpha", config_.lora.alpha},
                        {"dropout", config_.lora.dropout},
                        {"target_modules", config_.lora.target_modules},
                        {"base_dtype", config_.lora.base_dtype},
                        {"init_from", config_.model.init_from},
                        {"seed", config_.train.seed},
                        // What a resume compares its own base with.
                        {"base", detail::lora_base(config_)}};
  }
  // The random streams this rank draws from: the CPU's, and its GPU's under run.device = "cuda"
  // (dropout there), so that a resumed run draws the same masks.
  NamedTensors rng = {{"rng.cpu", at::detail::getDefaultCPUGenerator().get_state()}};
  if (device_.is_cuda()) {
    rng.emplace_back("rng.cuda", at::globalContext().defaultGenerator(device_).get_state());
  }
  // precision.fp8's scaling state (the same on every rank): the next step's scales and history.
  if (!fp8_layers_.empty()) {
    std::vector<at::Tensor> histories, scales;
    for (const auto& layer : fp8_layers_) {
      histories.push_back(layer->history.cpu());
      scales.push_back(layer->scale.cpu());
    }
    rng.emplace_back("fp8.history", at::stack(histories));
    rng.emplace_back("fp8.scale", at::stack(scales));
  }
  auto options = ShardedSaveOptions()
                     .strategy(to_string(config_.parallel.strategy))
                     .keep(static_cast<int>(config_.train.keep_checkpoints))
                     .metadata(metadata.dump())
                     .rank_state(std::move(rng));
  if (!contents.fetchers.empty()) {
    options.fetch([&](size_t i) {
      return contents.fetchers[i] ? contents.fetchers[i]() : contents.slices[i].data;
    });
  }
  // Fault injection for tests: the process dies with every rank file written but nothing
  // committed, as a machine failing mid-save would.
  const char* kill_at = std::getenv("SHARDTRAIN_FAULT_KILL_BEFORE_COMMIT");
  if (kill_at && std::string(kill_at) == name) options.before_commit([] { std::raise(SIGKILL); });
  const std::string root = config_.run.dir + "/checkpoints";
  if (!async) {
    const std::string dir =
        save_sharded_checkpoint(root, name, contents.specs, contents.slices, world_.get(), options);
    parallel_->after_save();
    return dir;
  }
  checkpoint_in_flight_ =
      save_sharded_checkpoint_async(root, name, contents.specs, contents.slices, checkpoint_group_,
                                    std::move(options.staging(checkpoint_staging_)));
  parallel_->after_save();
  return (fs::path(root) / name).string();
}

void Trainer::prepare_checkpoint_staging() {
  // After a step, when AdamW's state exists: the slices are those every save will copy.
  const bool saves = config_.train.checkpoint_every > 0 || config_.train.final_checkpoint;
  if (!checkpoint_staging_ || !saves) return;
  detail::TelemetryScope telemetry(telemetry_);
  CheckpointContents contents = parallel_->checkpoint_contents(*optimizer_);
  checkpoint_staging_->prepare(contents.slices);
  parallel_->after_save();
}

std::string Trainer::wait_for_checkpoint() {
  if (!checkpoint_in_flight_.valid()) return "";
  detail::TelemetryScope telemetry(telemetry_);
  detail::TraceSpan span("checkpoint wait", "checkpoint");
  return checkpoint_in_flight_.get();  // leaves the future empty, error or not
}

void Trainer::load_checkpoint(const std::string& dir) {
  detail::TelemetryScope telemetry(telemetry_);
  detail::TraceSpan span("checkpoint load", "checkpoint");
  const ShardedCheckpointReader reader(dir);
  nlohmann::json training;
  try {
    training = nlohmann::json::parse(reader.metadata()).at("training");
  } catch (const nlohmann::json::exception&) {
    throw std::invalid_argument("checkpoint '" + dir +
                                "' has no training state in index.json (not written by the "
                                "trainer)");
  }
  // Compared before anything is read: a checkpoint of another model, or adapters of another
  // base, changes nothing.
  check_model_tensors(reader, parallel_->checkpoint_expected(), parallel_->holds_whole_model());
  if (config_.lora.rank > 0) {
    const nlohmann::json metadata = nlohmann::json::parse(reader.metadata());
    if (metadata.contains("lora")) {
      detail::check_lora_base(metadata.at("lora").value("base", nlohmann::json()), config_, dir);
    }
  }
  parallel_->restore(reader, *optimizer_);
  restore_training_state(reader, dir);
}

void Trainer::restore_training_state(const ShardedCheckpointReader& reader,
                                     const std::string& dir) {
  const nlohmann::json training = nlohmann::json::parse(reader.metadata()).at("training");
  // Each rank restores its own RNG; a rank the saving run did not have takes rank 0's.
  auto rank_state = reader.rank_state(rank());
  if (!rank_state.count("rng.cpu")) rank_state = reader.rank_state(0);
  if (rank_state.count("rng.cpu")) {
    // A copy of the handle shares the generator; the default one is only reachable as const.
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(rank_state.at("rng.cpu"));
  }
  if (device_.is_cuda() && rank_state.count("rng.cuda")) {
    at::Generator generator = at::globalContext().defaultGenerator(device_);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(rank_state.at("rng.cuda"));
  }
  // fp8 scaling state; a checkpoint of a run without it starts the scales afresh.
  if (!fp8_layers_.empty() && rank_state.count("fp8.history")) {
    const at::Tensor& histories = rank_state.at("fp8.history");
    const at::Tensor& scales = rank_state.at("fp8.scale");
    const auto layers = static_cast<int64_t>(fp8_layers_.size());
    if (histories.dim() != 3 || histories.size(0) != layers ||
        histories.size(1) != fp8_layers_[0]->history.size(0) || scales.size(0) != layers) {
      throw std::invalid_argument("checkpoint '" + dir + "': its fp8 state holds " +
                                  c10::str(histories.sizes()) + " amax histories, this run [" +
                                  std::to_string(layers) + ", " +
                                  std::to_string(fp8_layers_[0]->history.size(0)) +
                                  ", 3] (precision.fp8_amax_history must be the saving run's)");
    }
    for (int64_t i = 0; i < layers; ++i) {
      fp8_layers_[static_cast<size_t>(i)]->history.copy_(histories[i]);
      fp8_layers_[static_cast<size_t>(i)]->scale.copy_(scales[i]);
    }
  }
  try {
    step_ = training.at("step").get<int64_t>();
    samples_ = training.at("samples").get<int64_t>();
    scaler_.restore(training.at("loss_scale").get<double>(),
                    training.at("loss_scale_good_steps").get<int64_t>(),
                    training.at("loss_scale_skipped").get<int64_t>(),
                    training.value("loss_scale_hysteresis_left", int64_t{0}));
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("checkpoint '" + dir + "': training state is incomplete (" +
                                e.what() + ")");
  }

  if (rank() == 0) drop_metrics_after(fs::path(config_.run.dir) / "metrics.jsonl", step_);
  barrier();  // nobody appends before rank 0 has rewritten the file
  if (rank() == 0) {
    std::printf("resumed from %s at step %lld (saved by %s on %d rank%s)\n", dir.c_str(),
                static_cast<long long>(step_), reader.strategy().c_str(), reader.world_size(),
                reader.world_size() == 1 ? "" : "s");
    // A batch shape changed since the save is allowed (as in torchtitan and DeepSpeed), and said.
    const int64_t batch = training.value("global_batch", loader_->global_batch_size());
    const int64_t length = training.value("seq_len", config_.data.seq_len);
    if (batch != loader_->global_batch_size() || length != config_.data.seq_len) {
      std::printf(
          "note: the checkpoint was trained on global batches of %lld sequences of %lld tokens; "
          "this run takes %lld of %lld from here, the data going on from sequence %lld\n",
          static_cast<long long>(batch), static_cast<long long>(length),
          static_cast<long long>(loader_->global_batch_size()),
          static_cast<long long>(config_.data.seq_len), static_cast<long long>(samples_));
    }
  }
}

void Trainer::write_metrics(const StepResult& result, double eval_loss) {
  std::vector<at::Tensor> grads, optim_state;
  const std::vector<at::Tensor> parameters = parallel_->parameters();
  for (const auto& p : parameters) {
    grads.push_back(p.grad());
    if (const auto* state = detail::adam_state(*optimizer_, p)) {
      optim_state.push_back(state->exp_avg());
      optim_state.push_back(state->exp_avg_sq());
    }
  }
  nlohmann::json line = {{"step", result.step},
                         {"rank", rank()},
                         {"loss", result.loss},
                         {"lr", result.lr},
                         {"grad_norm", result.grad_norm},
                         {"tokens_per_s", result.tokens_per_s},
                         {"step_time_s", result.step_time_s},
                         {"loss_scale", scaler_.scale()},
                         {"skipped", result.skipped},
                         {"mem",
                          {{"params", bytes_of(parameters)},
                           {"grads", bytes_of(grads)},
                           {"optim", bytes_of(optim_state)},
                           {"activations_peak", result.activations_peak},
                           {"peak_rss", peak_rss_}}}};
  parallel_->add_metrics(line);
  if (replicas_) {
    // Under replica fault tolerance: the replicas the step ran on; a degraded step ran on
    // fewer than all, its loss and gradient the mean over theirs.
    line["replicas"] = replicas_->replicas_now();
    if (replicas_->replicas_now() < replicas_->replicas()) line["degraded"] = true;
    // Which process took the step, and a digest of its trained state (parameters and AdamW's
    // moments): the same on every replica after every step.
    line["pid"] = static_cast<int64_t>(getpid());
    uint32_t crc = 0;
    for (const auto& t : parallel_->optimized()) {
      const at::Tensor value = t.tensor.contiguous();
      crc = detail::crc32_of(value.data_ptr(), static_cast<int64_t>(value.nbytes()), crc);
      if (const auto* state = detail::adam_state(*optimizer_, t.tensor)) {
        for (const at::Tensor& moment : {state->exp_avg(), state->exp_avg_sq()}) {
          const at::Tensor m = moment.contiguous();
          crc = detail::crc32_of(m.data_ptr(), static_cast<int64_t>(m.nbytes()), crc);
        }
      }
    }
    line["state_crc32"] = crc;
  }
  if (!std::isnan(result.aux_loss)) line["aux_loss"] = result.aux_loss;
  if (result.blocks_run >= 0) {
    line["layer_drop"] = {{"theta", result.layer_drop_theta}, {"blocks_run", result.blocks_run}};
  }
  if (result.random_ltd_tokens >= 0) line["random_ltd"] = {{"tokens", result.random_ltd_tokens}};
  if (!std::isnan(result.expert_tokens_mean)) {
    line["expert_tokens"] = {{"min", result.expert_tokens_min},
                             {"mean", result.expert_tokens_mean},
                             {"max", result.expert_tokens_max}};
  }
  if (world_size() > 1) {
    line["comm"] = {{"seconds", result.comm_s},
                    {"exposed_seconds", result.comm_exposed_s},
                    {"bytes", result.comm_bytes}};
    if (result.comm_tp_bytes > 0) {  // tensor-parallel collectives inside forward and backward
      line["comm"]["tp_seconds"] = result.comm_tp_s;
      line["comm"]["tp_bytes"] = result.comm_tp_bytes;
    }
  }
  // Seconds since this process took its first step (a resumed run starts again from zero).
  line["elapsed_s"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - first_step_at_).count();
  if (result.file_read_bytes + result.file_written_bytes > 0) {
    line["file_io"] = {{"read_bytes", result.file_read_bytes},
                       {"written_bytes", result.file_written_bytes},
                       {"seconds", result.file_io_s},
                       {"wait_seconds", result.file_wait_s}};
  }
  if (!std::isnan(eval_loss)) line["eval_loss"] = eval_loss;
  const fs::path path = fs::path(config_.run.dir) / "metrics.jsonl";
  errno = 0;
  std::ofstream out(path, std::ios::app);
  out << line.dump() << "\n";
  out.close();
  if (!out) throw std::runtime_error(detail::cannot_write(path.string()));
}

}  // namespace shardtrain
