// parallelize_module: cuts the layers a plan names across a tensor-parallel group, and the
// standard plan of both model families.
#include <torch/nn/modules/linear.h>

#include <set>
#include <sstream>
#include <stdexcept>

#include "model/init.h"
#include "model/layers.h"
#include "parallel/tensor/tp_state.h"
#include "shardtrain/tensor_parallel.h"

namespace shardtrain {
namespace {

using detail::TpLayout;
using detail::TpState;

// "blocks.*.attn.q" matches "blocks.3.attn.q": "*" stands for one whole name.
bool path_matches(const std::string& pattern, const std::string& path) {
  std::istringstream want(pattern), got(path);
  std::string a, b;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(want, a, '.'));
    const bool more_b = static_cast<bool>(std::getline(got, b, '.'));
    if (!more_a || !more_b) return more_a == more_b;
    if (a != "*" && a != b) return false;
  }
}

// The submodules `plan` names, in plan order, with their styles. Throws for a pattern that
// matches nothing (naming `what` it was looked for in) and for a submodule named twice.
std::vector<std::pair<std::string, ParallelStyle>> resolve_plan(
    const torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>& modules,
    const TpPlan& plan, const std::string& what) {
  std::vector<std::pair<std::string, ParallelStyle>> chosen;
  std::set<std::string> seen;
  for (const auto& [pattern, style] : plan) {
    bool matched = false;
    for (const auto& item : modules) {
      if (!path_matches(pattern, item.key())) continue;
      if (!seen.insert(item.key()).second) {
        throw std::invalid_argument("tensor parallelism: the plan names '" + item.key() +
                                    "' more than once");
      }
      chosen.emplace_back(item.key(), style);
      matched = true;
    }
    if (!matched) {
      throw std::invalid_argument("tensor parallelism: the plan names '" + pattern +
                                  "', which is no submodule of the " + what);
    }
  }
  return chosen;
}

// Replaces `param` (the tensor the module computes with and has registered: one TensorImpl)
// by this rank's slice of it, and records how it was cut.
void cut(at::Tensor& param, const std::string& name, int dim, int parts, TpState& state,
         bool check_only) {
  TpLayout layout;
  layout.dim = dim;
  layout.parts = parts;
  layout.whole_shape = param.sizes().vec();
  const int size = state.size();
  const int64_t extent = layout.whole_shape.at(static_cast<size_t>(dim));
  if (extent % (static_cast<int64_t>(parts) * size) != 0) {
    std::ostringstream message;
    message << "tensor parallelism: dim " << dim << " of '" << name << "' (" << extent;
    if (parts > 1) message << " = " << parts << " fused parts of " << extent / parts;
    message << ") does not divide by tp=" << size;
    throw std::invalid_argument(message.str());
  }
  if (check_only) return;
  at::NoGradGuard no_grad;
  at::Tensor local = at::empty(layout.local_shape(size), param.options());
  if (is_materialized(param)) {
    const at::Tensor whole = param.detach().reshape({-1});
    const at::Tensor flat = local.view({-1});
    for (const auto& [at_local, at_whole, length] : layout.runs(state.rank(), size)) {
      flat.narrow(0, at_local, length).copy_(whole.narrow(0, at_whole, length));
    }
    param.set_data(local);
  } else {
    param.set_data(local);
    detail::release_storage(param);
  }
  state.layouts[name] = std::move(layout);
}

// Applies `style` to `module`, or with `check_only` just throws what applying would throw, so
// that a plan is refused before anything is cut.
void apply_style(const std::string& path, torch::nn::Module& module, const ParallelStyle& style,
                 const std::shared_ptr<TpState>& state, bool check_only) {
  using Kind = ParallelStyle::Kind;
  const std::string prefix = path + ".";
  if (auto* linear = dynamic_cast<detail::LinearImpl*>(&module)) {
    if (linear->lora_a || !linear->nf4_shape.empty()) {
      throw std::invalid_argument("tensor parallelism: '" + path +
                                  "' has a LoRA adapter or a packed weight, which are not split");
    }
    if (style.kind == Kind::kColwise) {
      cut(linear->weight, prefix + "weight", 0, style.fused_parts, *state, check_only);
      if (linear->bias.defined()) {
        cut(linear->bias, prefix + "bias", 0, style.fused_parts, *state, check_only);
      }
    } else if (style.kind == Kind::kRowwise) {
      cut(linear->weight, prefix + "weight", 1, 1, *state, check_only);
      if (!check_only) linear->tp_rowwise = true;
    } else {
      throw std::invalid_argument("tensor parallelism: '" + path +
                                  "' is a linear layer: ColwiseParallel or RowwiseParallel");
    }
    if (!check_only) linear->tp = state;
    return;
  }
  if (auto* embedding = dynamic_cast<detail::EmbeddingImpl*>(&module)) {
    if (style.kind != Kind::kRowwise) {
      throw std::invalid_argument("tensor parallelism: '" + path +
                                  "' is an embedding: RowwiseParallel splits its vocabulary");
    }
    cut(embedding->weight, prefix + "weight", 0, 1, *state, check_only);
    if (!check_only) embedding->tp = state;
    return;
  }
  auto* layer_norm = dynamic_cast<detail::LayerNormImpl*>(&module);
  auto* rms_norm = dynamic_cast<detail::RMSNormImpl*>(&module);
  if (layer_norm || rms_norm) {
    if (style.kind != Kind::kSequenceParallel) {
      throw std::invalid_argument("tensor parallelism: '" + path +
                                  "' is a norm: SequenceParallel is its style");
    }
    if (!check_only) (layer_norm ? layer_norm->tp : rms_norm->tp) = state;
    return;
  }
  throw std::invalid_argument("tensor parallelism: '" + path + "' is a " + module.name() +
                              ", not one of the model's linear, embedding or norm layers");
}

}  // namespace

void parallelize_module(Transformer& model, std::shared_ptr<ProcessGroup> group, const TpPlan& plan,
                        const TensorParallelOptions& options) {
  TORCH_CHECK(group, "parallelize_module: no process group");
  if (detail::tp_state(model)) {
    throw std::invalid_argument("parallelize_module: the model is already split");
  }
  auto state = std::make_shared<TpState>();
  state->group = std::move(group);
  state->sequence_parallel = options.sequence_parallel_;
  const auto modules = model->named_modules();
  const auto chosen = resolve_plan(modules, plan, "model");
  // The model computes its logits split over the vocabulary: both ends must be split (those a
  // pipeline stage holds).
  const bool tied = model->config().tie_embeddings;
  const ModelParts& parts = model->parts();
  const bool holds_embedding = parts.embedding || (parts.head && tied);
  auto styled = [&](const std::string& path, ParallelStyle::Kind kind) {
    for (const auto& [name, style] : chosen) {
      if (name == path && style.kind == kind) return true;
    }
    return false;
  };
  if ((holds_embedding && !styled("tok_emb", ParallelStyle::Kind::kRowwise)) ||
      (parts.head && !tied && !styled("lm_head", ParallelStyle::Kind::kColwise))) {
    throw std::invalid_argument(
        "tensor parallelism: a Transformer's plan splits its vocabulary at both ends: "
        "{\"tok_emb\", RowwiseParallel()} and {\"lm_head\", ColwiseParallel()} (the head of "
        "tied embeddings is tok_emb)");
  }
  if (options.sequence_parallel_) {
    // Between the split layers each rank then holds part of the sequence: a norm must know (its
    // gradient is partial), and every linear layer must be split, so that attention sees the
    // whole sequence and no replicated weight is left with a partial gradient.
    for (const auto& item : modules) {
      torch::nn::Module* module = item.value().get();
      const bool norm = dynamic_cast<detail::LayerNormImpl*>(module) ||
                        dynamic_cast<detail::RMSNormImpl*>(module);
      const bool linear = dynamic_cast<detail::LinearImpl*>(module);
      const bool covered = norm     ? styled(item.key(), ParallelStyle::Kind::kSequenceParallel)
                           : linear ? styled(item.key(), ParallelStyle::Kind::kColwise) ||
                                          styled(item.key(), ParallelStyle::Kind::kRowwise)
                                    : true;
      if (!covered) {
        throw std::invalid_argument(
            "tensor parallelism: with sequence parallelism every norm must be SequenceParallel "
            "and every linear layer split, but the plan leaves '" +
            item.key() + "' out");
      }
    }
  }
  if (state->size() == 1) return;
  for (bool check_only : {true, false}) {
    for (const auto& [path, style] : chosen) {
      apply_style(path, *modules[path], style, state, check_only);
    }
  }
  model->set_layer_split(state);
}

void parallelize_module(torch::nn::Module& module, const std::shared_ptr<ProcessGroup>& group,
                        const TpPlan& plan) {
  TORCH_CHECK(group, "parallelize_module: no process group");
  TpState state;  // only for cut(): the layouts are not kept
  state.group = group;
  const auto modules = module.named_modules();
  const auto chosen = resolve_plan(modules, plan, "module");
  for (const auto& [path, style] : chosen) {
    auto* linear = dynamic_cast<torch::nn::LinearImpl*>(modules[path].get());
    if (!linear) {
      throw std::invalid_argument("tensor parallelism: '" + path + "' is a " +
                                  modules[path]->name() +
                                  "; a module of your own can have its "
                                  "torch::nn::Linear layers split");
    }
    if (style.kind == ParallelStyle::Kind::kSequenceParallel ||
        (style.kind == ParallelStyle::Kind::kRowwise && linear->bias.defined())) {
      throw std::invalid_argument(
          "tensor parallelism: '" + path +
          (style.kind == ParallelStyle::Kind::kRowwise
               ? "' is row-parallel with a bias, which every rank would add before the sum: "
                 "build it without one and add it after reduce_from_tensor_parallel"
               : "': SequenceParallel is a norm's style, not a linear layer's"));
    }
  }
  for (bool check_only : {true, false}) {
    for (const auto& [path, style] : chosen) {
      auto& linear = dynamic_cast<torch::nn::LinearImpl&>(*modules[path]);
      const std::string prefix = path + ".";
      if (style.kind == ParallelStyle::Kind::kColwise) {
        cut(linear.weight, prefix + "weight", 0, style.fused_parts, state, check_only);
        if (linear.bias.defined()) {
          cut(linear.bias, prefix + "bias", 0, style.fused_parts, state, check_only);
        }
      } else {
        cut(linear.weight, prefix + "weight", 1, 1, state, check_only);
      }
    }
  }
}

TpPlan transformer_tp_plan(const ModelConfig& config, int tp) {
  auto require = [tp](int64_t value, const char* what, const char* why = "") {
    if (value % tp != 0) {
      throw std::invalid_argument(std::string("tensor parallelism: ") + what + " (" +
                                  std::to_string(value) +
                                  ") is not divisible by tp=" + std::to_string(tp) + why);
    }
  };
  require(config.n_heads, "model.n_heads");
  require(config.n_kv_heads, "model.n_kv_heads",
          " (a rank keeps whole key/value heads and the query heads that read them)");
  require(config.ffn_hidden, "model.ffn_hidden");
  if (config.moe())
    require(config.n_shared_experts * config.ffn_hidden, "the shared experts' width");
  require(config.vocab_size, "the vocabulary size (model.vocab_size)");
  if (config.bidirectional()) {
    throw std::invalid_argument(
        "tensor parallelism: the " + to_string(config.family) +
        " family (a masked-language model) has no tensor-parallel plan in this version; train it "
        "under data parallelism");
  }
  TpPlan plan{{"tok_emb", RowwiseParallel()}};
  if (config.family == ModelFamily::kGpt2) {
    plan.insert(plan.end(), {{"blocks.*.ln1", SequenceParallel()},
                             {"blocks.*.attn.qkv", ColwiseParallel(3)},
                             {"blocks.*.attn.proj", RowwiseParallel()},
                             {"blocks.*.ln2", SequenceParallel()},
                             {"blocks.*.mlp.fc", ColwiseParallel()},
                             {"blocks.*.mlp.proj", RowwiseParallel()},
                             {"ln_f", SequenceParallel()}});
  } else {
    plan.insert(plan.end(), {{"blocks.*.attn_norm", SequenceParallel()},
                             {"blocks.*.attn.q", ColwiseParallel()},
                             {"blocks.*.attn.k", ColwiseParallel()},
                             {"blocks.*.attn.v", ColwiseParallel()},
                             {"blocks.*.attn.o", RowwiseParallel()},
                             {"blocks.*.ffn_norm", SequenceParallel()}});
    // Each expert is an MLP split as the dense one (Megatron-Core's expert tensor parallelism
    // at the tensor-parallel size); the router is replicated: every rank of the group routes
    // the same tokens the same way.
    const std::vector<std::string> mlps =
        !config.moe() ? std::vector<std::string>{"blocks.*.mlp."}
        : config.n_shared_experts > 0
            ? std::vector<std::string>{"blocks.*.moe.experts.*.", "blocks.*.moe.shared."}
            : std::vector<std::string>{"blocks.*.moe.experts.*."};
    for (const std::string& mlp : mlps) {
      plan.insert(plan.end(), {{mlp + "gate", ColwiseParallel()},
                               {mlp + "up", ColwiseParallel()},
                               {mlp + "down", RowwiseParallel()}});
    }
    plan.emplace_back("norm", SequenceParallel());
  }
  if (!config.tie_embeddings) plan.emplace_back("lm_head", ColwiseParallel());
  return plan;
}

namespace detail {

ParameterInitializer tensor_parallel_initializer(std::shared_ptr<const TpState> state,
                                                 ParameterInitializer init) {
  return [state = std::move(state), init = std::move(init)](const std::string& name, int64_t begin,
                                                            at::Tensor out) {
    const TpLayout* layout = state->layout_of(name);
    if (!layout) return init(name, begin, out);
    TORCH_CHECK(out.is_contiguous(), "tensor-parallel initializer: '", name,
                "' must be filled through a contiguous tensor");
    const at::Tensor flat = out.view({-1});
    for (const auto& [local, whole, length] :
         whole_ranges(*layout, state->rank(), state->size(), begin, out.numel())) {
      init(name, whole, flat.narrow(0, local - begin, length));
    }
  };
}

}  // namespace detail
}  // namespace shardtrain
