#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>

#include "shardtrain/config.h"
#include "shardtrain/parallel_names.h"

namespace shardtrain {
namespace {

using Setter = std::function<void(TrainConfig&, const toml::node&, const std::string& name)>;

ParallelStrategy parse_name(const std::string& text, ParallelStrategy*) {
  return parallel_strategy_from_string(text);
}
ShardingStrategy parse_name(const std::string& text, ShardingStrategy*) {
  return sharding_strategy_from_string(text);
}
BackwardPrefetch parse_name(const std::string& text, BackwardPrefetch*) {
  return backward_prefetch_from_string(text);
}
FsdpWrap parse_name(const std::string& text, FsdpWrap*) { return fsdp_wrap_from_string(text); }
OffloadDevice parse_name(const std::string& text, OffloadDevice*) {
  return offload_device_from_string(text);
}
DDPCommHook parse_name(const std::string& text, DDPCommHook*) {
  return ddp_comm_hook_from_string(text);
}
PipelineScheduleKind parse_name(const std::string& text, PipelineScheduleKind*) {
  return pipeline_schedule_from_string(text);
}

std::string type_of(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a number";
    case toml::node_type::boolean:
      return "a boolean";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::table:
      return "a table";
    default:
      return "a date or time";
  }
}

[[noreturn]] void wrong_type(const std::string& name, const char* expected,
                             const toml::node& node) {
  throw std::invalid_argument("config key '" + name + "': expected " + expected + ", got " +
                              type_of(node));
}

int64_t as_int(const toml::node& node, const std::string& name) {
  if (!node.is_integer()) wrong_type(name, "an integer", node);
  return *node.value<int64_t>();
}
double as_double(const toml::node& node, const std::string& name) {
  if (!node.is_number()) wrong_type(name, "a number", node);
  return *node.value<double>();
}
bool as_bool(const toml::node& node, const std::string& name) {
  if (!node.is_boolean()) wrong_type(name, "a boolean", node);
  return *node.value<bool>();
}
std::string as_string(const toml::node& node, const std::string& name) {
  if (!node.is_string()) wrong_type(name, "a string", node);
  return *node.value<std::string>();
}

void assign(int64_t& target, const toml::node& n, const std::string& name) {
  target = as_int(n, name);
}
void assign(double& target, const toml::node& n, const std::string& name) {
  target = as_double(n, name);
}
void assign(bool& target, const toml::node& n, const std::string& name) {
  target = as_bool(n, name);
}
void assign(std::string& target, const toml::node& n, const std::string& name) {
  target = as_string(n, name);
}
// A strategy's name, parsed into its enum (parallel_names.h) here, once.
template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
void assign(E& target, const toml::node& n, const std::string& name) {
  const std::string text = as_string(n, name);
  try {
    target = parse_name(text, static_cast<E*>(nullptr));
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(name + " " + e.what());
  }
}

// The section a key's member belongs to.
ModelSection& section(TrainConfig& c, ModelSection*) { return c.model; }
DataSection& section(TrainConfig& c, DataSection*) { return c.data; }
TrainSection& section(TrainConfig& c, TrainSection*) { return c.train; }
PrecisionSection& section(TrainConfig& c, PrecisionSection*) { return c.precision; }
ParallelSection& section(TrainConfig& c, ParallelSection*) { return c.parallel; }
DdpSection& section(TrainConfig& c, DdpSection*) { return c.parallel.ddp; }
FsdpSection& section(TrainConfig& c, FsdpSection*) { return c.parallel.fsdp; }
ZeroSection& section(TrainConfig& c, ZeroSection*) { return c.parallel.zero; }
LoraSection& section(TrainConfig& c, LoraSection*) { return c.lora; }
CompressionSection& section(TrainConfig& c, CompressionSection*) { return c.compression; }
RunSection& section(TrainConfig& c, RunSection*) { return c.run; }

// Every element of `array`, each a string.
std::vector<std::string> strings_of(const toml::array& array, const std::string& name) {
  std::vector<std::string> out;
  for (const auto& item : array) out.push_back(as_string(item, name));
  return out;
}

void assign(std::vector<int64_t>& target, const toml::node& n, const std::string& name) {
  if (!n.is_array()) wrong_type(name, "an array of integers", n);
  target.clear();
  for (const auto& item : *n.as_array()) target.push_back(as_int(item, name));
}
// An array of arrays of strings; a plain array of strings is one group.
void assign(std::vector<std::vector<std::string>>& target, const toml::node& n,
            const std::string& name) {
  if (!n.is_array()) wrong_type(name, "an array of arrays of strings", n);
  target.clear();
  const toml::array& outer = *n.as_array();
  if (!outer.empty() && outer[0].is_string()) {
    target.push_back(strings_of(outer, name));
    return;
  }
  for (const auto& group : outer) {
    if (!group.is_array()) wrong_type(name, "an array of arrays of strings", group);
    target.push_back(strings_of(*group.as_array(), name));
  }
}

// The key's member of its section: field(&FsdpSection::sharding) is parallel.fsdp.sharding.
template <typename S, typename T>
Setter field(T S::*member) {
  return [member](TrainConfig& c, const toml::node& n, const std::string& name) {
    assign(section(c, static_cast<S*>(nullptr)).*member, n, name);
  };
}

template <typename T>
Setter model_field(T ModelConfig::*member) {
  return [member](TrainConfig& c, const toml::node& n, const std::string& name) {
    if constexpr (std::is_same_v<T, int64_t>) {
      c.model.*member = as_int(n, name);
    } else if constexpr (std::is_same_v<T, double>) {
      c.model.*member = as_double(n, name);
    } else {
      c.model.*member = as_bool(n, name);
    }
    c.model.name = "custom";
  };
}

// Every key the trainer understands. `model.preset` and `model.hf_config` replace the whole
// model, so they are applied before the keys that override single sizes.
const std::map<std::string, Setter>& known_keys() {
  static const std::
      map<std::string, Setter>
          keys =
              {
                  {"model.preset",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     c.model = model_preset(as_string(n, name));
                   }},
                  {"model.hf_config",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     c.model = model_config_from_hf_json(as_string(n, name));
                   }},
                  {"model.vocab_size",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     c.model.vocab_size = as_int(n, name);
                     c.model.vocab_size_set = true;
                   }},
                  {"model.init_from", field(&ModelSection::init_from)},
                  {"model.context_length", model_field(&ModelConfig::context_length)},
                  {"model.d_model", model_field(&ModelConfig::d_model)},
                  {"model.n_layers", model_field(&ModelConfig::n_layers)},
                  {"model.n_heads", model_field(&ModelConfig::n_heads)},
                  {"model.n_kv_heads", model_field(&ModelConfig::n_kv_heads)},
                  {"model.ffn_hidden", model_field(&ModelConfig::ffn_hidden)},
                  {"model.dropout", model_field(&ModelConfig::dropout)},
                  {"model.norm_eps", model_field(&ModelConfig::norm_eps)},
                  {"model.rope_theta", model_field(&ModelConfig::rope_theta)},
                  {"model.tie_embeddings", model_field(&ModelConfig::tie_embeddings)},
                  {"model.head_dim", model_field(&ModelConfig::head_dim)},
                  {"model.attention_bias", model_field(&ModelConfig::attention_bias)},
                  {"model.qk_norm", model_field(&ModelConfig::qk_norm)},
                  {"model.n_experts", model_field(&ModelConfig::n_experts)},
                  {"model.experts_per_token", model_field(&ModelConfig::experts_per_token)},
                  {"model.n_shared_experts", model_field(&ModelConfig::n_shared_experts)},
                  {"model.norm_topk_prob", model_field(&ModelConfig::norm_topk_prob)},
                  {"model.router_aux_loss_coef", model_field(&ModelConfig::router_aux_loss_coef)},
                  {"model.capacity_factor", model_field(&ModelConfig::capacity_factor)},
                  {"model.type_vocab_size", model_field(&ModelConfig::type_vocab_size)},
                  {"data.corpus",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     c.data.corpus.clear();
                     if (n.is_string()) {
                       c.data.corpus.push_back(*n.value<std::string>());
                       return;
                     }
                     if (!n.is_array()) wrong_type(name, "a path or an array of paths", n);
                     for (const auto& item : *n.as_array())
                       c.data.corpus.push_back(as_string(item, name));
                   }},
                  {"data.tokenizer", field(&DataSection::tokenizer)},
                  {"data.format", field(&DataSection::format)},
                  {"data.chat_template", field(&DataSection::chat_template)},
                  {"data.packing", field(&DataSection::packing)},
                  {"data.overlong", field(&DataSection::overlong)},
                  {"data.gpt2_dir", field(&DataSection::gpt2_dir)},
                  {"data.seq_len", field(&DataSection::seq_len)},
                  {"data.eval_sequences", field(&DataSection::eval_sequences)},
                  {"train.steps", field(&TrainSection::steps)},
                  {"train.micro_batch", field(&TrainSection::micro_batch)},
                  {"train.grad_accum", field(&TrainSection::grad_accum)},
                  {"train.global_batch", field(&TrainSection::global_batch)},
                  {"train.lr", field(&TrainSection::lr)},
                  {"train.min_lr", field(&TrainSection::min_lr)},
                  {"train.warmup", field(&TrainSection::warmup)},
                  {"train.schedule", field(&TrainSection::schedule)},
                  {"train.warmup_type", field(&TrainSection::warmup_type)},
                  {"train.optimizer", field(&TrainSection::optimizer)},
                  {"train.lamb_min_coeff", field(&TrainSection::lamb_min_coeff)},
                  {"train.lamb_max_coeff", field(&TrainSection::lamb_max_coeff)},
                  {"train.freeze_step", field(&TrainSection::freeze_step)},
                  {"train.lamb_coeff_beta", field(&TrainSection::lamb_coeff_beta)},
                  {"train.var_freeze_step", field(&TrainSection::var_freeze_step)},
                  {"train.var_update_scaler", field(&TrainSection::var_update_scaler)},
                  {"train.local_step_scaler", field(&TrainSection::local_step_scaler)},
                  {"train.local_step_clipper", field(&TrainSection::local_step_clipper)},
                  {"train.lamb_factor_min", field(&TrainSection::lamb_factor_min)},
                  {"train.lamb_factor_max", field(&TrainSection::lamb_factor_max)},
                  {"train.lamb_factor_threshold", field(&TrainSection::lamb_factor_threshold)},
                  {"train.layer_drop", field(&TrainSection::layer_drop)},
                  {"train.layer_drop_theta", field(&TrainSection::layer_drop_theta)},
                  {"train.layer_drop_gamma", field(&TrainSection::layer_drop_gamma)},
                  {"train.random_ltd_layers", field(&TrainSection::random_ltd_layers)},
                  {"train.random_ltd_min", field(&TrainSection::random_ltd_min)},
                  {"train.random_ltd_max", field(&TrainSection::random_ltd_max)},
                  {"train.random_ltd_steps", field(&TrainSection::random_ltd_steps)},
                  {"train.random_ltd_step", field(&TrainSection::random_ltd_step)},
                  {"train.random_ltd_model_layers", field(&TrainSection::random_ltd_model_layers)},
                  {"train.mlm_probability", field(&TrainSection::mlm_probability)},
                  {"train.weight_decay", field(&TrainSection::weight_decay)},
                  {"train.beta1", field(&TrainSection::beta1)},
                  {"train.beta2", field(&TrainSection::beta2)},
                  {"train.eps", field(&TrainSection::eps)},
                  {"train.bias_correction", field(&TrainSection::bias_correction)},
                  {"train.clip", field(&TrainSection::clip)},
                  {"train.max_skipped", field(&TrainSection::max_skipped)},
                  {"train.seed", field(&TrainSection::seed)},
                  {"train.eval_every", field(&TrainSection::eval_every)},
                  {"train.eval_batches", field(&TrainSection::eval_batches)},
                  {"train.checkpoint_every", field(&TrainSection::checkpoint_every)},
                  {"train.keep_checkpoints", field(&TrainSection::keep_checkpoints)},
                  {"train.final_checkpoint", field(&TrainSection::final_checkpoint)},
                  {"train.activation_checkpointing",
                   field(&TrainSection::activation_checkpointing)},
                  {"train.chunked_loss", field(&TrainSection::chunked_loss)},
                  {"train.attention", field(&TrainSection::attention)},
                  {"train.loss_chunk_tokens", field(&TrainSection::loss_chunk_tokens)},
                  {"train.sample_tokens", field(&TrainSection::sample_tokens)},
                  {"train.sample_prompt", field(&TrainSection::sample_prompt)},
                  {"train.sample_temperature", field(&TrainSection::sample_temperature)},
                  {"train.sample_top_k", field(&TrainSection::sample_top_k)},
                  {"precision.autocast", field(&PrecisionSection::autocast)},
                  {"precision.loss_scale",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     if (n.is_number()) {
                       c.precision.loss_scale = std::to_string(*n.value<double>());
                     } else {
                       c.precision.loss_scale = as_string(n, name);
                     }
                   }},
                  {"precision.initial_scale", field(&PrecisionSection::initial_scale)},
                  {"precision.scale_window", field(&PrecisionSection::scale_window)},
                  {"precision.min_scale", field(&PrecisionSection::min_scale)},
                  {"precision.hysteresis", field(&PrecisionSection::hysteresis)},
                  {"precision.consecutive_hysteresis",
                   field(&PrecisionSection::consecutive_hysteresis)},
                  {"precision.fp8", field(&PrecisionSection::fp8)},
                  {"precision.fp8_amax_history", field(&PrecisionSection::fp8_amax_history)},
                  {"precision.fp8_amax_algo", field(&PrecisionSection::fp8_amax_algo)},
                  {"precision.fp8_margin", field(&PrecisionSection::fp8_margin)},
                  {"parallel.strategy", field(&ParallelSection::strategy)},
                  {"parallel.tp", field(&ParallelSection::tp)},
                  {"parallel.cp", field(&ParallelSection::cp)},
                  {"parallel.ep", field(&ParallelSection::ep)},
                  {"parallel.sequence_parallel", field(&ParallelSection::sequence_parallel)},
                  {"parallel.pp", field(&ParallelSection::pp)},
                  {"parallel.pp_schedule", field(&ParallelSection::pp_schedule)},
                  {"parallel.pp_virtual_stages", field(&ParallelSection::pp_virtual_stages)},
                  {"parallel.pp_microbatches",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     c.parallel.pp_microbatches = as_int(n, name);
                     c.train.grad_accum =
                         c.parallel.pp_microbatches;  // the same setting under the pipeline's name
                   }},
                  {"parallel.pp_split",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     if (!n.is_array())
                       wrong_type(name, "an array of block counts, one per stage", n);
                     c.parallel.pp_split.clear();
                     for (const auto& item : *n.as_array())
                       c.parallel.pp_split.push_back(as_int(item, name));
                   }},
                  {"parallel.ddp.bucket_cap_mb", field(&DdpSection::bucket_cap_mb)},
                  {"parallel.ddp.find_unused_parameters",
                   field(&DdpSection::find_unused_parameters)},
                  {"parallel.ddp.comm_hook", field(&DdpSection::comm_hook)},
                  {"parallel.fsdp.sharding", field(&FsdpSection::sharding)},
                  {"parallel.fsdp.replicate", field(&FsdpSection::replicate)},
                  {"parallel.fsdp.wrap", field(&FsdpSection::wrap)},
                  {"parallel.fsdp.min_params", field(&FsdpSection::min_params)},
                  {"parallel.fsdp.wrap_classes",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     if (!n.is_array()) wrong_type(name, "an array of class names", n);
                     c.parallel.fsdp.wrap_classes = strings_of(*n.as_array(), name);
                   }},
                  {"parallel.fsdp.prefetch", field(&FsdpSection::prefetch)},
                  {"parallel.fsdp.forward_prefetch", field(&FsdpSection::forward_prefetch)},
                  {"parallel.fsdp.limit_all_gathers", field(&FsdpSection::limit_all_gathers)},
                  {"parallel.fsdp.cpu_offload", field(&FsdpSection::cpu_offload)},
                  {"parallel.zero.stage", field(&ZeroSection::stage)},
                  {"parallel.zero.offload_optimizer", field(&ZeroSection::offload_optimizer)},
                  {"parallel.zero.offload_param", field(&ZeroSection::offload_param)},
                  {"parallel.zero.nvme_path", field(&ZeroSection::nvme_path)},
                  {"parallel.zero.pin_memory", field(&ZeroSection::pin_memory)},
                  {"parallel.zero.overlap_comm", field(&ZeroSection::overlap_comm)},
                  {"parallel.zero.contiguous_gradients", field(&ZeroSection::contiguous_gradients)},
                  {"parallel.zero.reduce_bucket_size", field(&ZeroSection::reduce_bucket_size)},
                  {"parallel.zero.allgather_bucket_size",
                   field(&ZeroSection::allgather_bucket_size)},
                  {"parallel.zero.prefetch_bucket_size", field(&ZeroSection::prefetch_bucket_size)},
                  {"parallel.zero.param_persistence_threshold",
                   field(&ZeroSection::param_persistence_threshold)},
                  {"parallel.zero.max_live_parameters", field(&ZeroSection::max_live_parameters)},
                  {"precision.param_dtype", field(&PrecisionSection::param_dtype)},
                  {"precision.reduce_dtype", field(&PrecisionSection::reduce_dtype)},
                  {"precision.buffer_dtype", field(&PrecisionSection::buffer_dtype)},
                  {"lora.rank", field(&LoraSection::rank)},
                  {"lora.alpha", field(&LoraSection::alpha)},
                  {"lora.dropout", field(&LoraSection::dropout)},
                  {"lora.target_modules",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     c.lora.target_modules.clear();
                     if (n.is_string()) {
                       c.lora.target_modules.push_back(*n.value<std::string>());
                       return;
                     }
                     if (!n.is_array())
                       wrong_type(name, "a module name pattern or an array of them", n);
                     c.lora.target_modules = strings_of(*n.as_array(), name);
                   }},
                  {"lora.base_dtype", field(&LoraSection::base_dtype)},
                  {"train.autotune", field(&TrainSection::autotune)},
                  {"train.autotune_min_micro_batch",
                   field(&TrainSection::autotune_min_micro_batch)},
                  {"train.autotune_max_micro_batch",
                   field(&TrainSection::autotune_max_micro_batch)},
                  {"train.autotune_max_batch", field(&TrainSection::autotune_max_batch)},
                  {"train.autotune_steps", field(&TrainSection::autotune_steps)},
                  {"train.autotune_first_timed", field(&TrainSection::autotune_first_timed)},
                  {"compression.weight_bits", field(&CompressionSection::weight_bits)},
                  {"compression.weight_modules", field(&CompressionSection::weight_modules)},
                  {"compression.weight_groups", field(&CompressionSection::weight_groups)},
                  {"compression.weight_type", field(&CompressionSection::weight_type)},
                  {"compression.weight_offset", field(&CompressionSection::weight_offset)},
                  {"compression.activation_bits", field(&CompressionSection::activation_bits)},
                  {"compression.activation_modules",
                   field(&CompressionSection::activation_modules)},
                  {"compression.activation_type", field(&CompressionSection::activation_type)},
                  {"compression.activation_offset", field(&CompressionSection::activation_offset)},
                  {"run.dir", field(&RunSection::dir)},
                  {"run.log_every", field(&RunSection::log_every)},
                  {"run.resume", field(&RunSection::resume)},
                  {"run.overwrite", field(&RunSection::overwrite)},
                  {"run.threads", field(&RunSection::threads)},
                  {"run.device", field(&RunSection::device)},
                  {"run.freed_memory", field(&RunSection::freed_memory)},
                  {"run.timeout", field(&RunSection::timeout)},
                  {"run.memory_check", field(&RunSection::memory_check)},
                  {"run.checkpoint_async", field(&RunSection::checkpoint_async)},
                  {"run.fault_tolerance", field(&RunSection::fault_tolerance)},
                  {"run.trace", field(&RunSection::trace)},
                  {"run.trace_steps",
                   [](TrainConfig& c, const toml::node& n, const std::string& name) {
                     const toml::array* range = n.as_array();
                     if (!range || range->size() != 2) {
                       wrong_type(name, "[first, last], the steps to trace (1-based, inclusive)",
                                  n);
                     }
                     c.run.trace_first = as_int(*range->get(0), name);
                     c.run.trace_last = as_int(*range->get(1), name);
                   }},
              };
  return keys;
}

struct Entry {
  std::string name;  // section.key
  const toml::node* node;
};

// Edit distance between two key names (insertions, deletions, substitutions).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The known key nearest to `name` (a typo of at most a third of its length), or "".
std::string closest_key(const std::string& name) {
  std::string best;
  size_t best_distance = std::max<size_t>(1, name.size() / 3) + 1;
  for (const auto& [key, setter] : known_keys()) {
    const size_t d = edit_distance(name, key);
    if (d < best_distance) {
      best = key;
      best_distance = d;
    }
  }
  return best;
}

// Flattens tables into dotted names ("parallel.ddp.bucket_cap_mb"); every leaf must be known.
void collect_table(const toml::table& table, const std::string& prefix, const std::string& source,
                   std::vector<Entry>& out) {
  for (const auto& [key, node] : table) {
    const std::string name = prefix + std::string(key.str());
    if (known_keys().count(name)) {
      out.push_back(Entry{name, &node});
    } else if (node.is_table()) {
      collect_table(*node.as_table(), name + ".", source, out);
    } else {
      const std::string guess = closest_key(name);
      throw std::invalid_argument(source + ": unknown config key '" + name + "'" +
                                  (!guess.empty() ? " (did you mean '" + guess + "'?)"
                                   : prefix.empty()
                                       ? " (keys belong in [model], [data], [train], [parallel], "
                                         "[precision], [lora], [compression] or [run])"
                                       : ""));
    }
  }
}

void collect(const toml::table& doc, const std::string& source, std::vector<Entry>& out) {
  collect_table(doc, "", source, out);
}

toml::table parse_toml(const std::string& text, const std::string& source) {
  try {
    return toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream message;
    message << source << ":" << e.source().begin.line << ": " << e.description();
    throw std::invalid_argument(message.str());
  }
}

// A bare word as a TOML basic string.
std::string toml_quote(const std::string& text) {
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  return quoted + "\"";
}

bool is_model_replacement(const std::string& name) {
  return name == "model.preset" || name == "model.hf_config";
}

}  // namespace

TrainConfig parse_train_config(const std::string& toml_text, const std::string& source,
                               const std::vector<std::string>& overrides) {
  std::vector<toml::table> documents;
  documents.reserve(overrides.size() + 1);
  documents.push_back(parse_toml(toml_text, source));
  std::vector<Entry> entries;
  collect(documents.back(), source, entries);
  for (const auto& override_text : overrides) {
    const size_t eq = override_text.find('=');
    const size_t dot = override_text.find('.');
    if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
      throw std::invalid_argument("--set '" + override_text +
                                  "' is not of the form section.key=value");
    }
    const std::string section = override_text.substr(0, dot);
    const std::string key = override_text.substr(dot + 1, eq - dot - 1);  // may be dotted
    const std::string value = override_text.substr(eq + 1);
    // The value is TOML (numbers, booleans, quoted strings, arrays); a bare word is a string.
    toml::table doc;
    try {
      doc = toml::parse("[" + section + "]\n" + key + " = " + value + "\n");
    } catch (const toml::parse_error& e) {
      // Something written like a number is one that TOML refused (too large, malformed), not a
      // bare word: a digit first (after a sign), then only what numbers are written with, or a
      // 0x/0o/0b prefix. "1f1b" is a word.
      const size_t first = !value.empty() && (value[0] == '-' || value[0] == '+') ? 1 : 0;
      const bool prefixed = value.size() > first + 1 && value[first] == '0' &&
                            std::string("xob").find(value[first + 1]) != std::string::npos;
      const bool numeric =
          value.size() > first && std::isdigit(static_cast<unsigned char>(value[first])) &&
          (prefixed || value.find_first_not_of("0123456789+-._eE") == std::string::npos);
      if (numeric) {
        throw std::invalid_argument("--set " + section + "." + key + ": '" + value +
                                    "' is not a valid number (" + std::string(e.description()) +
                                    "; integers must fit in 64 bits)");
      }
      try {
        doc = toml::parse("[" + section + "]\n" + key + " = " + toml_quote(value) + "\n");
      } catch (const toml::parse_error& quoted) {
        throw std::invalid_argument("--set '" + override_text + "': not a valid setting (" +
                                    std::string(quoted.description()) + ")");
      }
    }
    documents.push_back(std::move(doc));
    collect(documents.back(), "--set " + section + "." + key, entries);
  }
  TrainConfig config;
  bool kv_heads_given = false;
  for (const bool replacement : {true, false}) {
    for (const auto& entry : entries) {
      if (is_model_replacement(entry.name) == replacement) {
        known_keys().at(entry.name)(config, *entry.node, entry.name);
        kv_heads_given = kv_heads_given || entry.name == "model.n_kv_heads";
      }
    }
  }
  // GPT-2 and BERT have no grouped-query attention: their key/value heads are their heads,
  // whatever model.n_heads was changed to (an explicit model.n_kv_heads is still checked).
  if (config.model.family != ModelFamily::kLlama && !kv_heads_given) {
    config.model.n_kv_heads = config.model.n_heads;
  }
  config.validate();
  return config;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  // A FIFO or a device would be read until it ends, which may be never.
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw std::invalid_argument("config file '" + path + "' is not a regular file");
  }
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("config file '" + path + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_train_config(text.str(), path, overrides);
}

namespace {

// The validators' one check: `message` as the error when !ok.
void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

// ZeRO offloads optimizer state or parameters to files (parallel.zero.* = "nvme").
bool zero_offloads_to_files(const ZeroSection& zero) {
  return zero.offload_optimizer == OffloadDevice::kNvme ||
         zero.offload_param == OffloadDevice::kNvme;
}

// LAMB's trust ratio is a whole tensor's, and 1-bit Adam and LAMB average the momentum in place
// of the gradients: they need every parameter whole on every data-parallel rank.
void validate_optimizer(const TrainConfig& c) {
  const TrainSection& train = c.train;
  require(train.optimizer == "adamw" || train.optimizer == "lamb" ||
              train.optimizer == "onebit_adam" || train.optimizer == "onebit_lamb" ||
              train.optimizer == "zero_one_adam",
          "train.optimizer must be \"adamw\", \"lamb\", \"onebit_adam\", \"onebit_lamb\" or "
          "\"zero_one_adam\", got \"" +
              train.optimizer + "\"");
  if (train.optimizer == "adamw") return;
  const std::string name = "train.optimizer = \"" + train.optimizer + "\"";
  const auto strategy = c.parallel.strategy;
  require(
      strategy == ParallelStrategy::kNone || strategy == ParallelStrategy::kDdp,
      name + " with parallel.strategy = \"" + to_string(strategy) + "\": " +
          (train.optimizer == "lamb" ? "LAMB scales each tensor by its own norms"
                                     : "1-bit Adam, 1-bit LAMB and 0/1 Adam average the momentum") +
          ", which needs every parameter whole on every rank; use parallel.strategy = "
          "\"ddp\" (DeepSpeed runs it without ZeRO too)");
  require(c.parallel.tp == 1 && c.parallel.cp == 1 && c.parallel.ep == 1,
          name +
              " with tensor, context or expert parallelism: this version runs it with "
              "data parallelism only (parallel.tp, cp and ep = 1)");
  require(train.lamb_min_coeff > 0 && train.lamb_min_coeff <= train.lamb_max_coeff,
          "train.lamb_min_coeff must be positive and at most train.lamb_max_coeff");
  if (train.optimizer == "lamb") return;
  require(train.freeze_step >= 0, "train.freeze_step must be >= 0");
  require(train.var_freeze_step >= 0, "train.var_freeze_step must be >= 0");
  require(
      train.var_update_scaler >= 1 && train.local_step_scaler >= 1 && train.local_step_clipper >= 1,
      "train.var_update_scaler, train.local_step_scaler and train.local_step_clipper must be "
      ">= 1");
  require(!train.bias_correction,
          name + " applies no bias correction (as DeepSpeed's): set train.bias_correction = false");
  require(c.parallel.pp == 1 && c.run.fault_tolerance == "none",
          name +
              " with a pipeline or run.fault_tolerance: this version averages the compressed "
              "momentum over the whole data-parallel world only");
  require(train.lamb_coeff_beta >= 0 && train.lamb_coeff_beta < 1,
          "train.lamb_coeff_beta must be in [0, 1)");
  require(train.lamb_factor_min > 0 && train.lamb_factor_min <= train.lamb_factor_max &&
              train.lamb_factor_threshold >= 0,
          "train.lamb_factor_min must be positive and at most train.lamb_factor_max, "
          "train.lamb_factor_threshold >= 0");
}

// Whether each rank holds whole blocks and whole sequences: no tensor, pipeline, context or
// expert parallelism.
bool whole_blocks_and_sequences(const ParallelSection& p) {
  return p.tp == 1 && p.pp == 1 && p.cp == 1 && p.ep == 1;
}

// Progressive layer dropping: its schedule, and the layouts that run it (data parallelism, whose
// gradients of a block that did not run are zeros in the all-reduce).
void validate_layer_drop(const TrainConfig& c) {
  const TrainSection& train = c.train;
  require(train.layer_drop == "none" || train.layer_drop == "progressive",
          "train.layer_drop must be \"none\" or \"progressive\", got \"" + train.layer_drop + "\"");
  require(train.layer_drop_theta > 0 && train.layer_drop_theta <= 1,
          "train.layer_drop_theta must be in (0, 1] (the share of blocks kept in the long run)");
  require(train.layer_drop_gamma >= 0, "train.layer_drop_gamma must be >= 0");
  if (train.layer_drop == "none") return;
  require(c.parallel.strategy == ParallelStrategy::kNone ||
              c.parallel.strategy == ParallelStrategy::kDdp,
          "train.layer_drop = \"progressive\" runs with parallel.strategy \"none\" or \"ddp\" "
          "(DeepSpeed's ZeRO stage 0): FSDP's and ZeRO's hooks gather and reduce each block "
          "as it runs");
  require(whole_blocks_and_sequences(c.parallel),
          "train.layer_drop = \"progressive\" with tensor, pipeline, context or expert "
          "parallelism (parallel.tp, pp, cp and ep must be 1)");
}

// Random layer-token dropping: its schedule, the blocks it names, and the layouts that run it
// (each rank's whole sequences through blocks that are not split).
void validate_random_ltd(const TrainConfig& c) {
  const TrainSection& train = c.train;
  if (train.random_ltd_layers.empty()) return;
  const int64_t n_layers = c.model.n_layers;
  require(train.random_ltd_model_layers == 0 || train.random_ltd_model_layers == n_layers,
          "train.random_ltd_model_layers = " + std::to_string(train.random_ltd_model_layers) +
              " (the blocks train.random_ltd_layers was written for) but model.n_layers = " +
              std::to_string(n_layers));
  std::vector<int64_t> seen;
  for (int64_t id : train.random_ltd_layers) {
    require(id >= 0 && id < n_layers, "train.random_ltd_layers: block " + std::to_string(id) +
                                          " is not one of the model's blocks 0.." +
                                          std::to_string(n_layers - 1));
    require(std::find(seen.begin(), seen.end(), id) == seen.end(),
            "train.random_ltd_layers names block " + std::to_string(id) + " twice");
    seen.push_back(id);
  }
  require(train.random_ltd_min >= 1, "train.random_ltd_min must be >= 1 (tokens)");
  require(train.random_ltd_max >= train.random_ltd_min,
          "train.random_ltd_max must be >= train.random_ltd_min");
  require(train.random_ltd_steps >= 1, "train.random_ltd_steps must be >= 1");
  require(train.random_ltd_step >= 1, "train.random_ltd_step must be >= 1 (tokens)");
  require(train.layer_drop == "none", "train.random_ltd_layers with train.layer_drop = \"" +
                                          train.layer_drop + "\": use one of the two");
  require(!c.model.moe(),
          "train.random_ltd_layers with a mixture-of-experts model: this version "
          "drops tokens in dense blocks only");
  require(whole_blocks_and_sequences(c.parallel),
          "train.random_ltd_layers with tensor, pipeline, context or expert parallelism "
          "(parallel.tp, pp, cp and ep must be 1): a block's tokens are drawn from the whole "
          "sequence a rank holds");
}

// A bidirectional model (BERT) trains on masked tokens of a plain corpus, split by data
// parallelism only: its layers have no tensor-parallel plan, and the pipeline, context and
// expert splits and random layer-token dropping assume causal attention or decoder blocks.
void validate_masked_lm(const TrainConfig& c) {
  require(
      std::isfinite(c.train.mlm_probability) && c.train.mlm_probability > 0.0 &&
          c.train.mlm_probability <= 1.0,
      "train.mlm_probability must be in (0, 1], got " + std::to_string(c.train.mlm_probability));
  if (!c.model.bidirectional()) return;
  const std::string model =
      "the " + to_string(c.model.family) + " family (a masked-language model)";
  require(c.parallel.tp == 1 && c.parallel.pp == 1 && c.parallel.cp == 1 && c.parallel.ep == 1,
          "parallel.tp, pp, cp and ep must be 1 for " + model +
              ": this version splits it by data parallelism only (none, ddp, fsdp, zero)");
  require(c.data.format == "text", "data.format = \"" + c.data.format + "\" with " + model +
                                       ": it trains on masked tokens of a plain corpus (\"text\")");
  require(c.train.random_ltd_layers.empty(),
          "train.random_ltd_layers with " + model +
              ": random layer-token dropping is implemented for decoders");
}

// fp8 training: its recipe, and what it runs with (the blocks' own, whole linear layers).
void validate_fp8(const TrainConfig& c) {
  const PrecisionSection& p = c.precision;
  require(p.fp8 == "none" || p.fp8 == "e4m3" || p.fp8 == "hybrid",
          "precision.fp8 must be \"none\", \"e4m3\" or \"hybrid\", got \"" + p.fp8 + "\"");
  require(p.fp8_amax_history >= 1 && p.fp8_amax_history <= 1000000,
          "precision.fp8_amax_history must be between 1 and 1000000 (steps)");
  require(p.fp8_amax_algo == "max" || p.fp8_amax_algo == "most_recent",
          "precision.fp8_amax_algo must be \"max\" or \"most_recent\", got \"" + p.fp8_amax_algo +
              "\"");
  require(p.fp8_margin >= 0 && p.fp8_margin <= 30, "precision.fp8_margin must be between 0 and 30");
  if (p.fp8 == "none") return;
  require(whole_blocks_and_sequences(c.parallel),
          "precision.fp8 with tensor, pipeline, context or expert parallelism (parallel.tp, pp, "
          "cp and ep must be 1)");
  require(c.lora.rank == 0,
          "precision.fp8 with LoRA adapters (lora.rank > 0): this version "
          "computes fp8 with whole, trained linear layers");
  require(!c.compression.enabled(),
          "precision.fp8 with [compression]'s quantization: use one of the two");
  require(!c.model.moe(),
          "precision.fp8 with a mixture-of-experts model: this version rounds "
          "the dense blocks' linear layers only");
  require(p.autocast != "fp16",
          "precision.fp8 with precision.autocast = \"fp16\": use \"bf16\" "
          "(what accelerate's fp8 runs beside) or \"none\"");
  require(c.run.fault_tolerance == "none",
          "precision.fp8 with run.fault_tolerance = \"" + c.run.fault_tolerance +
              "\": a replica that rejoins would not take the others' fp8 scales");
}

// The micro-batch search's range and timing.
void validate_autotune(const TrainConfig& c) {
  const TrainSection& t = c.train;
  require(
      t.autotune_min_micro_batch >= 1 && t.autotune_min_micro_batch <= t.autotune_max_micro_batch,
      "train.autotune_min_micro_batch must be at least 1 and at most "
      "train.autotune_max_micro_batch");
  require(t.autotune_max_batch >= 0, "train.autotune_max_batch must be >= 0 (0: no limit)");
  require(t.autotune_first_timed >= 1 && t.autotune_first_timed <= t.autotune_steps,
          "train.autotune_first_timed must be between 1 and train.autotune_steps");
  if (!t.autotune) return;
  require(c.run.fault_tolerance != "replicas",
          "train.autotune with run.fault_tolerance = \"replicas\": set train.micro_batch");
  require(c.run.resume.empty(),
          "train.autotune with run.resume: the micro-batch is tuned when a run starts; resume "
          "with train.micro_batch set to the one it chose (run.json)");
}

// Quantization-aware training's groups, and the strategies that see whole weights in forward.
void validate_compression(const TrainConfig& c) {
  const CompressionSection& q = c.compression;
  auto check = [&](const char* what, const std::vector<int64_t>& bits,
                   const std::vector<std::vector<std::string>>& modules, const std::string& type,
                   int64_t offset, int64_t lowest) {
    const std::string key = std::string("compression.") + what;
    require(bits.size() == modules.size(),
            key + "_bits has " + std::to_string(bits.size()) + " entries and " + key + "_modules " +
                std::to_string(modules.size()) + " groups: one bit width per group");
    for (size_t i = 0; i < bits.size(); ++i) {
      require(bits[i] >= lowest && bits[i] <= 16, key + "_bits must be between " +
                                                      std::to_string(lowest) + " and 16, got " +
                                                      std::to_string(bits[i]));
      require(!modules[i].empty(), key + "_modules group " + std::to_string(i + 1) +
                                       " is empty: name the layers it quantizes");
      require(bits[i] > 2 || type == "symmetric",
              key + "_type = \"" + type + "\" with " + std::to_string(bits[i]) +
                  " bits: binary and ternary quantization are symmetric");
    }
    require(type == "symmetric" || type == "asymmetric",
            key + "_type must be \"symmetric\" or \"asymmetric\", got \"" + type + "\"");
    require(offset >= 0, key + "_offset must be >= 0, got " + std::to_string(offset));
  };
  check("weight", q.weight_bits, q.weight_modules, q.weight_type, q.weight_offset, 1);
  check("activation", q.activation_bits, q.activation_modules, q.activation_type,
        q.activation_offset, 3);
  require(q.weight_groups >= 1,
          "compression.weight_groups must be at least 1, got " + std::to_string(q.weight_groups));
  if (!q.enabled()) return;
  require(c.parallel.tp == 1,
          "compression with parallel.tp > 1: a tensor-parallel rank holds part of each weight, "
          "and quantization groups span the whole one");
  require(c.parallel.pp == 1 && c.parallel.ep == 1,
          "compression with parallel.pp > 1 or parallel.ep > 1 is not available: every rank "
          "checks the groups against the whole model");
  require(c.lora.rank == 0,
          "compression with lora.rank > 0: quantize a frozen base with lora.base_dtype = "
          "\"nf4\" (QLoRA) instead");
}

// The pipeline's settings against each other and the model; the world size is checked with the
// mesh (train_mesh_shape), the split and the schedule by check_parallel_settings.
void validate_pipeline(const TrainConfig& c) {
  require(c.parallel.pp >= 1,
          "parallel.pp must be at least 1, got " + std::to_string(c.parallel.pp));
  require(c.parallel.pp_virtual_stages >= 1, "parallel.pp_virtual_stages must be at least 1, got " +
                                                 std::to_string(c.parallel.pp_virtual_stages));
  const PipelineScheduleKind kind = c.parallel.pp_schedule;
  require(c.parallel.pp_microbatches == 0 || c.parallel.pp_microbatches == c.train.grad_accum,
          "parallel.pp_microbatches = " + std::to_string(c.parallel.pp_microbatches) +
              " and train.grad_accum = " + std::to_string(c.train.grad_accum) +
              " disagree: they are one setting (the micro-batches per step); set one of them");
  if (c.parallel.pp == 1) {
    require(c.parallel.pp_split.empty() && c.parallel.pp_virtual_stages == 1,
            "parallel.pp_split and parallel.pp_virtual_stages need parallel.pp > 1");
    return;
  }
  // Under a pipeline a stage's gradients accumulate whole through the step (its micro-batches'
  // backwards interleave with forwards): ZeRO-2's sharded gradients and ZeRO-3's per-unit
  // gathering have nothing to act on, as in DeepSpeed, whose pipeline takes stage 1 only.
  require(c.parallel.strategy != ParallelStrategy::kZero || c.parallel.zero.stage == 1,
          "parallel.pp > 1 with parallel.zero.stage = " + std::to_string(c.parallel.zero.stage) +
              ": pipeline stages combine with ZeRO stage 1 (or parallel.strategy = \"fsdp\", "
              "which shards the parameters between steps)");
  require(c.parallel.strategy == ParallelStrategy::kDdp ||
              c.parallel.strategy == ParallelStrategy::kNone || c.precision.param_dtype == "fp32",
          "precision.param_dtype = \"" + c.precision.param_dtype +
              "\" with parallel.pp > 1: a pipeline stage accumulates its gradients over the "
              "micro-batches in the parameters' dtype; keep fp32 parameters and compute in bf16 "
              "with precision.autocast = \"bf16\"");
  require(c.parallel.strategy != ParallelStrategy::kZero ||
              (c.parallel.zero.offload_optimizer == OffloadDevice::kNone &&
               c.parallel.zero.offload_param == OffloadDevice::kNone),
          "parallel.zero.offload_optimizer / offload_param with parallel.pp > 1: offload is not "
          "combined with pipeline stages");
  require(c.lora.rank == 0,
          "lora.rank > 0 with parallel.pp > 1: adapters are not split into pipeline stages; use "
          "data parallelism (ddp or fsdp) for LoRA");
  const int stages = static_cast<int>(c.parallel.pp * c.parallel.pp_virtual_stages);
  if (kind == PipelineScheduleKind::kInterleaved1F1B && c.parallel.pp_split.empty()) {
    require(c.model.n_layers % stages == 0,
            "parallel.pp_schedule = \"interleaved_1f1b\" gives every stage the same blocks: the "
            "model's " +
                std::to_string(c.model.n_layers) +
                " blocks do not divide into parallel.pp x parallel.pp_virtual_stages = " +
                std::to_string(stages) + " stages (or give parallel.pp_split)");
  }
  // The split and the schedule against the micro-batches are the pipeline's own rules:
  // check_parallel_settings (parallel/parallelize.h) applies them.
}

// Context parallelism against the sequence, the attention kernel and the other parallelisms;
// the world size is checked with the mesh (train_mesh_shape).
void validate_context_parallel(const TrainConfig& c) {
  const int64_t cp = c.parallel.cp;
  require(cp >= 1, "parallel.cp must be at least 1, got " + std::to_string(cp));
  if (cp == 1) return;
  require(c.data.seq_len % (2 * cp) == 0,
          "data.seq_len " + std::to_string(c.data.seq_len) +
              " is not divisible by 2 x parallel.cp = " + std::to_string(2 * cp) +
              ": each of the cp ranks holds two of 2 cp equal chunks");
  require(c.train.attention == "auto" || c.train.attention == "blockwise",
          "parallel.cp > 1 splits attention with the blockwise kernel (ring attention), but "
          "train.attention is \"" +
              c.train.attention + "\"");
  require(c.model.dropout == 0.0,
          "parallel.cp > 1 needs model.dropout = 0: ring attention is blockwise attention, which "
          "applies no attention dropout");
  require(c.parallel.strategy != ParallelStrategy::kNone,
          "parallel.cp > 1 needs parallel.strategy \"ddp\", \"fsdp\" or \"zero\": each rank's "
          "gradients come from part of the sequences and are summed across the cp group as data "
          "parallelism's are");
}

// Expert parallelism against the model and the other settings; ep against the data-parallel
// ranks is checked with the mesh (train_mesh_shape).
void validate_expert_parallel(const TrainConfig& c) {
  const int64_t ep = c.parallel.ep;
  require(ep >= 1, "parallel.ep must be at least 1, got " + std::to_string(ep));
  if (ep == 1) return;
  require(c.model.moe(),
          "parallel.ep = " + std::to_string(ep) +
              " splits the experts of a mixture-of-experts model, but model.n_experts is 0");
  require(c.model.n_experts % ep == 0,
          "model.n_experts " + std::to_string(c.model.n_experts) +
              " is not divisible by parallel.ep = " + std::to_string(ep) +
              ": each rank of an expert-parallel group holds n_experts / ep of them");
  require(c.parallel.strategy != ParallelStrategy::kNone,
          "parallel.ep > 1 needs parallel.strategy \"ddp\", \"fsdp\" or \"zero\": the experts "
          "are split over data-parallel ranks");
  require(c.lora.rank == 0,
          "lora.rank > 0 with parallel.ep > 1: this version does not split adapted experts "
          "across ranks; train LoRA on a mixture-of-experts model with parallel.ep = 1");
  require(!zero_offloads_to_files(c.parallel.zero),
          "parallel.ep > 1 with ZeRO offload to nvme: this version keeps the experts' shards in "
          "memory; offload to \"cpu\" or use parallel.ep = 1");
}

}  // namespace

void TrainConfig::validate() const {
  std::error_code error;
  require(data.tokenizer.empty() || data.tokenizer == "byte" || data.tokenizer == "gpt2" ||
              std::filesystem::exists(data.tokenizer, error),
          "data.tokenizer must be \"byte\", \"gpt2\" or a tokenizer.json file or model folder, "
          "got \"" +
              data.tokenizer + "\", which does not exist");
  require(data.format == "text" || data.format == "chat" || data.format == "prompt_completion",
          "data.format must be \"text\", \"chat\" or \"prompt_completion\", got \"" + data.format +
              "\"");
  require(data.overlong == "truncate" || data.overlong == "drop",
          "data.overlong must be \"truncate\" or \"drop\", got \"" + data.overlong + "\"");
  require(data.seq_len >= 1, "data.seq_len must be at least 1");
  require(data.seq_len <= model.context_length,
          "data.seq_len " + std::to_string(data.seq_len) + " exceeds the model's context length " +
              std::to_string(model.context_length) + " (model.context_length)");
  require(model.sliding_window == 0 || data.seq_len <= model.sliding_window,
          "data.seq_len " + std::to_string(data.seq_len) +
              " exceeds the model's sliding attention " + "window of " +
              std::to_string(model.sliding_window) +
              " tokens, which shardtrain does not implement: set data.seq_len to at most " +
              std::to_string(model.sliding_window));
  require(data.eval_sequences >= 0, "data.eval_sequences must be >= 0");
  require(train.steps >= 1, "train.steps must be at least 1");
  require(train.micro_batch >= 1, "train.micro_batch must be at least 1");
  require(train.grad_accum >= 1, "train.grad_accum must be at least 1");
  require(train.global_batch >= 0,
          "train.global_batch must be >= 0 (0: micro_batch x grad_accum x data-parallel ranks)");
  // NaN fails every comparison below and inf passes "positive": name non-finite values first.
  for (const auto& [key, value] : {std::pair<const char*, double>{"train.lr", train.lr},
                                   {"train.min_lr", train.min_lr},
                                   {"train.weight_decay", train.weight_decay},
                                   {"train.lamb_min_coeff", train.lamb_min_coeff},
                                   {"train.lamb_max_coeff", train.lamb_max_coeff},
                                   {"train.lamb_coeff_beta", train.lamb_coeff_beta},
                                   {"train.lamb_factor_min", train.lamb_factor_min},
                                   {"train.lamb_factor_max", train.lamb_factor_max},
                                   {"train.lamb_factor_threshold", train.lamb_factor_threshold},
                                   {"train.layer_drop_theta", train.layer_drop_theta},
                                   {"train.layer_drop_gamma", train.layer_drop_gamma},
                                   {"train.beta1", train.beta1},
                                   {"train.beta2", train.beta2},
                                   {"train.eps", train.eps},
                                   {"train.clip", train.clip},
                                   {"train.sample_temperature", train.sample_temperature},
                                   {"precision.initial_scale", precision.initial_scale},
                                   {"precision.min_scale", precision.min_scale},
                                   {"parallel.ddp.bucket_cap_mb", parallel.ddp.bucket_cap_mb},
                                   {"model.dropout", model.dropout},
                                   {"model.norm_eps", model.norm_eps},
                                   {"model.rope_theta", model.rope_theta},
                                   {"run.timeout", run.timeout}}) {
    require(std::isfinite(value),
            std::string(key) + " must be a finite number, got " + std::to_string(value));
  }
  require(train.lr > 0, "train.lr must be positive");
  // A constant schedule never reaches min_lr, so only the decaying ones bound it by lr.
  auto toml_number = [](double value) {
    std::ostringstream text;
    text << value;
    return text.str();
  };
  require(train.min_lr >= 0 && (train.min_lr <= train.lr || train.schedule == "constant"),
          "train.min_lr (" + toml_number(train.min_lr) + ") must be between 0 and train.lr (" +
              toml_number(train.lr) + ") for the \"" + train.schedule + "\" schedule");
  require(train.warmup >= 0, "train.warmup must be >= 0");
  require(train.warmup_type == "linear" || train.warmup_type == "log",
          "train.warmup_type must be \"linear\" or \"log\", got \"" + train.warmup_type + "\"");
  require(train.schedule == "cosine" || train.schedule == "linear" || train.schedule == "constant",
          "train.schedule must be \"cosine\", \"linear\" or \"constant\", got \"" + train.schedule +
              "\"");
  require(train.clip >= 0, "train.clip must be >= 0 (0 disables clipping)");
  require(train.attention == "auto" || train.attention == "blockwise" ||
              train.attention == "fused" || train.attention == "reference",
          "train.attention must be \"auto\", \"blockwise\", \"fused\" or \"reference\", got \"" +
              train.attention + "\"");
  if (train.attention == "blockwise" && model.dropout != 0.0) {
    std::ostringstream message;
    message << "train.attention = \"blockwise\" applies no attention dropout, but model.dropout "
            << "is " << model.dropout << "; set model.dropout = 0 or another kernel";
    require(false, message.str());
  }
  require(train.beta1 >= 0 && train.beta1 < 1 && train.beta2 >= 0 && train.beta2 < 1,
          "train.beta1 and train.beta2 must be in [0, 1)");
  require(train.eval_every >= 0 && train.checkpoint_every >= 0,
          "train.eval_every and "
          "train.checkpoint_every must be >= 0");
  require(train.eval_every == 0 || data.eval_sequences > 0,
          "train.eval_every needs data.eval_sequences > 0 (sequences held out for evaluation)");
  require(train.keep_checkpoints >= 1, "train.keep_checkpoints must be at least 1");
  require(train.sample_tokens >= 0 && train.sample_top_k >= 0 && train.sample_temperature > 0,
          "train.sample_tokens and train.sample_top_k must be >= 0, sample_temperature > 0");
  require(
      precision.autocast == "none" || precision.autocast == "bf16" || precision.autocast == "fp16",
      "precision.autocast must be \"none\", \"bf16\" or \"fp16\", got \"" + precision.autocast +
          "\"");
  if (precision.loss_scale != "none" && precision.loss_scale != "dynamic") {
    char* end = nullptr;
    const double fixed = std::strtod(precision.loss_scale.c_str(), &end);
    require(end && *end == '\0' && fixed > 0,
            "precision.loss_scale must be \"none\", \"dynamic\" or a positive number, got \"" +
                precision.loss_scale + "\"");
  }
  require(precision.initial_scale > 0 && precision.min_scale > 0 && precision.scale_window >= 1,
          "precision.initial_scale and min_scale must be positive, scale_window >= 1");
  require(precision.hysteresis >= 1,
          "precision.hysteresis must be at least 1, got " + std::to_string(precision.hysteresis));
  require(parallel.zero.stage >= 1 && parallel.zero.stage <= 3,
          "parallel.zero.stage must be 1, 2 or 3, got " + std::to_string(parallel.zero.stage));
  require(parallel.tp >= 1, "parallel.tp must be at least 1, got " + std::to_string(parallel.tp));
  require(!parallel.sequence_parallel || parallel.tp > 1,
          "parallel.sequence_parallel splits the sequence across tensor-parallel ranks: it needs "
          "parallel.tp > 1");
  require(!parallel.sequence_parallel || data.seq_len % parallel.tp == 0,
          "parallel.sequence_parallel: data.seq_len " + std::to_string(data.seq_len) +
              " is not divisible by parallel.tp=" + std::to_string(parallel.tp));
  require(parallel.tp == 1 || !zero_offloads_to_files(parallel.zero),
          "parallel.tp > 1 with ZeRO offload to nvme: state streamed from files is not split "
          "by tensor parallelism in this build; offload to \"cpu\" or use tp = 1");
  require(parallel.tp == 1 || model.dropout == 0.0,
          "model.dropout > 0 with parallel.tp > 1: the ranks of a tensor-parallel group would "
          "draw different masks for the activations they share; this version trains tensor "
          "parallelism without dropout");
  validate_optimizer(*this);
  validate_layer_drop(*this);
  validate_random_ltd(*this);
  validate_masked_lm(*this);
  validate_fp8(*this);
  validate_compression(*this);
  validate_autotune(*this);
  validate_pipeline(*this);
  validate_context_parallel(*this);
  validate_expert_parallel(*this);
  require(!model.moe() || !parallel.sequence_parallel,
          "parallel.sequence_parallel with a mixture-of-experts model (model.n_experts " +
              std::to_string(model.n_experts) +
              "): the experts take whole tokens from every tensor-parallel rank; this version "
              "splits them by tensor parallelism without sequence parallelism");
  require(!model.moe() || parallel.cp == 1,
          "parallel.cp > 1 with a mixture-of-experts model (model.n_experts " +
              std::to_string(model.n_experts) +
              "): the load-balancing loss is taken per sequence, which context parallelism "
              "splits; this version trains mixture-of-experts models with cp = 1");
  require(parallel.tp == 1 || lora.rank == 0,
          "lora.rank > 0 with parallel.tp > 1: adapters are not split across tensor-parallel "
          "ranks; use data parallelism (ddp or fsdp) for LoRA");
  require(parallel.strategy == ParallelStrategy::kZero ||
              (parallel.zero.offload_optimizer == OffloadDevice::kNone &&
               parallel.zero.offload_param == OffloadDevice::kNone),
          "parallel.zero.offload_optimizer / offload_param with parallel.strategy = \"" +
              to_string(parallel.strategy) +
              "\": offload to \"cpu\" or \"nvme\" is ZeRO's, read only under parallel.strategy "
              "= \"zero\" (FSDP offloads with parallel.fsdp.cpu_offload = true)");
  require(parallel.strategy == ParallelStrategy::kFsdp || !parallel.fsdp.cpu_offload,
          "parallel.fsdp.cpu_offload = true with parallel.strategy = \"" +
              to_string(parallel.strategy) +
              "\": it is FSDP's, read only under parallel.strategy = \"fsdp\" (ZeRO offloads "
              "with parallel.zero.offload_optimizer and offload_param)");
  require(parallel.zero.offload_param == OffloadDevice::kNone || parallel.zero.stage == 3,
          "parallel.zero.offload_param needs parallel.zero.stage = 3 (stages 1 and 2 keep the "
          "parameters whole on every rank)");
  require(!zero_offloads_to_files(parallel.zero) || !parallel.zero.nvme_path.empty(),
          "parallel.zero offload to nvme needs parallel.zero.nvme_path");
  require(!run.checkpoint_async || parallel.strategy != ParallelStrategy::kZero ||
              !zero_offloads_to_files(parallel.zero),
          "run.checkpoint_async = true with parallel.zero offload to nvme: an asynchronous save "
          "copies the training state to host memory, which this run keeps in files to save "
          "memory; set run.checkpoint_async = false (the save then reads the files as it "
          "writes)");
  require(parallel.zero.contiguous_gradients,
          "parallel.zero.contiguous_gradients = false is not supported: gradients are always "
          "reduced from one contiguous buffer per unit");
  require(parallel.zero.reduce_bucket_size > 0 && parallel.zero.allgather_bucket_size > 0 &&
              parallel.zero.prefetch_bucket_size >= 0 &&
              parallel.zero.param_persistence_threshold >= 0 &&
              parallel.zero.max_live_parameters > 0,
          "parallel.zero bucket sizes and max_live_parameters must be positive, "
          "prefetch_bucket_size and param_persistence_threshold >= 0");
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"param_dtype", precision.param_dtype},
        {"reduce_dtype", precision.reduce_dtype},
        {"buffer_dtype", precision.buffer_dtype}}) {
    require(value == "fp32" || value == "bf16",
            "precision." + key + " must be \"fp32\" or \"bf16\", got \"" + value + "\"");
  }
  require(parallel.strategy == ParallelStrategy::kFsdp ||
              parallel.strategy == ParallelStrategy::kZero ||
              (precision.param_dtype == "fp32" && precision.reduce_dtype == "fp32" &&
               precision.buffer_dtype == "fp32"),
          "precision.param_dtype, reduce_dtype and buffer_dtype are FSDP's mixed-precision "
          "policy: they need parallel.strategy = \"fsdp\" or \"zero\" (use precision.autocast "
          "otherwise)");
  require(parallel.fsdp.wrap != FsdpWrap::kClass || !parallel.fsdp.wrap_classes.empty(),
          "parallel.fsdp.wrap = \"class\" needs parallel.fsdp.wrap_classes");
  require(parallel.fsdp.min_params > 0, "parallel.fsdp.min_params must be positive");
  require(parallel.fsdp.limit_all_gathers >= 1,
          "parallel.fsdp.limit_all_gathers must be at least 1");
  require(parallel.fsdp.replicate >= 0, "parallel.fsdp.replicate must be >= 0");
  require(parallel.ddp.bucket_cap_mb > 0, "parallel.ddp.bucket_cap_mb must be positive");
  require(lora.rank >= 0,
          "lora.rank must be positive (0 trains every parameter, no adapters), "
          "got " +
              std::to_string(lora.rank));
  // Every adapted layer has d_model on one side: a rank above it adds parameters, not capacity.
  require(lora.rank <= model.d_model,
          "lora.rank " + std::to_string(lora.rank) + " is larger than model.d_model (" +
              std::to_string(model.d_model) +
              "), the smaller side of the layers it adapts: an update of that rank is already "
              "full-rank");
  // Checked whether or not adapters are on, as every other key is.
  require(std::isfinite(lora.alpha) && lora.alpha >= 0,
          "lora.alpha must be a finite number >= 0, got " + std::to_string(lora.alpha));
  require(lora.dropout >= 0 && lora.dropout < 1,
          "lora.dropout must be in [0, 1), got " + std::to_string(lora.dropout));
  require(lora.base_dtype == "fp32" || lora.base_dtype == "bf16" || lora.base_dtype == "nf4",
          "lora.base_dtype must be \"fp32\", \"bf16\" or \"nf4\", got \"" + lora.base_dtype + "\"");
  if (lora.rank > 0) {
    require(!lora.target_modules.empty(),
            "lora.target_modules is empty: name the linear layers to adapt (e.g. [\"attn.q\", "
            "\"attn.v\"]) or \"all-linear\"");
    require(parallel.strategy != ParallelStrategy::kZero,
            "lora.rank > 0 with parallel.strategy = \"zero\": ZeRO keeps optimizer state for "
            "every parameter and cannot hold a frozen base; use parallel.strategy = \"fsdp\" "
            "(sharding = \"shard_grad_op\" is ZeRO-2's layout, \"full_shard\" ZeRO-3's) or "
            "\"ddp\"");
  }
  require(train.loss_chunk_tokens >= 0,
          "train.loss_chunk_tokens must be >= 0 (0: chunks of about 32 MiB of logits), got " +
              std::to_string(train.loss_chunk_tokens));
  require(train.max_skipped >= 1, "train.max_skipped must be at least 1");
  require(train.weight_decay >= 0,
          "train.weight_decay must be >= 0, got " + toml_number(train.weight_decay));
  require(train.eps > 0, "train.eps must be positive, got " + toml_number(train.eps));
  require(run.log_every >= 1, "run.log_every must be at least 1");
  require(!run.dir.empty(), "run.dir must name a directory, got \"\"");
  // More threads than any machine has cores is a typo, not a setting.
  require(
      run.threads >= 0 && run.threads <= 4096,
      "run.threads must be between 0 (every core) and 4096, got " + std::to_string(run.threads));
  require(run.device == "cpu" || run.device == "cuda",
          "run.device must be \"cpu\" or \"cuda\", got \"" + run.device + "\"");
  if (run.device == "cuda") {
    // The CUDA path trains one process's model; what moves tensors between processes or to
    // host memory (Gloo's collectives, offload, the CPU-only frozen weights) is not on it yet.
    require(parallel.strategy == ParallelStrategy::kNone,
            "run.device = \"cuda\" trains with parallel.strategy \"none\" (one process) for "
            "now, got \"" +
                to_string(parallel.strategy) + "\"");
    require(whole_blocks_and_sequences(parallel),
            "run.device = \"cuda\" trains without tp, pp, cp or ep for now (each must be 1)");
    require(lora.base_dtype == "fp32",
            "run.device = \"cuda\": lora.base_dtype \"" + lora.base_dtype +
                "\" keeps the frozen weights in a CPU-only format; use \"fp32\"");
  }
  require(
      run.fault_tolerance == "none" || run.fault_tolerance == "replicas",
      "run.fault_tolerance must be \"none\" or \"replicas\", got \"" + run.fault_tolerance + "\"");
  if (run.fault_tolerance == "replicas") {
    // What replica groups need: replicas that each hold the whole training state, one rank
    // each (ddp) or one shard group each (hybrid_shard).
    const bool hybrid = parallel.strategy == ParallelStrategy::kFsdp &&
                        parallel.fsdp.sharding == ShardingStrategy::kHybridShard;
    require(parallel.strategy == ParallelStrategy::kDdp || hybrid,
            "run.fault_tolerance = \"replicas\" needs data-parallel replicas that each hold the "
            "whole training state: parallel.strategy = \"ddp\", or \"fsdp\" with "
            "parallel.fsdp.sharding = \"hybrid_shard\"; got \"" +
                to_string(parallel.strategy) + "\"" +
                (parallel.strategy == ParallelStrategy::kFsdp
                     ? " with sharding \"" + to_string(parallel.fsdp.sharding) + "\""
                     : std::string()) +
                " (its ranks hold shards of one copy, so no rank can stand in for another)");
    require(parallel.tp == 1 && parallel.pp == 1 && parallel.cp == 1 && !model.moe(),
            "run.fault_tolerance = \"replicas\" with tensor, pipeline, context or expert "
            "parallelism: this version keeps replicas of one rank (ddp) or of one shard group "
            "(hybrid_shard), without those (parallel.tp = pp = cp = 1, no experts)");
    require(!run.checkpoint_async,
            "run.fault_tolerance = \"replicas\" with run.checkpoint_async = true: the writing "
            "thread's collectives would need a group of their own that follows the replicas; "
            "set run.checkpoint_async = false");
  }
  require(run.freed_memory == "auto" || run.freed_memory == "cache" ||
              run.freed_memory == "return" || run.freed_memory == "malloc",
          "run.freed_memory must be \"auto\", \"cache\", \"return\" or \"malloc\", got \"" +
              run.freed_memory + "\"");
  require(run.timeout > 0, "run.timeout must be a positive number of seconds");
  if (run.trace) {
    const std::string range = "run.trace_steps [" + std::to_string(run.trace_first) + ", " +
                              std::to_string(run.trace_last) + "]";
    require(run.trace_first >= 1 && run.trace_last >= 0 &&
                (run.trace_last == 0 || run.trace_last >= run.trace_first),
            range + " is not a range of steps: steps count from 1 and last >= first");
    require(run.trace_first <= train.steps && run.trace_last <= train.steps,
            range + " is outside the run, which has train.steps = " + std::to_string(train.steps));
  }
  model.validate();
}

}  // namespace shardtrain
