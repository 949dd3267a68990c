#include "model/fp8.h"

#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <optional>
#include <stdexcept>

#include "model/autocast.h"
#include "model/layers.h"
#include "shardtrain/dist.h"

namespace shardtrain::detail {
namespace {

// Autocast off for the scope where it is on (the products below are of values that fp32 holds
// exactly, accumulated in fp32).
class NoAutocast {
 public:
  NoAutocast() {
    AutocastState state = autocast_state();
    if (state.cpu || state.cuda) {
      state.cpu = state.cuda = false;
      scope_.emplace(state);
    }
  }

 private:
  std::optional<AutocastScope> scope_;
};

void record_amax(const at::Tensor& amax, int64_t slot, const at::Tensor& values) {
  at::Tensor entry = amax.narrow(0, slot, 1);
  entry.copy_(at::maximum(entry, values.abs().max().reshape({1})));
}

struct Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
  // x [..., in], weight [out, in]: the fp32 product of their rounded values, divided by the
  // scales. `address` is the layer's Fp8Scaling, which outlives the graph.
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, int64_t address) {
    NoAutocast no_autocast;
    auto& scaling = *reinterpret_cast<Fp8Scaling*>(address);
    const at::Tensor xf = x.to(at::kFloat), wf = weight.to(at::kFloat);
    record_amax(scaling.amax, 0, xf);
    record_amax(scaling.amax, 1, wf);
    const at::Tensor sx = scaling.scale[0].clone(), sw = scaling.scale[1].clone();
    const at::Tensor qx = round_to_fp8(xf * sx, Fp8Format::kE4M3);
    const at::Tensor qw = round_to_fp8(wf * sw, Fp8Format::kE4M3);
    ctx->save_for_backward({qx, qw, sx, sw});
    ctx->saved_data["address"] = address;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return at::matmul(qx, qw.t()).div_(sx * sw);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    NoAutocast no_autocast;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &qx = saved[0], &qw = saved[1], &sx = saved[2], &sw = saved[3];
    auto& scaling = *reinterpret_cast<Fp8Scaling*>(ctx->saved_data["address"].toInt());
    const at::Tensor g = grads[0].to(at::kFloat);
    record_amax(scaling.amax, 2, g);
    const at::Tensor sg = scaling.scale[2].clone();
    const at::Tensor qg =
        round_to_fp8(g * sg, scaling.recipe->hybrid ? Fp8Format::kE5M2 : Fp8Format::kE4M3);
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const at::Tensor dx = at::matmul(qg, qw).div_(sg * sw).to(x_dtype);
    const int64_t out = qw.size(0), in = qw.size(1);
    const at::Tensor dw =
        at::matmul(qg.reshape({-1, out}).t(), qx.reshape({-1, in})).div_(sg * sx).to(w_dtype);
    return {dx, dw, at::Tensor()};
  }
};

}  // namespace

double fp8_max(Fp8Format format) { return format == Fp8Format::kE4M3 ? 448.0 : 57344.0; }

at::Tensor round_to_fp8(const at::Tensor& x, Fp8Format format) {
  const int64_t mantissa_bits = format == Fp8Format::kE4M3 ? 3 : 2;
  const int64_t min_exponent = format == Fp8Format::kE4M3 ? -6 : -14;  // of the normal numbers
  const at::Tensor v = x.to(at::kFloat);
  const at::Tensor magnitude = v.abs();
  // magnitude = m 2^e with m in [0.5, 1): its binade starts at 2^(e - 1); below the normal
  // numbers the spacing is that of the smallest binade.
  const at::Tensor exponent = at::clamp_min(std::get<1>(at::frexp(magnitude)) - 1, min_exponent);
  // The spacing 2^(exponent - mantissa_bits), built from its fp32 bits.
  const at::Tensor spacing =
      ((exponent - mantissa_bits + 127) * (1 << 23)).to(at::kInt).view(at::kFloat);
  // Halves round to even (nearbyint); past the largest value, saturated.
  const at::Tensor rounded =
      at::clamp_max(at::round(magnitude / spacing) * spacing, fp8_max(format));
  return at::copysign(rounded, v);
}

Fp8Scaling::Fp8Scaling(std::shared_ptr<const Fp8Recipe> recipe_in) : recipe(std::move(recipe_in)) {
  if (!recipe || recipe->history < 1) {
    throw std::invalid_argument("Fp8Scaling: a recipe with a history of at least one step");
  }
  amax = at::zeros({3}, at::kFloat);
  history = at::zeros({recipe->history, 3}, at::kFloat);
  scale = at::ones({3}, at::kFloat);  // Transformer Engine's before any amax
}

void Fp8Scaling::to(const at::Device& device) {
  amax = amax.to(device);
  history = history.to(device);
  scale = scale.to(device);
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      Fp8Scaling& scaling) {
  if (scaling.amax.device() != x.device()) scaling.to(x.device());
  const AutocastState autocast = autocast_state();
  at::ScalarType dtype = x.scalar_type();
  if (autocast.cpu && x.device().is_cpu()) dtype = autocast.cpu_dtype;
  if (autocast.cuda && x.device().is_cuda()) dtype = autocast.cuda_dtype;
  at::Tensor y = Fp8LinearFunction::apply(
      x, weight, static_cast<int64_t>(reinterpret_cast<intptr_t>(&scaling)));
  if (bias.defined()) y = y + bias.to(at::kFloat);
  return y.to(dtype);
}

std::vector<std::shared_ptr<Fp8Scaling>> enable_fp8(torch::nn::Module& blocks,
                                                    std::shared_ptr<const Fp8Recipe> recipe) {
  std::vector<std::shared_ptr<Fp8Scaling>> layers;
  for (const auto& item : blocks.named_modules()) {
    auto* linear = dynamic_cast<LinearImpl*>(item.value().get());
    const std::string& name = item.key();
    if (!linear || name.find("lora_") != std::string::npos) continue;
    linear->fp8 = std::make_shared<Fp8Scaling>(recipe);
    layers.push_back(linear->fp8);
  }
  return layers;
}

void update_fp8_scales(const std::vector<std::shared_ptr<Fp8Scaling>>& layers,
                       ProcessGroup* group) {
  if (layers.empty()) return;
  std::vector<at::Tensor> amaxes;
  for (const auto& layer : layers) amaxes.push_back(layer->amax);
  at::Tensor all = at::stack(amaxes);  // [layers, 3]
  if (group && group->size() > 1) group->all_reduce(all, ReduceOp::kMax)->wait();
  for (size_t i = 0; i < layers.size(); ++i) {
    Fp8Scaling& layer = *layers[i];
    const Fp8Recipe& recipe = *layer.recipe;
    const at::Tensor step = all[static_cast<int64_t>(i)].to(layer.history.device());
    layer.history.copy_(at::roll(layer.history, 1, 0));
    layer.history[0].copy_(step);
    const at::Tensor amax = recipe.most_recent ? step : std::get<0>(layer.history.max(0));
    const double backward_max = fp8_max(recipe.hybrid ? Fp8Format::kE5M2 : Fp8Format::kE4M3);
    const at::Tensor largest = at::tensor(
        {fp8_max(Fp8Format::kE4M3), fp8_max(Fp8Format::kE4M3), backward_max}, amax.options());
    at::Tensor next = largest / amax / static_cast<double>(int64_t{1} << recipe.margin);
    next = at::where((amax > 0) & at::isfinite(amax), next, layer.scale);
    next = at::where(at::isinf(next), at::full_like(next, std::numeric_limits<float>::max()), next);
    layer.scale.copy_(next);
    layer.amax.zero_();
  }
}

}  // namespace shardtrain::detail
