// The decoder: embeddings, the stack of blocks (optionally checkpointed), final norm and head.
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "model/checkpoint.h"
#include "model/init.h"
#include "model/layers.h"
#include "shardtrain/model.h"
#include "trace/telemetry.h"

namespace shardtrain {
namespace {

void check_tokens(const at::Tensor& tokens, const ModelConfig& config) {
  if (!tokens.defined() || tokens.dim() != 2) {
    std::ostringstream got;
    if (tokens.defined()) {
      got << tokens.sizes();
    } else {
      got << "an undefined tensor";
    }
    throw std::invalid_argument("Transformer::forward: tokens must be [batch, sequence], got " +
                                got.str());
  }
  if (tokens.scalar_type() != at::kLong) {
    throw std::invalid_argument(std::string("Transformer::forward: tokens must be int64, got ") +
                                c10::toString(tokens.scalar_type()));
  }
  if (tokens.size(1) > config.context_length) {
    throw std::invalid_argument("sequence length " + std::to_string(tokens.size(1)) +
                                " exceeds the model's context length " +
                                std::to_string(config.context_length));
  }
  if (tokens.numel() == 0) {
    throw std::invalid_argument("Transformer::forward: tokens is empty");
  }
  // One host synchronization per forward; an out-of-range id would otherwise surface as an
  // opaque indexing error (or a device-side assert on CUDA).
  const auto bounds = at::aminmax(tokens);
  const at::Tensor both = at::stack({std::get<0>(bounds), std::get<1>(bounds)}).cpu();
  const int64_t lo = both[0].item<int64_t>();
  const int64_t hi = both[1].item<int64_t>();
  if (lo < 0 || hi >= config.vocab_size) {
    const at::Tensor where = ((tokens < 0) | (tokens >= config.vocab_size)).nonzero()[0].cpu();
    const int64_t b = where[0].item<int64_t>(), t = where[1].item<int64_t>();
    throw std::invalid_argument("token id " + std::to_string(tokens[b][t].item<int64_t>()) +
                                " at [" + std::to_string(b) + ", " + std::to_string(t) +
                                "] is outside the vocabulary [0, " +
                                std::to_string(config.vocab_size) + ")");
  }
}

std::string block_name(size_t index) { return "blocks." + std::to_string(index); }

at::Tensor weight_of(const std::shared_ptr<torch::nn::Module>& module) {
  return module->named_parameters(/*recurse=*/false)["weight"];
}

}  // namespace

TransformerImpl::TransformerImpl(ModelConfig config, ModelInit init) : config_(std::move(config)) {
  config_.validate();
  if (init.has_seed_) {
    seed_ = init.seed_;
  } else {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    seed_ = generator.get<at::CPUGeneratorImpl>()->random64();
  }
  const bool deferred = init.deferred_;
  values_ = std::move(init.values_);
  const int64_t d = config_.d_model;
  const bool gpt2 = config_.family == ModelFamily::kGpt2;
  // Registration order is the parameter order ModelConfig::parameter_shapes() promises.
  tok_emb_ = register_module("tok_emb", detail::Embedding(config_.vocab_size, d, deferred));
  if (gpt2) {
    pos_emb_ = register_module("pos_emb", detail::Embedding(config_.context_length, d, deferred));
  }
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layers; ++i) {
    blocks_->push_back(detail::make_block(config_, deferred));
  }
  if (gpt2) {
    final_norm_ = register_module("ln_f", detail::LayerNorm(d, config_.norm_eps, deferred));
  } else {
    final_norm_ = register_module("norm", detail::RMSNorm(d, config_.norm_eps, deferred));
  }
  if (!config_.tie_embeddings) {
    lm_head_ =
        register_module("lm_head", detail::Linear(d, config_.vocab_size, /*bias=*/false, deferred));
  }
  if (!deferred) detail::initialize_parameters(*this, initializer(), /*only_missing=*/false);
}

std::vector<std::shared_ptr<torch::nn::Module>> TransformerImpl::hook_points() const {
  return std::vector<std::shared_ptr<torch::nn::Module>>(blocks_->begin(), blocks_->end());
}

at::Tensor TransformerImpl::forward(const at::Tensor& tokens) {
  check_tokens(tokens, config_);
  // Held for the call, so hooks removed meanwhile still see their post_forward.
  const std::shared_ptr<ForwardHooks> hooks = module_hooks(*this);
  if (hooks) hooks->pre_forward(*this);
  const int64_t length = tokens.size(1);
  const bool gpt2 = config_.family == ModelFamily::kGpt2;
  const double dropout = is_training() ? config_.dropout : 0.0;

  // Under sequence parallelism a rank carries length / tp positions between the layers that
  // need the whole sequence (which gather it); a length that does not divide runs without.
  const int tp_size = tp_ ? tp_->size() : 1;
  if (tp_) tp_->sequence_parallel_now = tp_->sequence_parallel && length % tp_size == 0;
  const bool sequence_parallel = tp_ && tp_->sequence_parallel_now;
  auto& tok_emb = dynamic_cast<detail::EmbeddingImpl&>(*tok_emb_);
  at::Tensor x = tok_emb.forward(tokens);
  detail::BlockContext ctx;
  ctx.use_sdpa = use_sdpa_;
  if (gpt2) {
    const int64_t local = length / (sequence_parallel ? tp_size : 1);
    const int64_t first = sequence_parallel ? tp_->rank() * local : 0;
    auto& pos_emb = dynamic_cast<detail::EmbeddingImpl&>(*pos_emb_);
    // The positions of this rank's part of the sequence; their gradient is partial.
    x = x + at::embedding(detail::sequence_parallel_weight(pos_emb.weight, tp_),
                          at::arange(first, first + local, tokens.options()));
    if (dropout > 0.0) x = at::dropout(x, dropout, /*train=*/true);  // GPT-2's embedding dropout
  } else {
    if (!rope_cos_.defined() || rope_cos_.device() != x.device() ||
        rope_cos_.scalar_type() != x.scalar_type()) {
      std::tie(rope_cos_, rope_sin_) =
          detail::rope_tables(config_.context_length, config_.d_model / config_.n_heads,
                              config_.rope_theta, x.options());
    }
    ctx.rope_cos = rope_cos_.narrow(0, 0, length);
    ctx.rope_sin = rope_sin_.narrow(0, 0, length);
  }

  // Checkpointing only pays off when a graph is recorded; under NoGradGuard run blocks plainly.
  const bool checkpoint = checkpointing_ && at::GradMode::is_enabled();
  // While a trace is recorded: a span per block in forward and, through hooks on the tensors
  // between blocks, in backward.
  const bool traced = detail::tracing_now();
  std::shared_ptr<detail::BackwardSpans> backward_spans;
  if (traced && at::GradMode::is_enabled()) {
    std::vector<std::string> names;
    for (size_t i = 0; i < blocks_->size(); ++i) names.push_back(block_name(i) + " backward");
    backward_spans = detail::BackwardSpans::create(std::move(names));
  }
  int64_t index = 0;
  for (const auto& module : *blocks_) {
    if (backward_spans) detail::BackwardSpans::mark(backward_spans, x, static_cast<size_t>(index));
    std::optional<detail::TraceSpan> span;
    if (traced) span.emplace(block_name(static_cast<size_t>(index)) + " forward", "forward");
    auto block = std::dynamic_pointer_cast<detail::BlockImpl>(module);
    if (!block) {
      throw std::logic_error("Transformer: blocks." + std::to_string(index) +
                             " is not a transformer block (was the ModuleList modified?)");
    }
    const std::shared_ptr<ForwardHooks> block_hooks = module_hooks(*block);
    if (checkpoint) {
      // The hooks go inside, so that the recomputation in backward finds the parameters too.
      x = detail::checkpoint(
          [block, ctx, block_hooks](const at::Tensor& in) {
            if (block_hooks) block_hooks->pre_forward(*block);
            at::Tensor out = block->forward(in, ctx);
            return block_hooks ? block_hooks->post_forward(*block, out) : out;
          },
          x, block->parameters());
    } else {
      if (block_hooks) block_hooks->pre_forward(*block);
      x = block->forward(x, ctx);
      if (block_hooks) x = block_hooks->post_forward(*block, x);
    }
    ++index;
  }
  if (backward_spans) detail::BackwardSpans::mark(backward_spans, x, blocks_->size());

  // Module is a virtual base of LibTorch's modules, hence dynamic_cast.
  if (gpt2) {
    x = dynamic_cast<detail::LayerNormImpl&>(*final_norm_).forward(x);
  } else {
    x = dynamic_cast<detail::RMSNormImpl&>(*final_norm_).forward(x);
  }
  // Split, the head is column-parallel over the vocabulary: each rank computes the logits of
  // the ids it holds (vocab_parallel_cross_entropy takes them as they are).
  if (tp_) x = detail::column_parallel_input(x, *tp_);
  x = at::linear(x, config_.tie_embeddings ? tok_emb.weight : weight_of(lm_head_));
  return hooks ? hooks->post_forward(*this, x) : x;
}

}  // namespace shardtrain
