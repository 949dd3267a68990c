// Tensor parallelism (Megatron-LM's split of attention and MLP, arXiv:1909.08053) with sequence
// parallelism (Korthikanti et al., arXiv:2205.05198): each rank of a tensor-parallel group holds
// a slice of every large weight and computes its part of each layer; the collectives below join
// the parts. Every function here is collective over its group: all members call it, in the same
// order, with tensors of the same shape, and it returns when the communication is done.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/dist.h"
#include "shardtrain/model.h"

namespace shardtrain {

// How parallelize_module cuts one submodule, in the spirit of torch.distributed.tensor.parallel:
//  - ColwiseParallel: a linear layer's output features (weight rows and bias) are split; the
//    input is the whole activation (gathered along the sequence under sequence parallelism),
//    the output is this rank's features. `fused_parts` > 1 splits each of that many equal
//    blocks of rows on its own (a fused q/k/v projection).
//  - RowwiseParallel: a linear layer's input features (weight columns) are split; partial
//    outputs are summed across the group (reduce-scattered along the sequence under sequence
//    parallelism), then the replicated bias is added. On an embedding, the vocabulary (weight
//    rows) is split: each rank looks up the tokens it holds, and the results are summed.
//  - SequenceParallel: a norm's replicated weights, which under sequence parallelism see only
//    this rank's part of the sequence: their gradients are summed across the group.
struct ParallelStyle {
  enum class Kind { kColwise, kRowwise, kSequenceParallel };
  Kind kind = Kind::kColwise;
  int fused_parts = 1;
};
inline ParallelStyle ColwiseParallel(int fused_parts = 1) {
  return {ParallelStyle::Kind::kColwise, fused_parts};
}
inline ParallelStyle RowwiseParallel() { return {ParallelStyle::Kind::kRowwise, 1}; }
inline ParallelStyle SequenceParallel() { return {ParallelStyle::Kind::kSequenceParallel, 1}; }

// Submodule path (dots between names; "*" matches any one name, e.g. "blocks.*.attn.qkv") to
// the style it gets. A path that matches no submodule is an error.
using TpPlan = std::vector<std::pair<std::string, ParallelStyle>>;

struct TensorParallelOptions {
  // Norms, dropout and residual additions work on 1/T of the sequence; the all-reduces of the
  // plain split become reduce-scatter + all-gather, moving the same bytes.
  TensorParallelOptions& sequence_parallel(bool value) {
    sequence_parallel_ = value;
    return *this;
  }
  bool sequence_parallel_ = false;
};

// Cuts the submodules `plan` names across `group` (collective only in that every member must
// make the same call; no communication happens here). Parameters with memory are replaced by
// this rank's slice of them; deferred ones (ModelInit().deferred()) are described at their local
// shape, and the model's initializer then fills each rank's slice with exactly the values the
// whole tensor would have held. Submodules must be the model's own layers (Transformer's linear,
// embedding and norm layers); any other type throws std::invalid_argument naming the path, as
// does a plan that is refused for any reason: nothing is cut then.
void parallelize_module(Transformer& model, std::shared_ptr<ProcessGroup> group, const TpPlan& plan,
                        const TensorParallelOptions& options = TensorParallelOptions());

// The same for a module of your own, whose forward you write: `plan` names its
// torch::nn::Linear submodules. ColwiseParallel keeps this rank's rows of the weight (and of the
// bias); RowwiseParallel this rank's columns, and needs a layer without bias (a bias would be
// added on every rank before the sum: add it after reduce_from_tensor_parallel). The values are
// the slices of the module's current weights, so every rank must build it with the same ones.
// The forward must call the collectives below where the split needs them (docs/tp.md shows an
// MLP). Other submodule types, or a path that matches nothing, throw std::invalid_argument.
void parallelize_module(torch::nn::Module& module, const std::shared_ptr<ProcessGroup>& group,
                        const TpPlan& plan);

// The plan for the GPT-2 and Llama families: attention split by heads (q/k/v column-parallel,
// the output projection row-parallel), the MLP column- then row-parallel (gated too),
// vocabulary-parallel embedding and head, norms sequence-parallel. Throws std::invalid_argument
// when heads, key/value heads, the FFN width or the vocabulary do not divide by `tp`, naming
// which, and for the BERT family, which has no plan in this version.
TpPlan transformer_tp_plan(const ModelConfig& config, int tp);

// Every parameter of a split model as the whole tensor (split ones gathered from the group,
// replicated ones copied), by name, in the model's parameter order. Collective over the group.
std::vector<std::pair<std::string, at::Tensor>> whole_parameters(Transformer& model);

// The gradient norm of the whole model over the group (a split parameter counts all its
// slices, a replicated one once), over the experts every rank of an expert-parallel group
// holds (Transformer::expert_split) and, given `pipeline` (the mesh's pp group), over every
// pipeline stage (a tied embedding once); the gradients scaled to `max_norm` when it is above it
// (0: never), as clip_grad_norm (optim.h) does for one process. Collective over those groups;
// with none, the same as clip_grad_norm of the model's parameters.
double clip_grad_norm(Transformer& model, double max_norm, ProcessGroup* pipeline = nullptr);

// The building blocks, each differentiable (its backward is the matching collective):
// identity forward, all-reduce of the gradient (Megatron's f).
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, ProcessGroup& group);
// all-reduce forward, identity backward (Megatron's g).
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, ProcessGroup& group);
// [B, T/size, ...] -> [B, T, ...]: all-gather along dim 1; backward reduce-scatters.
at::Tensor gather_sequence(const at::Tensor& x, ProcessGroup& group);
// [B, T, ...] partial sums -> [B, T/size, ...]: reduce-scatter along dim 1; backward gathers.
at::Tensor reduce_scatter_sequence(const at::Tensor& x, ProcessGroup& group);

// Mean cross-entropy of `local_logits` [N, V/size] (this rank's slice of the vocabulary, in
// rank order) against `targets` [N] (ids in the whole vocabulary), without ever holding the
// whole [N, V] logits: the maximum, the sum of exponentials and the target's logit are reduced
// across the group instead. Equals at::cross_entropy_loss of the gathered logits.
// With `divisor` > 0, targets equal to -100 (the ignore index) carry no loss and the result is
// the sum over the others divided by `divisor` (at::cross_entropy_loss with reduction sum and
// ignore_index -100, over `divisor`).
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets,
                                        ProcessGroup& group, double divisor = 0.0);

// The whole [..., V] from every rank's [..., V/size] (no gradient): for sampling.
at::Tensor gather_vocabulary(const at::Tensor& local_logits, ProcessGroup& group);
// `x` reduced in place across `group` (no autograd), counted as tensor-parallel communication.
void all_reduce_tensor_parallel(at::Tensor& x, ProcessGroup& group, ReduceOp op);

}  // namespace shardtrain
