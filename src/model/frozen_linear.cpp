// Linear layers over frozen weights stored in another dtype than the activations.
#include <torch/csrc/autograd/custom_function.h>

#include "model/init.h"
#include "model/layers.h"
#include "model/names.h"
#include "model/nf4.h"

namespace shardtrain::detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class FrozenLinearFunction : public torch::autograd::Function<FrozenLinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, std::vector<int64_t> nf4_shape) {
    // The stored weight is saved, not its cast: backward casts again.
    ctx->save_for_backward({weight});
    ctx->saved_data["nf4_shape"] = nf4_shape;
    const at::Tensor w = unpacked(weight, nf4_shape, x.scalar_type());
    return at::linear(x, w, bias.numel() > 0 ? bias.to(x.scalar_type()) : at::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const at::Tensor weight = ctx->get_saved_variables()[0];
    const std::vector<int64_t> nf4_shape = ctx->saved_data["nf4_shape"].toIntVector();
    const at::Tensor& grad = grad_outputs[0];
    return {at::matmul(grad, unpacked(weight, nf4_shape, grad.scalar_type())), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }

 private:
  // The weight in `dtype`, for one product. On the CPU it is written into a buffer of this
  // thread's that every frozen layer reuses: a temporary per layer would leave holes of the
  // layers' sizes in the heap between the activations forward keeps, and the process would grow
  // by about what the stored dtype saves. Safe because no caller keeps the result past the
  // product it is computed for.
  static at::Tensor unpacked(const at::Tensor& weight, const std::vector<int64_t>& nf4_shape,
                             at::ScalarType dtype) {
    if (!weight.is_cpu()) return stored_weight_values(weight, nf4_shape, dtype);
    const std::vector<int64_t> shape = nf4_shape.empty() ? weight.sizes().vec() : nf4_shape;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    thread_local at::Tensor buffer;
    if (!buffer.defined() || buffer.numel() < numel || buffer.scalar_type() != dtype) {
      buffer = at::Tensor();  // the old one goes first
      buffer = at::empty({numel}, at::TensorOptions().dtype(dtype));
    }
    at::Tensor w = buffer.narrow(0, 0, numel).view(shape);
    if (nf4_shape.empty()) {
      w.copy_(weight);
    } else if (dtype == at::kFloat) {
      nf4_dequantize_into(nf4_unpack(weight, shape), w);
    } else {
      w.copy_(nf4_dequantize(nf4_unpack(weight, shape), at::kFloat));
    }
    return w;
  }
};

}  // namespace

at::Tensor stored_weight_values(const at::Tensor& weight, at::IntArrayRef nf4_shape,
                                at::ScalarType dtype) {
  if (nf4_shape.empty()) return weight.detach().to(dtype);
  return nf4_dequantize(nf4_unpack(weight.detach(), nf4_shape), dtype);
}

at::Tensor frozen_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         at::IntArrayRef nf4_shape) {
  // An autograd function takes no undefined tensor: a layer without bias passes an empty one.
  return FrozenLinearFunction::apply(x, weight, bias.defined() ? bias : at::empty({0}, x.options()),
                                     nf4_shape.vec());
}

void store_frozen_linears(torch::nn::Module& model, const std::string& storage) {
  const bool nf4 = storage == "nf4";
  if (!nf4 && storage != "bf16") {
    throw std::invalid_argument("frozen weights are stored as \"bf16\" or \"nf4\", not \"" +
                                storage + "\"");
  }
  torch::NoGradGuard no_grad;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    const std::string& name = item.key();
    if (!linear || linear->weight.requires_grad() || is_output_head(name) ||
        is_adapter_layer(name)) {
      continue;
    }
    at::Tensor& w = linear->weight;
    if (!linear->nf4_shape.empty()) continue;  // stored so already
    const std::vector<int64_t> shape = w.sizes().vec();
    if (is_materialized(w)) {
      w.set_data(nf4 ? nf4_pack(nf4_quantize(w)) : w.detach().to(at::kBFloat16));
    } else {
      at::Tensor described =
          nf4 ? at::empty({nf4_packed_bytes(shape)}, w.options().dtype(at::kByte))
              : at::empty(shape, w.options().dtype(at::kBFloat16));
      release_storage(described);
      w.set_data(described);
    }
    if (nf4) linear->nf4_shape = shape;
  }
}

}  // namespace shardtrain::detail
