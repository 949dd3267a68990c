// Linear layers over frozen weights stored in another dtype than the activations.
#include <torch/csrc/autograd/custom_function.h>

#include "model/init.h"
#include "model/layers.h"

namespace shardtrain::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FrozenLinearFunction : public torch::autograd::Function<FrozenLinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias) {
    // The stored weight is saved, not its cast: backward casts again.
    ctx->save_for_backward({weight});
    const at::Tensor w = weight.to(x.scalar_type());
    return at::linear(x, w, bias.defined() ? bias.to(x.scalar_type()) : bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor weight = ctx->get_saved_variables()[0];
    const at::Tensor& grad = grad_outputs[0];
    return {at::matmul(grad, weight.to(grad.scalar_type())), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor frozen_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return FrozenLinearFunction::apply(x, weight, bias);
}

void store_frozen_linears(torch::nn::Module& model, at::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    const std::string& name = item.key();
    const auto ends_with = [&name](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (!linear || linear->weight.requires_grad() || name == "lm_head" || ends_with(".lm_head") ||
        ends_with("lora_A") || ends_with("lora_B")) {
      continue;
    }
    at::Tensor& w = linear->weight;
    if (is_materialized(w)) {
      w.set_data(w.detach().to(dtype));
    } else {
      at::Tensor described = at::empty(w.sizes(), w.options().dtype(dtype));
      release_storage(described);
      w.set_data(described);
    }
  }
}

}  // namespace shardtrain::detail
