// The trainer's checkpoints (model, optimizer, data position, RNG, loss scale) and metrics.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardtrain/checkpoint.h"
#include "shardtrain/train.h"
#include "train/run_setup.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

std::string state_key(const at::Tensor& parameter) {
  return detail::optimizer_state_key(parameter);
}

// AdamW's state of one parameter, or null before its first step.
const torch::optim::AdamWParamState* adam_state(const torch::optim::AdamW& optimizer,
                                                const at::Tensor& parameter) {
  auto it = optimizer.state().find(state_key(parameter));
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

nlohmann::json describe_model(const ModelConfig& m) {
  return {{"family", to_string(m.family)},
          {"vocab_size", m.vocab_size},
          {"context_length", m.context_length},
          {"d_model", m.d_model},
          {"n_layers", m.n_layers},
          {"n_heads", m.n_heads},
          {"n_kv_heads", m.n_kv_heads},
          {"ffn_hidden", m.ffn_hidden},
          {"tie_embeddings", m.tie_embeddings}};
}

int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t total = 0;
  for (const auto& t : tensors) {
    if (t.defined()) total += static_cast<int64_t>(t.nbytes());
  }
  return total;
}

}  // namespace

std::string Trainer::save_checkpoint() {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%06lld", static_cast<long long>(step_));
  NamedTensors params, optim;
  int64_t optimizer_step = 0;
  if (!nvme_.empty()) nvme_state_to_optimizer();
  if (fsdp_) {
    // Collective: every rank gathers the full tensors of the shards.
    const auto& segments = fsdp_->segments();
    auto moment = [&](bool second) {
      return [&, second](size_t i) {
        const auto* state = adam_state(*optimizer_, segments[i].param);
        if (!state) return at::Tensor();
        optimizer_step = state->step();
        return second ? state->exp_avg_sq() : state->exp_avg();
      };
    };
    params = fsdp_->full_parameters();
    const auto avg = fsdp_->full_state(moment(false));
    const auto avg_sq = fsdp_->full_state(moment(true));
    // A rank whose shards hold no element of a tensor has no state for it: the step is the
    // same everywhere, so take the largest.
    at::Tensor steps = at::tensor(static_cast<double>(optimizer_step), at::kDouble);
    world_->all_reduce(steps, ReduceOp::kMax)->wait();
    optimizer_step = static_cast<int64_t>(steps.item<double>());
    if (optimizer_step > 0) {
      for (size_t i = 0; i < avg.size(); ++i) {
        optim.emplace_back(avg[i].first + ".exp_avg", avg[i].second);
        optim.emplace_back(avg_sq[i].first + ".exp_avg_sq", avg_sq[i].second);
      }
    }
    if (!nvme_.empty()) nvme_state_from_optimizer();
  }
  // Replicated strategies hold the same state on every rank: rank 0 writes it alone.
  if (rank() != 0) {
    barrier();
    return config_.dir + "/checkpoints/" + name;
  }
  CheckpointWriter writer(config_.dir + "/checkpoints", name,
                          static_cast<int>(config_.keep_checkpoints));
  const fs::path dir = writer.staging_dir();

  for (const auto& item : fsdp_ ? torch::OrderedDict<std::string, at::Tensor>()
                                : model_->named_parameters()) {
    params.emplace_back(item.key(), item.value());
    const auto* state = adam_state(*optimizer_, item.value());
    if (!state) continue;
    optim.emplace_back(item.key() + ".exp_avg", state->exp_avg());
    optim.emplace_back(item.key() + ".exp_avg_sq", state->exp_avg_sq());
    optimizer_step = state->step();
  }
  for (const auto& item : model_->named_buffers()) params.emplace_back(item.key(), item.value());
  save_safetensors((dir / "model.safetensors").string(), params);
  save_safetensors((dir / "optimizer.safetensors").string(), optim);
  save_safetensors((dir / "rng.safetensors").string(),
                   {{"cpu", at::detail::getDefaultCPUGenerator().get_state()}});
  const nlohmann::json state = {{"format", 1},
                                {"step", step_},
                                {"samples", samples_},
                                {"optimizer_step", optimizer_step},
                                {"loss_scale", scaler_.scale()},
                                {"loss_scale_good_steps", scaler_.good_steps()},
                                {"loss_scale_skipped", scaler_.skipped_steps()},
                                {"tokenizer", tokenizer_->name()},
                                {"model", describe_model(config_.model)}};
  std::ofstream(dir / "state.json") << state.dump(2) << "\n";
  const std::string final_dir = writer.commit();
  barrier();
  return final_dir;
}

void Trainer::load_checkpoint(const std::string& dir) {
  nlohmann::json state;
  const fs::path state_path = fs::path(dir) / "state.json";
  std::ifstream in(state_path);
  try {
    if (!in) throw std::runtime_error("missing");
    in >> state;
  } catch (const std::exception&) {
    throw std::invalid_argument("checkpoint '" + dir + "': state.json is missing or corrupt");
  }
  if (state.value("model", nlohmann::json()) != describe_model(config_.model)) {
    throw std::invalid_argument("checkpoint '" + dir + "' was written for model " +
                                state.value("model", nlohmann::json()).dump() +
                                ", not the configured " + describe_model(config_.model).dump());
  }
  const auto tensors = load_safetensors((fs::path(dir) / "model.safetensors").string());
  const auto optim = load_safetensors((fs::path(dir) / "optimizer.safetensors").string());
  const auto rng = load_safetensors((fs::path(dir) / "rng.safetensors").string());
  torch::NoGradGuard no_grad;
  auto copy_into = [&](const std::string& name, at::Tensor target) {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw std::invalid_argument("checkpoint '" + dir + "' has no tensor '" + name + "'");
    }
    if (!it->second.sizes().equals(target.sizes())) {
      throw std::invalid_argument("checkpoint '" + dir + "': tensor '" + name + "' has shape " +
                                  c10::str(it->second.sizes()) + ", the model expects " +
                                  c10::str(target.sizes()));
    }
    target.copy_(it->second);
  };
  const int64_t optimizer_step = state.at("optimizer_step").get<int64_t>();
  if (fsdp_) {
    // Each rank takes its pieces of the full tensors.
    for (const auto& segment : fsdp_->segments()) {
      auto piece = [&](const std::map<std::string, at::Tensor>& from, const std::string& name) {
        auto it = from.find(name);
        if (it == from.end()) {
          throw std::invalid_argument("checkpoint '" + dir + "' has no tensor '" + name + "'");
        }
        if (it->second.sizes().vec() != segment.shape) {
          throw std::invalid_argument("checkpoint '" + dir + "': tensor '" + name +
                                      "' has shape " + c10::str(it->second.sizes()) +
                                      ", the model expects " + c10::str(segment.shape));
        }
        return it->second.reshape({-1}).narrow(0, segment.offset, segment.param.numel());
      };
      segment.param.detach().copy_(piece(tensors, segment.name));
      if (optim.count(segment.name + ".exp_avg") == 0) continue;
      auto param_state = std::make_unique<torch::optim::AdamWParamState>();
      param_state->step(optimizer_step);
      param_state->exp_avg(piece(optim, segment.name + ".exp_avg").clone());
      param_state->exp_avg_sq(piece(optim, segment.name + ".exp_avg_sq").clone());
      optimizer_->state()[state_key(segment.param)] = std::move(param_state);
    }
    fsdp_->after_optimizer_step();
    if (!nvme_.empty()) nvme_state_from_optimizer();
  }
  for (const auto& item : fsdp_ ? torch::OrderedDict<std::string, at::Tensor>()
                                : model_->named_parameters()) {
    copy_into(item.key(), item.value());
    auto avg = optim.find(item.key() + ".exp_avg");
    auto avg_sq = optim.find(item.key() + ".exp_avg_sq");
    if (avg == optim.end() || avg_sq == optim.end()) continue;
    auto param_state = std::make_unique<torch::optim::AdamWParamState>();
    param_state->step(optimizer_step);
    param_state->exp_avg(avg->second.clone());
    param_state->exp_avg_sq(avg_sq->second.clone());
    optimizer_->state()[state_key(item.value())] = std::move(param_state);
  }
  for (const auto& item : model_->named_buffers()) copy_into(item.key(), item.value());
  // A copy of the handle shares the generator; the default one is only reachable as const.
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(rng.at("cpu"));
  }
  step_ = state.at("step").get<int64_t>();
  samples_ = state.at("samples").get<int64_t>();
  scaler_.restore(state.at("loss_scale").get<double>(),
                  state.at("loss_scale_good_steps").get<int64_t>(),
                  state.at("loss_scale_skipped").get<int64_t>());

  if (rank() == 0) drop_metrics_after(fs::path(config_.dir) / "metrics.jsonl", step_);
  barrier();  // nobody appends before rank 0 has rewritten the file
  if (rank() == 0) {
    std::printf("resumed from %s at step %lld\n", dir.c_str(), static_cast<long long>(step_));
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
    // Shards as allocated (with padding), and the full parameters gathered at the step's peak.
    const FSDPMemory m = fsdp_->memory();
    line["mem"]["params"] = m.param_shards;
    line["mem"]["grads"] = m.grad_shards;
    line["mem"]["gathered_peak"] = m.gathered_peak;
  }
  if (!std::isnan(eval_loss)) line["eval_loss"] = eval_loss;
  std::ofstream out(fs::path(config_.dir) / "metrics.jsonl", std::ios::app);
  out << line.dump() << "\n";
}

}  // namespace shardtrain
