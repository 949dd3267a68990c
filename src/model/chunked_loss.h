// The head's cross-entropy without the whole logits: the [tokens x vocabulary] logits, their
// softmax and their gradient exist one chunk of tokens at a time.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

#include "model/layer_split.h"

namespace shardtrain::detail {

// The cross-entropy of at::linear(hidden, weight) against `targets`, `chunk` tokens at a time.
// hidden [N, D], weight [V, D] (this rank's rows of the vocabulary when `split` is given: the
// head is then column-parallel and the softmax's max and sums are reduced across the split's
// group, Megatron's vocabulary-parallel loss), targets [N] with kIgnoreIndex where no loss is
// taken. divisor > 0: the sum over the kept tokens / divisor; else their mean (as
// at::cross_entropy_loss). The logits are computed in the matmul's dtype (bf16 under autocast)
// and the softmax in fp32.
//
// When gradients are wanted, each chunk's logits gradient is formed and consumed right after
// its loss (Liger's fused linear cross-entropy): the gradients of hidden and weight are
// accumulated during the forward, and the backward scales them by the loss's gradient. So the
// head's matmuls are done once, as in the unchunked loss, and the graph goes backward once.
// Where the weight's gradient goes instead of to the weight (a tied embedding's head part,
// tied_gradient.h): `buffer` gives the zeroed fp32 tensor of the weight's shape that the chunks
// accumulate into (undefined, or no function: one of their own), and the backward hands it to
// `take`, scaled by the loss's gradient. It must outlive the graph.
struct WeightGradientSink {
  std::function<at::Tensor()> buffer;
  std::function<void(const at::Tensor&)> take;
};
at::Tensor chunked_head_loss(const at::Tensor& hidden, const at::Tensor& weight,
                             const at::Tensor& targets, double divisor, int64_t chunk,
                             const LayerSplit* split = nullptr,
                             const WeightGradientSink* weight_sink = nullptr);

// What softmax_rows leaves: each row's loss, log(sum of exponentials) - its target's logit, and
// the sum itself; where each target lies: `mine` (1 where it is one of this rank's columns, in
// the logits' dtype) and `index` ([rows, 1], its column here, clamped where it is not).
struct SoftmaxRows {
  at::Tensor per_token, sum_exp, mine, index;
};
// The reductions across the ranks that hold the other columns of the vocabulary (in place);
// empty when one rank holds all of it.
struct VocabularyReductions {
  std::function<void(at::Tensor&)> max, sum;
};

// The cross-entropy of rows of logits `p` ([rows, local]: the vocabulary's columns
// [first, first + local)) against `targets` [rows]. `p` is shifted by its row maximum and
// exponentiated in place; the maxima and then the sums of exponentials and target logits (one
// reduction for both) are reduced across `reduce`. A target outside this rank's columns
// (another rank's, or ignored) adds 0 to its logit here.
SoftmaxRows softmax_rows(at::Tensor& p, const at::Tensor& targets, int64_t first,
                         const VocabularyReductions& reduce = {});

// The tokens per chunk that keep a chunk's fp32 logits near `bytes` for a vocabulary of
// `vocab` columns on this rank: at least 1.
int64_t loss_chunk_tokens(int64_t vocab, int64_t bytes = int64_t{32} << 20);

}  // namespace shardtrain::detail
