// What a model whose sequences are split across ranks asks of the group they are split across.
// The model knows no parallelism: context parallelism (src/parallel/context/) implements this
// and hands it to the model (Transformer::set_context_split); attention calls it for the keys
// and values the other ranks hold.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "model/blockwise_attention.h"

namespace shardtrain::detail {

class ContextSplit {
 public:
  virtual ~ContextSplit() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Attention of this rank's queries over the whole sequence: q [B, H, Tl, D] and k, v
  // [B, Hkv, Tl, D] of this rank's chunks, `local` their positions (and segments), and for
  // packed samples `all_segments` [size, B, Tl], every rank's (gather). Collective over the group.
  virtual at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const AttentionMask& local,
                               const at::Tensor& all_segments) const = 0;
  // Every rank's x, stacked in rank order. Collective.
  virtual at::Tensor gather(const at::Tensor& x) const = 0;
  // The mean of `value` over the group. Collective.
  virtual double mean(double value) const = 0;

  // Whether the forward in progress runs on this rank's chunks: set while a batch's loss is
  // taken (ContextScope); generation runs on whole sequences.
  bool active = false;
};

// The positions in a sequence of `length` tokens that `rank` of `size` holds: chunks `rank` and
// 2 size - 1 - rank of 2 size equal chunks, so that under causal attention every rank has as
// much work (the early chunk reads few keys, the late one many). [length / size] int64.
at::Tensor context_positions(int64_t length, int rank, int size);

}  // namespace shardtrain::detail
