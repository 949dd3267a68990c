// A tied embedding's gradient taken apart: the token embedding is also the head, and its
// gradient is the head's (dense, formed by the loss's backward, first) plus the lookup's (a few
// rows, formed at the very end of backward). FSDP takes the two apart so that it can reduce the
// head's while the blocks' backward runs and the lookup's as rows, without the dense
// [vocabulary x d_model] tensor (TransformerImpl::set_tied_gradient_sink).
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "model/chunked_loss.h"

namespace shardtrain::detail {

struct TiedGradientSink {
  // d loss / d weight from the head, [vocabulary, d_model] fp32, as the chunked loss's backward
  // hands it on (into a buffer the sink may give).
  WeightGradientSink head;
  // The lookup's: the ids looked up ([N], int64) and the gradient of their rows ([N, d_model]).
  std::function<void(const at::Tensor& ids, const at::Tensor& rows)> lookup;
};

// at::embedding(weight, ids), whose backward gives the rows' gradient to sink.lookup instead of
// to weight. The sink must outlive the graph.
at::Tensor embedding_into_sink(const at::Tensor& weight, const at::Tensor& ids,
                               const TiedGradientSink& sink);

}  // namespace shardtrain::detail
