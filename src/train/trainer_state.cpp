// The trainer's checkpoints (model, optimizer, data position, RNG, loss scale) and metrics.
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "checkpoint/model_description.h"
#include "model/init.h"
#include "model/names.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "parallel/tensor/tp_state.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "trace/telemetry.h"
#include "train/run_data.h"
#include "train/run_setup.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

// LibTorch keys optimizer state by the parameter's TensorImpl address, printed.

// AdamW's state of one parameter, or null before its first step.
const torch::optim::AdamWParamState* adam_state(const torch::optim::AdamW& optimizer,
                                                const at::Tensor& parameter) {
  auto it = optimizer.state().find(detail::optimizer_state_key(parameter));
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<const torch::optim::AdamWParamState*>(it->second.get());
}

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
  std::ofstream rewrite(metrics, std::ios::trunc);
  for (const auto& line : kept) rewrite << line << "\n";
}

int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) {
    if (t.defined()) total += static_cast<int64_t>(t.nbytes());
  }
  return total;
}

// Parameters that train: every one, or a LoRA run's adapters (its frozen base comes from
// model.init_from or the seed again on resume, and is not written).
std::vector<std::pair<std::string, at::Tensor>> trained_parameters(Transformer& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model->named_parameters()) {
    if (item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  }
  return out;
}

// Strategy-specific: fills `targets` (this rank's tensors, by checkpoint name) from the reader.
// Replicated strategies read every tensor whole; a sharded strategy reads only the flat range
// it owns with reader.read_flat_into().
void restore_tensors(const std::string& strategy, const ShardedCheckpointReader& reader,
                     const detail::TpState* tp, const NamedTensors& targets) {
  TORCH_CHECK(strategy == "none" || strategy == "ddp", "checkpoints of parallel.strategy = \"",
              strategy, "\" are not implemented");
  torch::NoGradGuard no_grad;
  for (const auto& [name, target] : targets) {
    if (tp && tp->layout_of(name)) {
      detail::read_local_into(reader, tp, name, 0, target.view({-1}));
    } else {
      target.copy_(reader.read(name));
    }
  }
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

NamedTensors detail::logical_tensors(Transformer& model, const torch::optim::AdamW& optimizer) {
  NamedTensors tensors;
  const auto trained = trained_parameters(model);
  for (const auto& [name, value] : trained) tensors.emplace_back(name, value);
  for (const auto& item : model->named_buffers()) tensors.emplace_back(item.key(), item.value());
  for (const auto& [key, value] : trained) {
    const auto* state = adam_state(optimizer, value);
    if (!state) continue;
    tensors.emplace_back("optim." + key + ".exp_avg", state->exp_avg());
    tensors.emplace_back("optim." + key + ".exp_avg_sq", state->exp_avg_sq());
    tensors.emplace_back("optim." + key + ".step", at::scalar_tensor(state->step(), at::kLong));
  }
  return tensors;
}

std::vector<FlatSlice> detail::owned_slices(const std::string& strategy, int rank, int world,
                                            const TpState* tp, int dp_rank, int dp_size,
                                            const NamedTensors& tensors) {
  TORCH_CHECK(strategy == "none" || strategy == "ddp", "checkpoints of parallel.strategy = \"",
              strategy, "\" are not implemented");
  std::vector<FlatSlice> slices;
  for (const auto& [name, tensor] : tensors) {
    const bool split = tp && tp->layout_of(name);
    const ShardRange range =
        shard_range(tensor.numel(), split ? dp_size : world, split ? dp_rank : rank);
    if (range.numel == 0) continue;
    const FlatSlice local{name, range.offset,
                          tensor.detach().reshape({-1}).narrow(0, range.offset, range.numel)};
    for (auto& slice : detail::whole_slices(tp, local)) slices.push_back(std::move(slice));
  }
  return slices;
}

std::string Trainer::save_checkpoint() {
  detail::TelemetryScope telemetry(telemetry_);
  detail::TraceSpan span("checkpoint save", "checkpoint");
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(step_));
  std::vector<TensorSpec> specs;
  std::vector<FlatSlice> slices;
  std::vector<std::function<at::Tensor()>> fetchers;
  if (fsdp_ && !nvme_.empty()) {
    // Optimizer state (and parameter shards) in files: streamed unit by unit.
    streamed_slices(specs, slices, fetchers);
  } else if (fsdp_) {
    // Parameter shards kept in files: in memory until the save is done (not the gradients).
    fsdp_->load_shards(-1, /*gradients=*/false);
    sharded_slices(specs, slices);
  } else if (pipeline_) {
    pipeline_slices(specs, slices);
  } else {
    const NamedTensors tensors = detail::logical_tensors(model_, *optimizer_);
    const detail::TpState* tp = model_->tensor_parallel().get();
    for (const auto& [tensor_name, tensor] : tensors) {
      specs.push_back({tensor_name, detail::whole_shape(tp, tensor_name, tensor.sizes()),
                       tensor.scalar_type()});
    }
    slices = detail::owned_slices(config_.strategy, rank(), world_size(), tp, dp_rank(), dp_size(),
                                  tensors);
  }
  const nlohmann::json training = {
      {"step", step_},
      {"samples", samples_},
      {"global_batch", loader_->global_batch_size()},
      {"loss_scale", scaler_.scale()},
      {"loss_scale_good_steps", scaler_.good_steps()},
      {"loss_scale_skipped", scaler_.skipped_steps()},
      {"schedule",
       {{"lr", schedule_.lr},
        {"min_lr", schedule_.min_lr},
        {"warmup", schedule_.warmup},
        {"steps", schedule_.total_steps},
        {"kind", schedule_.kind}}},
      {"tokenizer", tokenizer_->name()},
      // What `shardtrain generate` reads the checkpoint with.
      {"tokenizer_path", detail::tokenizer_path(config_)},
      {"chat_template",
       chat_template_ && config_.format == "chat" ? chat_template_->origin() : std::string()},
      {"format", config_.format}};
  nlohmann::json metadata = {{"model", detail::describe_model(config_.model)},
                             {"training", training}};
  if (config_.lora_rank > 0) {
    // What export needs to rebuild the adapted model: the adapters' settings and the base.
    metadata["lora"] = {{"rank", config_.lora_rank},
                        {"alpha", config_.lora_alpha},
                        {"dropout", config_.lora_dropout},
                        {"target_modules", config_.lora_target_modules},
                        {"base_dtype", config_.lora_base_dtype},
                        {"init_from", config_.init_from},
                        {"seed", config_.seed}};
  }
  auto options = ShardedSaveOptions()
                     .strategy(config_.strategy)
                     .keep(static_cast<int>(config_.keep_checkpoints))
                     .metadata(metadata.dump())
                     .rank_state({{"rng.cpu", at::detail::getDefaultCPUGenerator().get_state()}});
  if (!fetchers.empty()) {
    options.fetch([&](size_t i) { return fetchers[i] ? fetchers[i]() : slices[i].data; });
  }
  // Fault injection for tests: the process dies with every rank file written but nothing
  // committed, as a machine failing mid-save would.
  const char* kill_at = std::getenv("SHARDTRAIN_FAULT_KILL_BEFORE_COMMIT");
  if (kill_at && std::string(kill_at) == name) options.before_commit([] { std::raise(SIGKILL); });
  const std::string dir = save_sharded_checkpoint(config_.dir + "/checkpoints", name, specs, slices,
                                                  world_.get(), options);
  if (fsdp_) fsdp_->store_shards();
  return dir;
}

void Trainer::model_specs(std::vector<TensorSpec>& specs, std::vector<FlatSlice>& slices,
                          bool has_state) {
  if (pipeline_) {
    pipeline_specs(specs, has_state);  // a stage's model holds no buffers
    return;
  }
  const auto trained = trained_parameters(model_);
  const detail::TpState* tp = model_->tensor_parallel().get();
  for (const auto& [name, value] : trained) {
    specs.push_back({name, detail::whole_shape(tp, name, value.sizes()), at::kFloat});
  }
  for (const auto& item : model_->named_buffers()) {
    specs.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
    if (rank() == 0) slices.push_back({item.key(), 0, item.value().detach().reshape({-1})});
  }
  if (!has_state) return;
  for (const auto& [name, value] : trained) {
    const std::string prefix = "optim." + name;
    specs.push_back(
        {prefix + ".exp_avg", detail::whole_shape(tp, name, value.sizes()), at::kFloat});
    specs.push_back(
        {prefix + ".exp_avg_sq", detail::whole_shape(tp, name, value.sizes()), at::kFloat});
    specs.push_back({prefix + ".step", {}, at::kLong});
  }
}

void Trainer::sharded_slices(std::vector<TensorSpec>& specs, std::vector<FlatSlice>& slices) {
  // The same logical tensors as the replicated strategies write (fp32 parameters, AdamW state
  // whole), as the pieces of them this rank's shards hold. Ranks of other replicas hold the
  // same pieces and write nothing.
  const auto& segments = fsdp_->segments();
  bool has_state = false;
  for (const auto& s : segments) has_state = has_state || adam_state(*optimizer_, s.param);
  has_state = detail::on_any_rank(*world_, has_state);
  model_specs(specs, slices, has_state);
  if (!fsdp_->holds_unique_shards()) return;
  // Split by tensor parallelism, a rank writes its slices as ranges of the whole tensor; what
  // is replicated across the group is written by the group's first rank.
  const detail::TpState* tp = model_->tensor_parallel().get();
  auto add = [&](const FlatSlice& local) {
    for (auto& slice : detail::whole_slices(tp, local)) slices.push_back(std::move(slice));
  };
  for (const auto& s : segments) {
    const bool split = tp && tp->layout_of(s.name);
    if (tp && !split && tp->rank() != 0) continue;
    if (detail::is_tied_head_copy(*model_, s.name)) continue;  // the first stage writes it
    add({s.name, s.offset, s.param.detach()});
    if (!has_state) continue;
    const auto* state = adam_state(*optimizer_, s.param);
    TORCH_CHECK(state, "checkpoint: no AdamW state for a piece of ", s.name);
    add({"optim." + s.name + ".exp_avg", s.offset, state->exp_avg()});
    add({"optim." + s.name + ".exp_avg_sq", s.offset, state->exp_avg_sq()});
    // The scalar step belongs to whichever rank holds the parameter's first element.
    if (s.offset == 0 && (!tp || tp->rank() == 0)) {
      slices.push_back({"optim." + s.name + ".step", 0,
                        at::scalar_tensor(state->step(), at::kLong).reshape({1})});
    }
  }
}

void Trainer::streamed_slices(std::vector<TensorSpec>& specs, std::vector<FlatSlice>& slices,
                              std::vector<std::function<at::Tensor()>>& fetchers) {
  // The same tensors as sharded_slices(), with ZeRO-Infinity's state in files: each slice is
  // fetched as it is written, and only the unit being written is in memory (its master shard
  // and its two moments, read from their files), never the whole shard of the model.
  const bool has_state = nvme_steps_ > 0;  // the same on every rank
  model_specs(specs, slices, has_state);
  if (!fsdp_->holds_unique_shards()) return;
  fetchers.resize(slices.size());  // the buffers' slices: written as they are
  struct Loaded {
    int unit = -1;
    at::Tensor exp_avg, exp_avg_sq;
  };
  auto loaded = std::make_shared<Loaded>();
  FullyShardedDataParallel* fsdp = fsdp_.get();
  auto& nvme = nvme_;
  auto bring = [loaded, fsdp, &nvme, has_state](int unit) {
    if (loaded->unit == unit) return;
    if (loaded->unit >= 0) fsdp->store_shards(loaded->unit);
    *loaded = Loaded();
    fsdp->load_shards(unit, /*gradients=*/false);
    loaded->unit = unit;
    if (has_state) {
      loaded->exp_avg = nvme[unit]->exp_avg();
      loaded->exp_avg_sq = nvme[unit]->exp_avg_sq();
    }
  };
  // Describes a slice of `numel` fp32 elements without memory.
  auto described = [](int64_t numel) {
    at::Tensor t = at::empty({numel}, at::kFloat);
    detail::release_storage(t);
    return t;
  };
  for (const auto& s : fsdp_->segments()) {
    const int64_t numel = s.param.numel();
    const at::Tensor param = s.param.detach();
    slices.push_back({s.name, s.offset, described(numel)});
    fetchers.push_back([bring, param, unit = s.unit] {
      bring(unit);
      return param.clone();
    });
    if (!has_state) continue;
    for (const bool second : {false, true}) {
      slices.push_back(
          {"optim." + s.name + (second ? ".exp_avg_sq" : ".exp_avg"), s.offset, described(numel)});
      fetchers.push_back([bring, loaded, second, unit = s.unit, at = s.shard_offset, numel] {
        bring(unit);
        return (second ? loaded->exp_avg_sq : loaded->exp_avg).narrow(0, at, numel).clone();
      });
    }
    if (s.offset == 0) {
      slices.push_back(
          {"optim." + s.name + ".step", 0, at::scalar_tensor(nvme_steps_, at::kLong).reshape({1})});
      fetchers.emplace_back();
    }
  }
  // The last unit goes back to its file when the save is done (save_checkpoint stores all).
}

void Trainer::restore_sharded(const ShardedCheckpointReader& reader) {
  // Each rank reads only the ranges its shards hold.
  torch::NoGradGuard no_grad;
  if (!nvme_.empty()) {
    restore_streamed(reader);
  } else {
    fsdp_->load_shards(-1, /*gradients=*/false);  // after_optimizer_step writes them back
    const detail::TpState* tp = model_->tensor_parallel().get();
    for (const auto& s : fsdp_->segments()) {
      detail::read_local_into(reader, tp, s.name, s.offset, s.param.detach());
      const std::string prefix = "optim." + s.name;
      if (!reader.find(prefix + ".exp_avg")) continue;
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->exp_avg(at::zeros({s.param.numel()}, at::kFloat));
      state->exp_avg_sq(at::zeros({s.param.numel()}, at::kFloat));
      detail::read_local_into(reader, tp, prefix + ".exp_avg", s.offset, state->exp_avg());
      detail::read_local_into(reader, tp, prefix + ".exp_avg_sq", s.offset, state->exp_avg_sq());
      state->step(reader.read(prefix + ".step").item<int64_t>());
      optimizer_->state()[detail::optimizer_state_key(s.param)] = std::move(state);
    }
  }
  for (const auto& item : model_->named_buffers()) item.value().copy_(reader.read(item.key()));
  fsdp_->after_optimizer_step();
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
  // What the checkpoint must hold: the trained parameters as fp32 tensors of their whole shapes
  // (under FSDP/ZeRO the module's tensors are views of gathered buffers, perhaps freed, perhaps
  // bf16; under tensor parallelism slices), compared on meta tensors, and the buffers. Without
  // FSDP/ZeRO the module's tensors are also what is read into.
  NamedTensors model_tensors, expected;
  const detail::TpState* tp = model_->tensor_parallel().get();
  const auto meta = at::TensorOptions(at::kFloat).device(at::kMeta);
  for (const auto& [name, value] : trained_parameters(model_)) {
    model_tensors.emplace_back(name, value);
    expected.emplace_back(name, at::empty(detail::whole_shape(tp, name, value.sizes()), meta));
  }
  for (const auto& item : model_->named_buffers()) {
    model_tensors.emplace_back(item.key(), item.value());
    expected.emplace_back(item.key(), item.value());
  }
  check_model_tensors(reader, expected, /*whole=*/!pipeline_);
  if (fsdp_) {
    restore_sharded(reader);
  } else {
    restore_replicated(reader, model_tensors);
  }
  restore_training_state(reader, dir);
}

void Trainer::restore_replicated(const ShardedCheckpointReader& reader,
                                 const NamedTensors& model_tensors) {
  // AdamW state is created for the parameters the checkpoint has state for, then filled.
  NamedTensors targets = model_tensors;
  std::vector<std::pair<at::Tensor, at::Tensor>> steps;  // parameter, its step read back
  for (const auto& [name, value] : trained_parameters(model_)) {
    const std::string prefix = "optim." + name;
    if (!reader.find(prefix + ".exp_avg")) continue;
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->exp_avg(at::zeros_like(value));
    state->exp_avg_sq(at::zeros_like(value));
    at::Tensor step = at::zeros({}, at::kLong);
    targets.emplace_back(prefix + ".exp_avg", state->exp_avg());
    targets.emplace_back(prefix + ".exp_avg_sq", state->exp_avg_sq());
    targets.emplace_back(prefix + ".step", step);
    steps.emplace_back(value, step);
    optimizer_->state()[detail::optimizer_state_key(value)] = std::move(state);
  }
  restore_tensors(config_.strategy, reader, model_->tensor_parallel().get(), targets);
  for (const auto& [param, step] : steps) {
    auto* state = static_cast<torch::optim::AdamWParamState*>(
        optimizer_->state().at(detail::optimizer_state_key(param)).get());
    state->step(step.item<int64_t>());
  }
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
  try {
    step_ = training.at("step").get<int64_t>();
    samples_ = training.at("samples").get<int64_t>();
    scaler_.restore(training.at("loss_scale").get<double>(),
                    training.at("loss_scale_good_steps").get<int64_t>(),
                    training.at("loss_scale_skipped").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument("checkpoint '" + dir + "': training state is incomplete (" +
                                e.what() + ")");
  }

  if (rank() == 0) drop_metrics_after(fs::path(config_.dir) / "metrics.jsonl", step_);
  barrier();  // nobody appends before rank 0 has rewritten the file
  if (rank() == 0) {
    std::printf("resumed from %s at step %lld (saved by %s on %d rank%s)\n", dir.c_str(),
                static_cast<long long>(step_), reader.strategy().c_str(), reader.world_size(),
                reader.world_size() == 1 ? "" : "s");
  }
}

void Trainer::write_metrics(const StepResult& result, double eval_loss) {
  std::vector<at::Tensor> grads, optim_state;
  for (const auto& p : parameters()) {
    grads.push_back(p.grad());
    if (const auto* state = adam_state(*optimizer_, p)) {
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
                          {{"params", bytes_of(parameters())},
                           {"grads", bytes_of(grads)},
                           {"optim", bytes_of(optim_state)},
                           {"activations_peak", result.activations_peak},
                           {"peak_rss", peak_rss_}}}};
  if (fsdp_) {
    // Shards as allocated (with padding) plus whole parameters that stay gathered (ZeRO-1/2),
    // and the full parameters gathered at the step's peak.
    const FSDPMemory m = fsdp_->memory();
    line["mem"]["params"] = m.param_shards + m.resident_full;
    line["mem"]["grads"] = m.grad_shards;
    line["mem"]["gathered_peak"] = m.gathered_peak;
    if (fsdp_->shards_on_file()) line["mem"]["params_on_file"] = m.param_shards_on_file;
    if (m.grad_shards_on_file > 0) line["mem"]["grads_on_file"] = m.grad_shards_on_file;
  }
  if (world_size() > 1) {
    line["comm"] = {{"seconds", result.comm_s},
                    {"exposed_seconds", result.comm_exposed_s},
                    {"bytes", result.comm_bytes}};
    if (config_.tp > 1) {
      line["comm"]["tp_seconds"] = result.comm_tp_s;
      line["comm"]["tp_bytes"] = result.comm_tp_bytes;
    }
  }
  if (pipeline_) {
    // When this rank's forwards and backwards ran within the step: its share of the bubble.
    const PipelineTimeline& timeline = pipeline_->last_timeline();
    line["pipeline"] = {{"stage_rank", pp_rank()},
                        {"busy_s", timeline.step_seconds * (1.0 - timeline.idle_fraction())},
                        {"span_s", timeline.step_seconds},
                        {"idle_fraction", timeline.idle_fraction()}};
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
  std::ofstream out(fs::path(config_.dir) / "metrics.jsonl", std::ios::app);
  out << line.dump() << "\n";
}

}  // namespace shardtrain
