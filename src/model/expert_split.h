// What a mixture-of-experts layer whose experts are split across ranks asks of the group they
// are split across. The model knows no parallelism: expert parallelism (src/parallel/expert/)
// implements this and hands it to the model (Transformer::set_expert_split); each MoE layer
// sends its tokens' rows to the ranks holding their experts through it and takes the outputs
// back.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace shardtrain::detail {

class ExpertSplit {
 public:
  // What dispatch() received: `rows` grouped by this rank's experts (the first local expert's
  // rows first, each expert's in the order of the ranks that sent them), `counts` the rows of
  // each local expert, and what combine() needs to send the outputs back.
  struct Received {
    at::Tensor rows;
    std::vector<int64_t> counts;
    std::shared_ptr<void> route;
  };

  virtual ~ExpertSplit() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // `rows` [N, d]: this rank's token-to-expert assignments grouped by expert, counts[e] of them
  // for each expert e of the whole layer (n_experts entries): each goes to the rank holding its
  // expert. Collective over the group (every rank calls it, even with no rows), differentiable.
  virtual Received dispatch(const at::Tensor& rows, const std::vector<int64_t>& counts) const = 0;
  // The experts' outputs for received.rows, [received.rows.size(0), d] in the same order,
  // returned to the ranks that sent the rows: [N, d] in dispatch()'s order. Collective,
  // differentiable.
  virtual at::Tensor combine(const at::Tensor& outputs, const Received& received) const = 0;
  // In place, outside autograd: the element-wise sum across the group (the experts' share of
  // a gradient norm). Collective.
  virtual void sum_across(at::Tensor& x) const = 0;
};

}  // namespace shardtrain::detail
