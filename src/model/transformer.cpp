// The model: embeddings, the stack of blocks (optionally checkpointed), final norm and head.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>

#include "model/checkpoint.h"
#include "model/chunked_loss.h"
#include "model/init.h"
#include "model/layers.h"
#include "model/tied_gradient.h"
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
  if (config.sliding_window > 0 && tokens.size(1) > config.sliding_window) {
    throw std::invalid_argument("sequence length " + std::to_string(tokens.size(1)) +
                                " exceeds the model's sliding attention window of " +
                                std::to_string(config.sliding_window) +
                                " tokens, which is not implemented: use sequences of at most "
                                "the window");
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

void check_layout(const SequenceLayout& layout, const at::Tensor& tokens) {
  if (!layout.defined()) return;
  if (!layout.segments.defined() || !layout.positions.sizes().equals(tokens.sizes()) ||
      !layout.segments.sizes().equals(tokens.sizes()) ||
      layout.positions.scalar_type() != at::kLong || layout.segments.scalar_type() != at::kLong) {
    std::ostringstream got;
    got << "positions " << layout.positions.sizes() << ", segments "
        << (layout.segments.defined() ? layout.segments.sizes() : at::IntArrayRef{});
    throw std::invalid_argument(
        "Transformer::forward: a sequence layout needs int64 positions and segments shaped as "
        "the tokens " +
        c10::str(tokens.sizes()) + ", got " + got.str());
  }
}

std::string block_name(size_t index) { return "blocks." + std::to_string(index); }

at::Tensor weight_of(const std::shared_ptr<torch::nn::Module>& module) {
  return module->named_parameters(/*recurse=*/false)["weight"];
}

// Under context parallelism (the split active), the positions in the whole sequence of this
// rank's `length` tokens; undefined otherwise.
at::Tensor split_positions(const std::shared_ptr<detail::ContextSplit>& cp, int64_t length,
                           const at::Device& device) {
  if (!cp || !cp->active) return {};
  return detail::context_positions(length * cp->size(), cp->rank(), cp->size()).to(device);
}

}  // namespace

// Random layer-token dropping: the `keep` of `length` tokens that one block runs on for each of
// `batch` samples, [batch, keep] in ascending order, drawn without replacement from the key, the
// forward's number, the block and the sample alone.
at::Tensor detail::draw_kept_tokens(int64_t batch, int64_t length, int64_t keep, uint64_t key,
                                    int64_t forward, int64_t block) {
  at::Tensor kept = at::empty({batch, keep}, at::kLong);
  int64_t* out = kept.data_ptr<int64_t>();
  std::vector<int64_t> order(static_cast<size_t>(length));
  for (int64_t b = 0; b < batch; ++b) {
    std::seed_seq seeds{static_cast<uint32_t>(key),     static_cast<uint32_t>(key >> 32),
                        static_cast<uint32_t>(forward), static_cast<uint32_t>(block),
                        static_cast<uint32_t>(b),       0x4c5444u};  // "LTD"
    std::mt19937_64 draw(seeds);
    std::iota(order.begin(), order.end(), int64_t{0});
    for (int64_t i = 0; i < keep; ++i) {  // the first `keep` of a random permutation
      const auto j = i + static_cast<int64_t>(draw() % static_cast<uint64_t>(length - i));
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
    }
    std::sort(order.begin(), order.begin() + keep);
    std::copy(order.begin(), order.begin() + keep, out + b * keep);
  }
  return kept;
}

TransformerImpl::TransformerImpl(ModelConfig config, ModelInit init) : config_(std::move(config)) {
  config_.validate();
  // The blockwise kernel has no attention dropout.
  if (config_.dropout > 0.0) attention_ = AttentionKernel::kFused;
  if (init.has_seed_) {
    seed_ = init.seed_;
  } else {
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    seed_ = generator.get<at::CPUGeneratorImpl>()->random64();
  }
  const bool deferred = init.deferred_;
  values_ = std::move(init.values_);
  if (init.parts_) {
    parts_ = *init.parts_;
    for (const auto& [begin, end] : parts_.blocks) {
      if (begin < 0 || end > config_.n_layers || begin >= end) {
        throw std::invalid_argument("ModelParts: blocks [" + std::to_string(begin) + ", " +
                                    std::to_string(end) + ") are not within the model's " +
                                    std::to_string(config_.n_layers) + " blocks");
      }
    }
  } else {
    parts_.blocks = {{0, config_.n_layers}};
  }
  if (parts_.experts != -1 && (!config_.moe() || parts_.first_expert < 0 || parts_.experts < 1 ||
                               parts_.first_expert + parts_.experts > config_.n_experts)) {
    throw std::invalid_argument("ModelParts: experts [" + std::to_string(parts_.first_expert) +
                                ", " + std::to_string(parts_.first_expert + parts_.experts) +
                                ") are not within the model's " +
                                std::to_string(config_.n_experts) + " experts");
  }
  const int64_t d = config_.d_model;
  const bool gpt2 = config_.family == ModelFamily::kGpt2;
  const bool bert = config_.family == ModelFamily::kBert;
  // Registration order is the parameter order ModelConfig::parameter_shapes() promises.
  if (parts_.embedding || (parts_.head && config_.tie_embeddings)) {
    tok_emb_ = register_module("tok_emb", detail::Embedding(config_.vocab_size, d, deferred));
  }
  if ((gpt2 || bert) && parts_.embedding) {
    pos_emb_ = register_module("pos_emb", detail::Embedding(config_.context_length, d, deferred));
  }
  if (bert && parts_.embedding) {
    type_emb_ =
        register_module("type_emb", detail::Embedding(config_.type_vocab_size, d, deferred));
    emb_norm_ = register_module("emb_norm", detail::LayerNorm(d, config_.norm_eps, deferred));
  }
  if (config_.moe()) {
    moe_ = std::make_shared<detail::MoeState>();
    moe_->tokens = at::zeros({config_.n_layers, config_.n_experts}, at::kLong);
  }
  blocks_ = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < config_.n_layers; ++i) {
    if (parts_.holds_block(i)) {
      blocks_->push_back(detail::make_block(config_, i, deferred, parts_));
    } else {
      blocks_->push_back(torch::nn::Identity());  // another pipeline stage's block
    }
  }
  if (parts_.head && bert) {
    mlm_head_ = register_module("mlm", detail::MlmHead(config_, deferred));
  } else if (parts_.head) {
    if (gpt2) {
      final_norm_ = register_module("ln_f", detail::LayerNorm(d, config_.norm_eps, deferred));
    } else {
      final_norm_ = register_module("norm", detail::RMSNorm(d, config_.norm_eps, deferred));
    }
    if (!config_.tie_embeddings) {
      lm_head_ = register_module("lm_head",
                                 detail::Linear(d, config_.vocab_size, /*bias=*/false, deferred));
    }
  }
  if (!deferred) detail::initialize_parameters(*this, initializer(), /*only_missing=*/false);
}

bool ModelParts::holds_block(int64_t index) const {
  for (const auto& [begin, end] : blocks) {
    if (index >= begin && index < end) return true;
  }
  return false;
}

std::vector<std::shared_ptr<torch::nn::Module>> TransformerImpl::hook_points() const {
  std::vector<std::shared_ptr<torch::nn::Module>> points;
  for (const auto& block : *blocks_) {
    // Not the placeholders of another pipeline stage's blocks.
    if (!std::dynamic_pointer_cast<torch::nn::IdentityImpl>(block)) points.push_back(block);
  }
  return points;
}

at::Tensor TransformerImpl::forward(const at::Tensor& tokens) {
  return forward(tokens, SequenceLayout());
}

at::Tensor TransformerImpl::forward(const at::Tensor& tokens, const SequenceLayout& layout) {
  return whole_forward(tokens, layout, [this](const at::Tensor& x) { return head(x); });
}

at::Tensor TransformerImpl::forward_loss(const at::Tensor& tokens, const SequenceLayout& layout,
                                         const LossTargets& targets) {
  TORCH_CHECK(targets.targets.sizes() == tokens.sizes(),
              "Transformer::forward_loss: targets must be shaped as the tokens ", tokens.sizes(),
              ", got ", targets.targets.sizes());
  return whole_forward(tokens, layout, [&](const at::Tensor& x) { return head_loss(x, targets); });
}

at::Tensor TransformerImpl::head_loss(const at::Tensor& output, const LossTargets& targets) {
  if (mlm_head_) {
    // A masked-language model's targets are a few of the positions: the head runs on those.
    const at::Tensor flat = output.reshape({-1, output.size(-1)});
    const at::Tensor all = targets.targets.reshape({-1}).to(flat.device());
    const at::Tensor rows = (all != kIgnoreIndex).nonzero().squeeze(1);
    const at::Tensor logits = head(flat.index_select(0, rows)).to(at::kFloat);
    const at::Tensor sum = at::cross_entropy_loss(logits, all.index_select(0, rows), {},
                                                  at::Reduction::Sum, kIgnoreIndex);
    // No divisor: the mean over the targets (0 / 0 when there are none, as cross_entropy's).
    return sum / (targets.divisor > 0 ? targets.divisor : static_cast<double>(rows.size(0)));
  }
  const at::Tensor x = head_input(output);
  const at::Tensor weight = head_weight();
  const int64_t chunk =
      targets.chunk > 0 ? targets.chunk : detail::loss_chunk_tokens(weight.size(0));
  const detail::TiedGradientSink* sink = tied_sink();
  return detail::chunked_head_loss(x.reshape({-1, x.size(-1)}), weight,
                                   targets.targets.reshape({-1}), targets.divisor, chunk, tp_.get(),
                                   sink ? &sink->head : nullptr);
}

at::Tensor TransformerImpl::whole_forward(const at::Tensor& tokens, const SequenceLayout& layout,
                                          const std::function<at::Tensor(const at::Tensor&)>& end) {
  check_tokens(tokens, config_);
  check_layout(layout, tokens);
  if (!parts_.embedding || !parts_.head || !parts_.holds_block(0) || parts_.blocks.size() != 1 ||
      parts_.blocks[0].second != config_.n_layers) {
    throw std::logic_error(
        "Transformer::forward: this model holds one pipeline stage's parts; call forward_stage");
  }
  // Held for the call, so hooks removed meanwhile still see their post_forward.
  const std::shared_ptr<ForwardHooks> hooks = module_hooks(*this);
  if (hooks) hooks->pre_forward(*this);
  detail::BlockContext ctx;
  at::Tensor x = embed(tokens, tokens.size(1), layout, ctx);
  if (is_training() && !token_drop_.layers.empty()) ctx.token_drop_forward = token_drop_forwards_++;
  x = end(run_blocks(x, 0, static_cast<int64_t>(blocks_->size()), ctx));
  return hooks ? hooks->post_forward(*this, x) : x;
}

at::Tensor TransformerImpl::forward_stage(const at::Tensor& input, int64_t begin, int64_t end,
                                          int64_t length, const SequenceLayout& layout,
                                          bool with_head) {
  detail::BlockContext ctx;
  at::Tensor x;
  if (begin == 0) {
    check_tokens(input, config_);
    check_layout(layout, input);
    x = embed(input, length, layout, ctx);
  } else {
    if (tp_) tp_->sequence_parallel_now = tp_->sequence_parallel && length % tp_->size() == 0;
    x = input;
    prepare_context(x, length, layout, ctx);
  }
  x = run_blocks(x, begin, end, ctx);
  return end == config_.n_layers && with_head ? head(x) : x;
}

void TransformerImpl::prepare_context(const at::Tensor& x, int64_t length,
                                      const SequenceLayout& layout, detail::BlockContext& ctx) {
  ctx.attention = attention_;
  ctx.causal = !config_.bidirectional();
  ctx.mask.is_causal = ctx.causal;
  ctx.moe = moe_.get();
  ctx.layout = layout;
  // This rank's chunks of sequences split by context parallelism: their positions in the whole.
  const at::Tensor split = split_positions(cp_, length, x.device());
  if (split.defined()) {
    if (attention_ != AttentionKernel::kBlockwise) {
      throw std::logic_error(
          "Transformer: context parallelism needs the blockwise attention kernel");
    }
    ctx.cp = cp_.get();
    ctx.mask.query_positions = split;
    if (layout.defined()) {
      ctx.mask.query_segments = layout.segments.to(x.device());
      ctx.all_segments = cp_->gather(ctx.mask.query_segments);
    }
  } else if (attention_ == AttentionKernel::kBlockwise) {
    ctx.mask = detail::AttentionMask::causal(length);
    ctx.mask.is_causal = ctx.causal;
    ctx.mask.query_positions = ctx.mask.query_positions.to(x.device());
    ctx.mask.key_positions = ctx.mask.query_positions;
    if (layout.defined()) {
      ctx.mask.query_segments = layout.segments.to(x.device());
      ctx.mask.key_segments = ctx.mask.query_segments;
    }
  } else if (layout.defined()) {
    const at::Tensor segments = layout.segments.to(x.device());
    const at::Tensor same = segments.unsqueeze(2) == segments.unsqueeze(1);  // [B, T, T]
    const at::Tensor causal =
        at::ones({length, length}, segments.options().dtype(at::kBool)).tril();
    ctx.allowed = (ctx.causal ? same & causal : same).unsqueeze(1);
  }
  if (config_.family != ModelFamily::kLlama) return;  // no rotary embeddings
  if (!rope_cos_.defined() || rope_cos_.device() != x.device() ||
      rope_cos_.scalar_type() != x.scalar_type()) {
    std::tie(rope_cos_, rope_sin_) =
        detail::rope_tables(config_.context_length, config_.head_size(), config_.rope_theta,
                            x.options(), config_.rope_scaling);
  }
  if (layout.defined()) {
    // Each token's own position: [B, 1, T, head_dim], broadcast over the heads.
    const at::Tensor positions = layout.positions.to(x.device());
    auto rows = [&](const at::Tensor& table) {
      return table.index_select(0, positions.reshape({-1}))
          .view({positions.size(0), 1, positions.size(1), table.size(1)});
    };
    ctx.rope_cos = rows(rope_cos_);
    ctx.rope_sin = rows(rope_sin_);
    return;
  }
  if (split.defined()) {
    ctx.rope_cos = rope_cos_.index_select(0, split);
    ctx.rope_sin = rope_sin_.index_select(0, split);
    return;
  }
  ctx.rope_cos = rope_cos_.narrow(0, 0, length);
  ctx.rope_sin = rope_sin_.narrow(0, 0, length);
}

at::Tensor TransformerImpl::embed(const at::Tensor& tokens, int64_t length,
                                  const SequenceLayout& layout, detail::BlockContext& ctx) {
  if (!parts_.embedding) {
    throw std::logic_error("Transformer: this pipeline stage does not hold the embeddings");
  }
  const bool learned_positions = config_.family != ModelFamily::kLlama;
  const double dropout = is_training() ? config_.dropout : 0.0;
  // Under sequence parallelism a rank carries length / tp positions between the layers that
  // need the whole sequence (which gather it); a length that does not divide runs without.
  const int tp_size = tp_ ? tp_->size() : 1;
  if (tp_) tp_->sequence_parallel_now = tp_->sequence_parallel && length % tp_size == 0;
  const bool sequence_parallel = tp_ && tp_->sequence_parallel_now;
  auto& tok_emb = dynamic_cast<detail::EmbeddingImpl&>(*tok_emb_);
  const detail::TiedGradientSink* sink = tied_sink();
  at::Tensor x = sink && at::GradMode::is_enabled()
                     ? detail::embedding_into_sink(tok_emb.weight, tokens, *sink)
                     : tok_emb.forward(tokens);
  if (learned_positions) {
    const int64_t local = length / (sequence_parallel ? tp_size : 1);
    const int64_t first = sequence_parallel ? tp_->rank() * local : 0;
    auto& pos_emb = dynamic_cast<detail::EmbeddingImpl&>(*pos_emb_);
    // The positions of this rank's part of the sequence; their gradient is partial.
    // Under context parallelism, the positions of this rank's chunks.
    const at::Tensor split = split_positions(cp_, length, tokens.device());
    const at::Tensor positions =
        layout.defined()  ? layout.positions.to(tokens.device()).narrow(1, first, local)
        : split.defined() ? split.narrow(0, first, local)
                          : at::arange(first, first + local, tokens.options());
    x = x + at::embedding(detail::sequence_parallel_weight(pos_emb.weight, tp_), positions);
    if (type_emb_) {  // BERT: every token of type 0, then the embeddings' norm
      x = x + dynamic_cast<detail::EmbeddingImpl&>(*type_emb_).weight[0];
      x = dynamic_cast<detail::LayerNormImpl&>(*emb_norm_).forward(x);
    }
    if (dropout > 0.0) x = at::dropout(x, dropout, /*train=*/true);  // the embeddings' dropout
  }
  prepare_context(x, length, layout, ctx);
  return x;
}

at::Tensor TransformerImpl::run_blocks(at::Tensor x, int64_t begin, int64_t end,
                                       const detail::BlockContext& ctx) {
  // Checkpointing only pays off when a graph is recorded; under NoGradGuard run blocks plainly.
  const bool checkpoint = checkpointing_ && at::GradMode::is_enabled();
  // While a trace is recorded: a span per block in forward and, through hooks on the tensors
  // between blocks, in backward.
  const bool traced = detail::tracing_now();
  std::shared_ptr<detail::BackwardSpans> backward_spans;
  if (traced && at::GradMode::is_enabled()) {
    std::vector<std::string> names;
    for (int64_t i = begin; i < end; ++i) names.push_back(block_name(i) + " backward");
    backward_spans = detail::BackwardSpans::create(std::move(names));
  }
  for (int64_t index = begin; index < end; ++index) {
    const auto position = static_cast<size_t>(index - begin);
    if (backward_spans) detail::BackwardSpans::mark(backward_spans, x, position);
    std::optional<detail::TraceSpan> span;
    if (traced) span.emplace(block_name(static_cast<size_t>(index)) + " forward", "forward");
    auto block = std::dynamic_pointer_cast<detail::BlockImpl>(blocks_[index]);
    if (!block) {
      throw std::logic_error("Transformer: blocks." + std::to_string(index) +
                             (parts_.holds_block(index)
                                  ? " is not a transformer block (was the ModuleList modified?)"
                                  : " belongs to another pipeline stage"));
    }
    // Progressive layer dropping: a skipped block passes its input on (as a new tensor, so that
    // the backward spans' boundaries stay distinct); a kept one scales its residual branches.
    const double drop_scale =
        is_training() && !layer_drop_.empty() ? layer_drop_[static_cast<size_t>(index)] : 1.0;
    if (drop_scale == 0.0) {
      if (backward_spans) x = x.view_as(x);
      continue;
    }
    detail::BlockContext block_ctx = ctx;
    // Random layer-token dropping: the block runs on the tokens drawn for it, gathered in order
    // at their own positions; the others pass it unchanged (scattered back around them).
    at::Tensor kept;
    at::Tensor input = x;
    if (ctx.token_drop_forward >= 0 && token_drop_.layers[static_cast<size_t>(index)] &&
        x.size(1) > token_drop_.tokens) {
      const int64_t batch = x.size(0), keep = token_drop_.tokens;
      kept = detail::draw_kept_tokens(batch, x.size(1), keep, token_drop_.key,
                                      ctx.token_drop_forward, index)
                 .to(x.device())
                 .unsqueeze(-1)
                 .expand({batch, keep, x.size(2)});
      input = x.gather(1, kept);
      const at::Tensor rows = kept.select(2, 0);
      SequenceLayout part;
      part.positions =
          ctx.layout.defined() ? ctx.layout.positions.to(x.device()).gather(1, rows) : rows;
      part.segments = ctx.layout.defined() ? ctx.layout.segments.to(x.device()).gather(1, rows)
                                           : at::zeros_like(rows);
      block_ctx = detail::BlockContext();
      prepare_context(input, keep, part, block_ctx);
    }
    block_ctx.residual_scale = drop_scale;
    const std::shared_ptr<ForwardHooks> block_hooks = module_hooks(*block);
    at::Tensor out;
    if (checkpoint) {
      // The hooks go inside, so that the recomputation in backward finds the parameters too.
      out = detail::checkpoint(
          [block, block_ctx, block_hooks](const at::Tensor& in) {
            if (block_hooks) block_hooks->pre_forward(*block);
            at::Tensor out = block->forward(in, block_ctx);
            return block_hooks ? block_hooks->post_forward(*block, out) : out;
          },
          input, block->parameters());
    } else {
      if (block_hooks) block_hooks->pre_forward(*block);
      out = block->forward(input, block_ctx);
      if (block_hooks) out = block_hooks->post_forward(*block, out);
    }
    x = kept.defined() ? x.scatter(1, kept, out) : out;
  }
  if (backward_spans) {
    detail::BackwardSpans::mark(backward_spans, x, static_cast<size_t>(end - begin));
  }
  return x;
}

at::Tensor TransformerImpl::head(at::Tensor x) {
  const at::Tensor bias =
      mlm_head_ ? dynamic_cast<detail::MlmHeadImpl&>(*mlm_head_).bias : at::Tensor();
  return at::linear(head_input(x), head_weight(), bias);
}

const detail::TiedGradientSink* TransformerImpl::tied_sink() const {
  // Only where the weight is one whole, trained tensor that both ends use, and the head's
  // chunked loss computes its gradient (not BERT's, which autograd differentiates).
  if (!tied_sink_ || !config_.tie_embeddings || tp_ || mlm_head_) return nullptr;
  const auto& tok_emb = dynamic_cast<const detail::EmbeddingImpl&>(*tok_emb_);
  // A quantized lookup (quantization-aware training) goes through the embedding's forward.
  return tok_emb.weight.requires_grad() && !tok_emb.compression ? tied_sink_.get() : nullptr;
}

at::Tensor TransformerImpl::head_weight() const {
  return config_.tie_embeddings ? dynamic_cast<detail::EmbeddingImpl&>(*tok_emb_).weight
                                : weight_of(lm_head_);
}

at::Tensor TransformerImpl::head_input(at::Tensor x) {
  if (!parts_.head) {
    throw std::logic_error("Transformer: this pipeline stage does not hold the head");
  }
  // Module is a virtual base of LibTorch's modules, hence dynamic_cast.
  if (mlm_head_) {
    x = dynamic_cast<detail::MlmHeadImpl&>(*mlm_head_).forward(x);
  } else if (config_.family == ModelFamily::kGpt2) {
    x = dynamic_cast<detail::LayerNormImpl&>(*final_norm_).forward(x);
  } else {
    x = dynamic_cast<detail::RMSNormImpl&>(*final_norm_).forward(x);
  }
  // Split, the head is column-parallel over the vocabulary: each rank computes the logits of
  // the ids it holds (the vocabulary-parallel losses take them as they are).
  if (tp_) x = detail::column_parallel_input(x, *tp_);
  return x;
}

void TransformerImpl::set_layer_drop(std::vector<double> scales) {
  if (!scales.empty() && scales.size() != static_cast<size_t>(config_.n_layers)) {
    throw std::invalid_argument("Transformer::set_layer_drop: " + std::to_string(scales.size()) +
                                " scales for " + std::to_string(config_.n_layers) + " blocks");
  }
  layer_drop_ = std::move(scales);
}

void TransformerImpl::set_token_drop(TokenDrop drop) {
  if (!drop.layers.empty() && drop.layers.size() != static_cast<size_t>(config_.n_layers)) {
    throw std::invalid_argument(
        "Transformer::set_token_drop: " + std::to_string(drop.layers.size()) + " entries for " +
        std::to_string(config_.n_layers) + " blocks");
  }
  if (!drop.layers.empty() && drop.tokens < 1) {
    throw std::invalid_argument("Transformer::set_token_drop: tokens must be >= 1");
  }
  token_drop_ = std::move(drop);
  token_drop_forwards_ = 0;
}

void TransformerImpl::set_aux_loss_weight(double weight) {
  if (moe_) moe_->aux_weight = weight;
}

std::shared_ptr<detail::ExpertSplit> TransformerImpl::expert_split() const {
  return moe_ ? moe_->split : nullptr;
}

void TransformerImpl::set_expert_split(std::shared_ptr<detail::ExpertSplit> split) {
  if (!moe_) throw std::invalid_argument("expert parallelism needs a mixture-of-experts model");
  moe_->split = std::move(split);
}

MoeStats TransformerImpl::take_moe_stats() {
  MoeStats stats;
  if (!moe_) return stats;
  stats.tokens_per_expert = moe_->tokens.clone();
  stats.aux_loss_sum = moe_->aux_sum;
  stats.aux_losses = moe_->aux_count;
  moe_->tokens.zero_();
  moe_->aux_sum = 0.0;
  moe_->aux_count = 0;
  return stats;
}

}  // namespace shardtrain
