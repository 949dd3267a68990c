// Low-rank adapters (LoRA, arXiv:2106.09685): a frozen linear layer W x + b gains a trainable
// update (alpha / rank) · B A dropout(x), with A [rank, in] and B [out, rank]. B starts at zero,
// so the adapted model computes exactly what the base model did until the first step.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace shardtrain {

struct LoraOptions {
  LoraOptions& rank(int64_t value) {
    rank_ = value;
    return *this;
  }
  // The update is scaled by alpha / rank, as in the paper and PEFT.
  LoraOptions& alpha(double value) {
    alpha_ = value;
    return *this;
  }
  // Dropout on the adapter's input only (the base layer sees x unchanged).
  LoraOptions& dropout(double value) {
    dropout_ = value;
    return *this;
  }
  // Which linear layers get adapters, as PEFT's target_modules: an entry matches a module whose
  // name is the entry or ends with "." + entry ("attn.q" matches "blocks.3.attn.q"). The single
  // entry "all-linear" matches every linear layer except the output head (lm_head).
  LoraOptions& target_modules(std::vector<std::string> value) {
    target_modules_ = std::move(value);
    return *this;
  }
  double scale() const { return alpha_ / static_cast<double>(rank_); }

  int64_t rank_ = 8;
  double alpha_ = 16.0;
  double dropout_ = 0.0;
  std::vector<std::string> target_modules_ = {"all-linear"};
};

// Adds adapters to the linear layers of `model` that options.target_modules names, and freezes
// every other parameter of `model` (requires_grad false): afterwards model.parameters() that
// require a gradient are exactly the adapters. Each adapted layer gets two submodules,
// "lora_A" and "lora_B", whose "weight" parameters are A and B (PEFT's names: a layer
// "blocks.0.attn.q" gains "blocks.0.attn.q.lora_A.weight"). Works on the reference Transformer
// (whose layers apply their adapter in forward; a deferred Transformer gets deferred adapters,
// initialized with the rest by its initializer()) and on a user's module tree of
// torch::nn::Linear layers, whose adapters are applied when the parent calls the layer through
// shardtrain::call(layer, x), since LibTorch's Linear cannot be changed. A is drawn as
// torch::nn::Linear draws its weights (uniform in +-1/sqrt(in)), B is zero.
// Call it on one process before any strategy wraps the model (DDP, FSDP, fully_shard). Returns
// the names of the adapted layers. Throws std::invalid_argument for rank <= 0, a negative alpha,
// dropout outside [0, 1), a layer that already has adapters, or a target_modules entry that
// matches no linear layer (the message names it and lists the linear layers there are); nothing
// is adapted then.
std::vector<std::string> add_lora(torch::nn::Module& model, const LoraOptions& options);

// The names of the linear layers of `model` that add_lora can adapt, in registration order.
std::vector<std::string> lora_candidate_layers(const torch::nn::Module& model);

// W + (alpha / rank) · B A: the weight a layer computes with once its adapter is merged in.
// `weight` [out, in], `a` [rank, in], `b` [out, rank], any floating dtypes; fp32 result.
at::Tensor merge_lora_weight(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b,
                             double scale);

namespace detail {
// An adapter of a torch::nn::Linear, or null: what shardtrain::call adds to its output.
struct LoraAdapter {
  at::Tensor a, b;  // the weights of the layer's lora_A and lora_B submodules
  double scale = 1.0;
  double dropout = 0.0;
};
std::shared_ptr<const LoraAdapter> lora_adapter(const torch::nn::Module& module);
// scale · B A dropout(x), in x's dtype.
at::Tensor lora_delta(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, double scale,
                      double dropout, bool training);
}  // namespace detail

}  // namespace shardtrain
