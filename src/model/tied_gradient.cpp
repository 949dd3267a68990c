#include "model/tied_gradient.h"

#include <torch/autograd.h>

namespace shardtrain::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class LookupIntoSink : public torch::autograd::Function<LookupIntoSink> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& ids,
                            int64_t sink_handle) {
    ctx->saved_data["ids"] = ids;
    ctx->saved_data["sink"] = sink_handle;
    return at::embedding(weight, ids);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto* sink = reinterpret_cast<const TiedGradientSink*>(ctx->saved_data["sink"].toInt());
    const at::Tensor ids = ctx->saved_data["ids"].toTensor();
    const at::Tensor& grad = grads[0];
    sink->lookup(ids.reshape({-1}), grad.reshape({-1, grad.size(-1)}));
    return {at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor embedding_into_sink(const at::Tensor& weight, const at::Tensor& ids,
                               const TiedGradientSink& sink) {
  return LookupIntoSink::apply(weight, ids, reinterpret_cast<int64_t>(&sink));
}

}  // namespace shardtrain::detail
