// The Transformer's initialization as a function of (seed, parameter name, element index), so
// that each rank can initialize exactly the slices it holds (deferred initialization).
#include "model/init.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

#include "model/layer_split.h"
#include "model/layers.h"
#include "model/names.h"
#include "model/nf4.h"
#include "shardtrain/model.h"

namespace shardtrain {
namespace detail {
namespace {

// splitmix64's finalizer: a bijection whose outputs pass BigCrush for consecutive inputs.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

constexpr int64_t kFillChunk = 1 << 16;  // elements filled through one fp32 temporary

}  // namespace

void release_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

std::shared_ptr<at::DataPtr> take_storage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  auto taken =
      std::make_shared<at::DataPtr>(storage->set_data_ptr(at::DataPtr(nullptr, storage->device())));
  storage->set_nbytes(0);
  return taken;
}

void restore_storage(const at::Tensor& tensor, int64_t nbytes) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(static_cast<size_t>(nbytes)));
  storage->set_nbytes(static_cast<size_t>(nbytes));
}

void initialize_parameters(torch::nn::Module& module, const ParameterInitializer& init,
                           bool only_missing) {
  at::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const at::Tensor& p = item.value();
    const bool missing = !is_materialized(p);
    if (only_missing && !missing) continue;
    if (missing) restore_storage(p, static_cast<int64_t>(p.numel() * p.element_size()));
    init(item.key(), 0, p.detach().view({-1}));
  }
}

uint64_t init_stream_key(uint64_t seed, const std::string& name) {
  uint64_t hash = 0xCBF29CE484222325ULL;  // FNV-1a
  for (unsigned char c : name) hash = (hash ^ c) * 0x100000001B3ULL;
  return mix(seed ^ mix(hash));
}

namespace {

constexpr double kUnit = 1.0 / 9007199254740992.0;  // 2^-53

// out[j] = value(begin + j), computed in fp32 and stored in out's dtype. Another dtype goes
// through an fp32 chunk at a time: a whole-tensor fp32 temporary would cost, at its peak, the
// memory a bf16 parameter saves.
template <typename Value>
void fill_by_index(const char* who, int64_t begin, const at::Tensor& out, const Value& value) {
  if (out.dim() != 1 || !out.is_contiguous()) {
    throw std::invalid_argument(std::string(who) + ": out must be a contiguous 1-D tensor");
  }
  if (out.scalar_type() != at::kFloat && out.numel() > kFillChunk) {
    for (int64_t at = 0; at < out.numel(); at += kFillChunk) {
      fill_by_index(who, begin + at, out.narrow(0, at, std::min(kFillChunk, out.numel() - at)),
                    value);
    }
    return;
  }
  at::Tensor values = out.scalar_type() == at::kFloat ? out : at::empty_like(out, at::kFloat);
  float* data = values.data_ptr<float>();
  at::parallel_for(0, values.numel(), 1 << 15, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) data[j] = value(static_cast<uint64_t>(begin + j));
  });
  if (!values.is_same(out)) out.copy_(values);
}

}  // namespace

void fill_normal(uint64_t key, int64_t begin, double mean, double std, at::Tensor out) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  fill_by_index("fill_normal", begin, out, [=](uint64_t index) {
    const uint64_t pair = index >> 1;
    const double u1 = static_cast<double>((mix(key + 2 * pair) >> 11) + 1) * kUnit;  // (0, 1]
    const double u2 = static_cast<double>(mix(key + 2 * pair + 1) >> 11) * kUnit;
    const double radius = std::sqrt(-2.0 * std::log(u1));
    const double z = (index & 1) ? radius * std::sin(kTwoPi * u2) : radius * std::cos(kTwoPi * u2);
    return static_cast<float>(mean + std * z);
  });
}

void fill_uniform(uint64_t key, int64_t begin, double low, double high, at::Tensor out) {
  fill_by_index("fill_uniform", begin, out, [=](uint64_t index) {
    const double u = static_cast<double>(mix(key + index) >> 11) * kUnit;
    return static_cast<float>(low + (high - low) * u);
  });
}

}  // namespace detail

bool is_materialized(const at::Tensor& tensor) {
  return !tensor.defined() || tensor.numel() == 0 || tensor.storage().nbytes() > 0;
}

namespace {

// The LoRA adapters' initialization (add_lora): A uniform in +-1/sqrt(in) (what
// torch::nn::Linear and PEFT draw), B zero, as functions of (seed, name, index) like the rest.
// Other names go to `base`.
ParameterInitializer with_adapters(const TransformerImpl& model, uint64_t seed,
                                   ParameterInitializer base) {
  std::map<std::string, std::pair<int64_t, int64_t>> adapters;  // name -> numel, fan-in (A)
  for (const auto& item : model.named_parameters()) {
    const bool a = detail::ends_with(item.key(), ".lora_A.weight");
    if (a || detail::ends_with(item.key(), ".lora_B.weight")) {
      adapters[item.key()] = {item.value().numel(), a ? item.value().size(1) : 0};
    }
  }
  if (adapters.empty()) return base;
  return [adapters = std::move(adapters), seed, base = std::move(base)](
             const std::string& name, int64_t begin, at::Tensor out) {
    const auto it = adapters.find(name);
    if (it == adapters.end()) return base(name, begin, out);
    if (begin < 0 || begin + out.numel() > it->second.first) {
      throw std::invalid_argument("elements [" + std::to_string(begin) + ", " +
                                  std::to_string(begin + out.numel()) +
                                  ") are outside parameter '" + name + "'");
    }
    at::NoGradGuard no_grad;
    if (it->second.second == 0) {
      out.zero_();
      return;
    }
    const double bound = 1.0 / std::sqrt(static_cast<double>(it->second.second));
    detail::fill_uniform(detail::init_stream_key(seed, name), begin, -bound, bound, out);
  };
}

// Weights stored as packed NF4 (store_frozen_linears): the whole weight is initialized by
// `base` in fp32 (read from Hugging Face files one weight at a time, or drawn), quantized and
// packed, and the bytes asked for copied out. The last packed weight is kept, as a rank's
// shards ask for consecutive ranges of the same weight.
ParameterInitializer with_nf4(const TransformerImpl& model, ParameterInitializer base) {
  std::map<std::string, std::vector<int64_t>> packed_shapes;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto* linear = dynamic_cast<const detail::LinearImpl*>(item.value().get());
    if (linear && !linear->nf4_shape.empty())
      packed_shapes[item.key() + ".weight"] = linear->nf4_shape;
  }
  if (packed_shapes.empty()) return base;
  struct Last {
    std::mutex mutex;
    std::string name;
    at::Tensor packed;
  };
  auto last = std::make_shared<Last>();
  return [packed_shapes = std::move(packed_shapes), base = std::move(base), last](
             const std::string& name, int64_t begin, at::Tensor out) {
    const auto it = packed_shapes.find(name);
    if (it == packed_shapes.end()) return base(name, begin, out);
    std::lock_guard<std::mutex> lock(last->mutex);
    if (last->name != name) {
      at::Tensor values = at::empty(it->second, at::kFloat);
      base(name, 0, values.view({-1}));
      last->packed = detail::nf4_pack(detail::nf4_quantize(values));
      last->name = name;
    }
    if (begin < 0 || begin + out.numel() > last->packed.numel()) {
      throw std::invalid_argument("bytes [" + std::to_string(begin) + ", " +
                                  std::to_string(begin + out.numel()) +
                                  ") are outside the packed weight '" + name + "'");
    }
    out.copy_(last->packed.narrow(0, begin, out.numel()));
  };
}

}  // namespace

ParameterInitializer TransformerImpl::initializer() const {
  ParameterInitializer init =
      with_adapters(*this, seed_, with_nf4(*this, values_ ? values_ : base_initializer()));
  // Split by tensor parallelism, a parameter's elements are this rank's slices of the whole.
  return tp_ ? tp_->split_initializer(std::move(init)) : init;
}

ParameterInitializer TransformerImpl::base_initializer() const {
  struct Described {
    int64_t numel;
    size_t dims;
  };
  std::map<std::string, Described> described;
  for (const auto& shape : config_.parameter_shapes()) {
    described[shape.name] = {shape.numel(), shape.shape.size()};
  }
  // BERT's initialization (Hugging Face's) keeps 0.02 for the residual projections too.
  const double residual_std = config_.family == ModelFamily::kBert
                                  ? 0.02
                                  : 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layers));
  return [described = std::move(described), residual_std, seed = seed_](
             const std::string& name, int64_t begin, at::Tensor out) {
    auto it = described.find(name);
    if (it == described.end()) {
      throw std::invalid_argument("the model has no parameter '" + name + "' to initialize");
    }
    if (begin < 0 || begin + out.numel() > it->second.numel) {
      throw std::invalid_argument("elements [" + std::to_string(begin) + ", " +
                                  std::to_string(begin + out.numel()) +
                                  ") are outside parameter '" + name + "' of " +
                                  std::to_string(it->second.numel) + " elements");
    }
    at::NoGradGuard no_grad;
    using detail::ends_with;
    if (it->second.dims == 1) {
      out.fill_(ends_with(name, ".bias") ? 0.0 : 1.0);
    } else {
      const bool residual =
          ends_with(name, "attn.proj.weight") || ends_with(name, "attn.o.weight") ||
          ends_with(name, "mlp.proj.weight") || ends_with(name, ".down.weight");
      detail::fill_normal(detail::init_stream_key(seed, name), begin, 0.0,
                          residual ? residual_std : 0.02, out);
    }
  };
}

bool TransformerImpl::materialized() const {
  for (const auto& p : parameters()) {
    if (!is_materialized(p)) return false;
  }
  return true;
}

void TransformerImpl::materialize() {
  detail::initialize_parameters(*this, initializer(), /*only_missing=*/true);
}

}  // namespace shardtrain
