// The collectives of tensor and sequence parallelism as autograd functions: each forward's
// backward is its dual (Megatron-LM's f and g; all-gather and reduce-scatter along the sequence
// for sequence parallelism), and the vocabulary-parallel cross-entropy.
#include <torch/autograd.h>

#include <chrono>
#include <cstdint>

#include "model/chunked_loss.h"
#include "parallel/autograd_group.h"
#include "shardtrain/tensor_parallel.h"
#include "trace/telemetry.h"

namespace shardtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Runs one blocking collective of `bytes`, counted as tensor-parallel communication of the
// calling thread's telemetry (metrics.jsonl's comm.tp_seconds).
template <typename Run>
void timed(int64_t bytes, Run run) {
  const auto start = detail::Telemetry::Clock::now();
  run();
  if (const auto& telemetry = detail::current_telemetry()) {
    telemetry->add_tensor_parallel(
        std::chrono::duration<double>(detail::Telemetry::Clock::now() - start).count(), bytes);
  }
}

int64_t bytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.nbytes()); }

at::Tensor all_reduced(const at::Tensor& x, ProcessGroup& group) {
  at::Tensor out = x.contiguous().clone();
  timed(bytes_of(out), [&] { group.all_reduce(out)->wait(); });
  return out;
}

// Every rank's `x` joined along `dim`. The collectives cut flat tensors into rank-ordered
// blocks, so `dim` goes first while the data travels.
at::Tensor gathered_along(const at::Tensor& x, int64_t dim, ProcessGroup& group) {
  const at::Tensor dim_first = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> shape = dim_first.sizes().vec();
  shape[0] *= group.size();
  at::Tensor out = at::empty(shape, dim_first.options());
  timed(bytes_of(out), [&] { group.all_gather(dim_first.view({-1}), out.view({-1}))->wait(); });
  return out.movedim(0, dim);
}

// The sequence is dim 1 of [B, T, ...].
at::Tensor sequence_gathered(const at::Tensor& x, ProcessGroup& group) {
  return gathered_along(x, 1, group);
}

at::Tensor sequence_reduce_scattered(const at::Tensor& x, ProcessGroup& group) {
  const at::Tensor seq_first = x.transpose(0, 1).contiguous();
  std::vector<int64_t> shape = seq_first.sizes().vec();
  TORCH_CHECK(shape[0] % group.size() == 0, "sequence length ", shape[0],
              " does not divide by the tensor-parallel size ", group.size());
  shape[0] /= group.size();
  at::Tensor out = at::empty(shape, seq_first.options());
  timed(bytes_of(seq_first),
        [&] { group.reduce_scatter(seq_first.view({-1}), out.view({-1}))->wait(); });
  return out.transpose(0, 1);
}

class CopyToParallel : public torch::autograd::Function<CopyToParallel> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], detail::saved_group(ctx)), at::Tensor()};
  }
};

class ReduceFromParallel : public torch::autograd::Function<ReduceFromParallel> {
 public:
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, int64_t group) {
    return all_reduced(x, *reinterpret_cast<ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

class GatherSequence : public torch::autograd::Function<GatherSequence> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return sequence_gathered(x, *reinterpret_cast<ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {sequence_reduce_scattered(grads[0], detail::saved_group(ctx)), at::Tensor()};
  }
};

class ReduceScatterSequence : public torch::autograd::Function<ReduceScatterSequence> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return sequence_reduce_scattered(x, *reinterpret_cast<ProcessGroup*>(group));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {sequence_gathered(grads[0], detail::saved_group(ctx)), at::Tensor()};
  }
};

// loss = mean_i(log sum_v exp(z_iv) - z_i,target), with the maximum, the sum of exponentials
// and the target logit each reduced across the vocabulary slices. Saves only this rank's
// softmax slice for backward: d loss / d z_iv = (softmax_iv - [v == target_i]) / N.
class VocabParallelCrossEntropy : public torch::autograd::Function<VocabParallelCrossEntropy> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, int64_t group_handle, double divisor) {
    ProcessGroup& group = *reinterpret_cast<ProcessGroup*>(group_handle);
    detail::VocabularyReductions reduce;
    reduce.max = [&group](at::Tensor& x) { all_reduce_tensor_parallel(x, group, ReduceOp::kMax); };
    reduce.sum = [&group](at::Tensor& x) { all_reduce_tensor_parallel(x, group, ReduceOp::kSum); };
    // The shifted logits, then their softmax. An ignored target (-100) lies in no rank's slice,
    // so its target logit adds 0.
    at::Tensor softmax = logits.clone();
    const detail::SoftmaxRows rows = detail::softmax_rows(
        softmax, targets, static_cast<int64_t>(group.rank()) * logits.size(1), reduce);
    const at::Tensor& per_token = rows.per_token;
    at::Tensor loss, kept;
    if (divisor > 0) {
      kept = (targets != kIgnoreIndex).to(per_token.scalar_type());
      loss = (per_token * kept).sum() / divisor;
    } else {
      loss = per_token.mean();
    }
    softmax.div_(rows.sum_exp.unsqueeze(1));
    ctx->save_for_backward({softmax, rows.index, rows.mine, kept});
    ctx->saved_data["divisor"] = divisor;
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // The softmax becomes the gradient in place: no second [N, V/size] tensor, so this graph
    // can go backward once only (no training step needs more).
    TORCH_CHECK(!ctx->saved_data.count("used"),
                "vocab_parallel_cross_entropy: backward through the same graph a second time");
    ctx->saved_data["used"] = true;
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0];
    const at::Tensor& index = saved[1];
    const at::Tensor& mine = saved[2];
    grad.scatter_add_(1, index, -mine.unsqueeze(1));
    const double divisor = ctx->saved_data["divisor"].toDouble();
    if (divisor > 0) {
      // d loss / d z_iv = kept_i (softmax_iv - [v == target_i]) / divisor
      grad.mul_(saved[3].unsqueeze(1));
      grad.mul_(grads[0] / divisor);
    } else {
      grad.mul_(grads[0] / static_cast<double>(grad.size(0)));
    }
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tensor_parallel(const at::Tensor& x, ProcessGroup& group) {
  return CopyToParallel::apply(x, detail::group_handle(group));
}

at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, ProcessGroup& group) {
  return ReduceFromParallel::apply(x, detail::group_handle(group));
}

at::Tensor gather_sequence(const at::Tensor& x, ProcessGroup& group) {
  return GatherSequence::apply(x, detail::group_handle(group));
}

at::Tensor reduce_scatter_sequence(const at::Tensor& x, ProcessGroup& group) {
  return ReduceScatterSequence::apply(x, detail::group_handle(group));
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& targets,
                                        ProcessGroup& group, double divisor) {
  TORCH_CHECK(
      local_logits.dim() == 2 && targets.dim() == 1 && local_logits.size(0) == targets.size(0),
      "vocab_parallel_cross_entropy: expected logits [N, V/size] and targets [N], got ",
      local_logits.sizes(), " and ", targets.sizes());
  return VocabParallelCrossEntropy::apply(local_logits, targets, detail::group_handle(group),
                                          divisor);
}

void all_reduce_tensor_parallel(at::Tensor& x, ProcessGroup& group, ReduceOp op) {
  timed(bytes_of(x), [&] { group.all_reduce(x, op)->wait(); });
}

at::Tensor gather_vocabulary(const at::Tensor& local_logits, ProcessGroup& group) {
  at::NoGradGuard no_grad;
  return gathered_along(local_logits, local_logits.dim() - 1, group);
}

}  // namespace shardtrain
