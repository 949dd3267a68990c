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

template <typename T>
Setter field(T TrainConfig::*member) {
  return [member](TrainConfig& c, const toml::node& n, const std::string& name) {
    if constexpr (std::is_same_v<T, int64_t>) {
      c.*member = as_int(n, name);
    } else if constexpr (std::is_same_v<T, double>) {
      c.*member = as_double(n, name);
    } else if constexpr (std::is_same_v<T, bool>) {
      c.*member = as_bool(n, name);
    } else {
      c.*member = as_string(n, name);
    }
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
  static const std::map<std::string, Setter> keys = {
      {"model.preset", [](TrainConfig& c, const toml::node& n,
                          const std::string& name) { c.model = model_preset(as_string(n, name)); }},
      {"model.hf_config",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         c.model = model_config_from_hf_json(as_string(n, name));
       }},
      {"model.vocab_size",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         c.model.vocab_size = as_int(n, name);
         c.vocab_size_set = true;
       }},
      {"model.init_from", field(&TrainConfig::init_from)},
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
      {"data.corpus",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         c.corpus.clear();
         if (n.is_string()) {
           c.corpus.push_back(*n.value<std::string>());
           return;
         }
         if (!n.is_array()) wrong_type(name, "a path or an array of paths", n);
         for (const auto& item : *n.as_array()) c.corpus.push_back(as_string(item, name));
       }},
      {"data.tokenizer", field(&TrainConfig::tokenizer)},
      {"data.format", field(&TrainConfig::format)},
      {"data.chat_template", field(&TrainConfig::chat_template)},
      {"data.packing", field(&TrainConfig::packing)},
      {"data.overlong", field(&TrainConfig::overlong)},
      {"data.gpt2_dir", field(&TrainConfig::gpt2_dir)},
      {"data.seq_len", field(&TrainConfig::seq_len)},
      {"data.eval_sequences", field(&TrainConfig::eval_sequences)},
      {"train.steps", field(&TrainConfig::steps)},
      {"train.micro_batch", field(&TrainConfig::micro_batch)},
      {"train.grad_accum", field(&TrainConfig::grad_accum)},
      {"train.lr", field(&TrainConfig::lr)},
      {"train.min_lr", field(&TrainConfig::min_lr)},
      {"train.warmup", field(&TrainConfig::warmup)},
      {"train.schedule", field(&TrainConfig::schedule)},
      {"train.weight_decay", field(&TrainConfig::weight_decay)},
      {"train.beta1", field(&TrainConfig::beta1)},
      {"train.beta2", field(&TrainConfig::beta2)},
      {"train.eps", field(&TrainConfig::eps)},
      {"train.clip", field(&TrainConfig::clip)},
      {"train.max_skipped", field(&TrainConfig::max_skipped)},
      {"train.seed", field(&TrainConfig::seed)},
      {"train.eval_every", field(&TrainConfig::eval_every)},
      {"train.eval_batches", field(&TrainConfig::eval_batches)},
      {"train.checkpoint_every", field(&TrainConfig::checkpoint_every)},
      {"train.keep_checkpoints", field(&TrainConfig::keep_checkpoints)},
      {"train.final_checkpoint", field(&TrainConfig::final_checkpoint)},
      {"train.activation_checkpointing", field(&TrainConfig::activation_checkpointing)},
      {"train.sample_tokens", field(&TrainConfig::sample_tokens)},
      {"train.sample_prompt", field(&TrainConfig::sample_prompt)},
      {"train.sample_temperature", field(&TrainConfig::sample_temperature)},
      {"train.sample_top_k", field(&TrainConfig::sample_top_k)},
      {"precision.autocast", field(&TrainConfig::autocast)},
      {"precision.loss_scale",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         if (n.is_number()) {
           c.loss_scale = std::to_string(*n.value<double>());
         } else {
           c.loss_scale = as_string(n, name);
         }
       }},
      {"precision.initial_scale", field(&TrainConfig::initial_scale)},
      {"precision.scale_window", field(&TrainConfig::scale_window)},
      {"precision.min_scale", field(&TrainConfig::min_scale)},
      {"parallel.strategy", field(&TrainConfig::strategy)},
      {"parallel.tp", field(&TrainConfig::tp)},
      {"parallel.sequence_parallel", field(&TrainConfig::sequence_parallel)},
      {"parallel.pp", field(&TrainConfig::pp)},
      {"parallel.pp_schedule", field(&TrainConfig::pp_schedule)},
      {"parallel.pp_virtual_stages", field(&TrainConfig::pp_virtual_stages)},
      {"parallel.pp_microbatches",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         c.pp_microbatches = as_int(n, name);
         c.grad_accum = c.pp_microbatches;  // the same setting under the pipeline's name
       }},
      {"parallel.pp_split",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         if (!n.is_array()) wrong_type(name, "an array of block counts, one per stage", n);
         c.pp_split.clear();
         for (const auto& item : *n.as_array()) c.pp_split.push_back(as_int(item, name));
       }},
      {"parallel.ddp.bucket_cap_mb", field(&TrainConfig::ddp_bucket_cap_mb)},
      {"parallel.ddp.find_unused_parameters", field(&TrainConfig::ddp_find_unused_parameters)},
      {"parallel.ddp.comm_hook", field(&TrainConfig::ddp_comm_hook)},
      {"parallel.fsdp.sharding", field(&TrainConfig::fsdp_sharding)},
      {"parallel.fsdp.replicate", field(&TrainConfig::fsdp_replicate)},
      {"parallel.fsdp.wrap", field(&TrainConfig::fsdp_wrap)},
      {"parallel.fsdp.min_params", field(&TrainConfig::fsdp_min_params)},
      {"parallel.fsdp.wrap_classes",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         c.fsdp_wrap_classes.clear();
         if (!n.is_array()) wrong_type(name, "an array of class names", n);
         for (const auto& item : *n.as_array())
           c.fsdp_wrap_classes.push_back(as_string(item, name));
       }},
      {"parallel.fsdp.prefetch", field(&TrainConfig::fsdp_prefetch)},
      {"parallel.fsdp.forward_prefetch", field(&TrainConfig::fsdp_forward_prefetch)},
      {"parallel.fsdp.limit_all_gathers", field(&TrainConfig::fsdp_limit_all_gathers)},
      {"parallel.fsdp.cpu_offload", field(&TrainConfig::fsdp_cpu_offload)},
      {"parallel.zero.stage", field(&TrainConfig::zero_stage)},
      {"parallel.zero.offload_optimizer", field(&TrainConfig::zero_offload_optimizer)},
      {"parallel.zero.offload_param", field(&TrainConfig::zero_offload_param)},
      {"parallel.zero.nvme_path", field(&TrainConfig::zero_nvme_path)},
      {"parallel.zero.pin_memory", field(&TrainConfig::zero_pin_memory)},
      {"parallel.zero.overlap_comm", field(&TrainConfig::zero_overlap_comm)},
      {"parallel.zero.contiguous_gradients", field(&TrainConfig::zero_contiguous_gradients)},
      {"parallel.zero.reduce_bucket_size", field(&TrainConfig::zero_reduce_bucket_size)},
      {"parallel.zero.allgather_bucket_size", field(&TrainConfig::zero_allgather_bucket_size)},
      {"parallel.zero.prefetch_bucket_size", field(&TrainConfig::zero_prefetch_bucket_size)},
      {"parallel.zero.param_persistence_threshold",
       field(&TrainConfig::zero_param_persistence_threshold)},
      {"parallel.zero.max_live_parameters", field(&TrainConfig::zero_max_live_parameters)},
      {"precision.param_dtype", field(&TrainConfig::param_dtype)},
      {"precision.reduce_dtype", field(&TrainConfig::reduce_dtype)},
      {"precision.buffer_dtype", field(&TrainConfig::buffer_dtype)},
      {"lora.rank", field(&TrainConfig::lora_rank)},
      {"lora.alpha", field(&TrainConfig::lora_alpha)},
      {"lora.dropout", field(&TrainConfig::lora_dropout)},
      {"lora.target_modules",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         c.lora_target_modules.clear();
         if (n.is_string()) {
           c.lora_target_modules.push_back(*n.value<std::string>());
           return;
         }
         if (!n.is_array()) wrong_type(name, "a module name pattern or an array of them", n);
         for (const auto& item : *n.as_array())
           c.lora_target_modules.push_back(as_string(item, name));
       }},
      {"lora.base_dtype", field(&TrainConfig::lora_base_dtype)},
      {"run.dir", field(&TrainConfig::dir)},
      {"run.log_every", field(&TrainConfig::log_every)},
      {"run.resume", field(&TrainConfig::resume)},
      {"run.overwrite", field(&TrainConfig::overwrite)},
      {"run.threads", field(&TrainConfig::threads)},
      {"run.timeout", field(&TrainConfig::timeout)},
      {"run.memory_check", field(&TrainConfig::memory_check)},
      {"run.trace", field(&TrainConfig::trace)},
      {"run.trace_steps",
       [](TrainConfig& c, const toml::node& n, const std::string& name) {
         const toml::array* range = n.as_array();
         if (!range || range->size() != 2) {
           wrong_type(name, "[first, last], the steps to trace (1-based, inclusive)", n);
         }
         c.trace_first = as_int(*range->get(0), name);
         c.trace_last = as_int(*range->get(1), name);
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
      throw std::invalid_argument(
          source + ": unknown config key '" + name + "'" +
          (!guess.empty() ? " (did you mean '" + guess + "'?)"
           : prefix.empty()
               ? " (keys belong in [model], [data], [train], [parallel], [precision] or [run])"
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
  // GPT-2 has no grouped-query attention: its key/value heads are its heads, whatever
  // model.n_heads was changed to (an explicit model.n_kv_heads is still checked).
  if (config.model.family == ModelFamily::kGpt2 && !kv_heads_given) {
    config.model.n_kv_heads = config.model.n_heads;
  }
  config.validate();
  return config;
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("config file '" + path + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_train_config(text.str(), path, overrides);
}

namespace {

// The pipeline's settings against each other and the model; the world size is checked with the
// mesh (train_mesh_shape), the split and the schedule by check_parallel_settings.
void validate_pipeline(const TrainConfig& c) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(message);
  };
  require(c.pp >= 1, "parallel.pp must be at least 1, got " + std::to_string(c.pp));
  require(c.pp_virtual_stages >= 1, "parallel.pp_virtual_stages must be at least 1, got " +
                                        std::to_string(c.pp_virtual_stages));
  const PipelineScheduleKind kind = pipeline_schedule_from_string(c.pp_schedule);
  require(c.pp_microbatches == 0 || c.pp_microbatches == c.grad_accum,
          "parallel.pp_microbatches = " + std::to_string(c.pp_microbatches) +
              " and train.grad_accum = " + std::to_string(c.grad_accum) +
              " disagree: they are one setting (the micro-batches per step); set one of them");
  if (c.pp == 1) {
    require(c.pp_split.empty() && c.pp_virtual_stages == 1,
            "parallel.pp_split and parallel.pp_virtual_stages need parallel.pp > 1");
    return;
  }
  // Under a pipeline a stage's gradients accumulate whole through the step (its micro-batches'
  // backwards interleave with forwards): ZeRO-2's sharded gradients and ZeRO-3's per-unit
  // gathering have nothing to act on, as in DeepSpeed, whose pipeline takes stage 1 only.
  require(c.strategy != "zero" || c.zero_stage == 1,
          "parallel.pp > 1 with parallel.zero.stage = " + std::to_string(c.zero_stage) +
              ": pipeline stages combine with ZeRO stage 1 (or parallel.strategy = \"fsdp\", "
              "which shards the parameters between steps)");
  require(c.strategy == "ddp" || c.strategy == "none" || c.param_dtype == "fp32",
          "precision.param_dtype = \"" + c.param_dtype +
              "\" with parallel.pp > 1: a pipeline stage accumulates its gradients over the "
              "micro-batches in the parameters' dtype; keep fp32 parameters and compute in bf16 "
              "with precision.autocast = \"bf16\"");
  require(c.strategy != "zero" ||
              (c.zero_offload_optimizer == "none" && c.zero_offload_param == "none"),
          "parallel.zero.offload_optimizer / offload_param with parallel.pp > 1: offload is not "
          "combined with pipeline stages");
  require(c.lora_rank == 0,
          "lora.rank > 0 with parallel.pp > 1: adapters are not split into pipeline stages; use "
          "data parallelism (ddp or fsdp) for LoRA");
  const int stages = static_cast<int>(c.pp * c.pp_virtual_stages);
  if (kind == PipelineScheduleKind::kInterleaved1F1B && c.pp_split.empty()) {
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

}  // namespace

void TrainConfig::validate() const {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw std::invalid_argument(message);
  };
  std::error_code error;
  require(tokenizer.empty() || tokenizer == "byte" || tokenizer == "gpt2" ||
              std::filesystem::exists(tokenizer, error),
          "data.tokenizer must be \"byte\", \"gpt2\" or a tokenizer.json file or model folder, "
          "got \"" +
              tokenizer + "\", which does not exist");
  require(
      format == "text" || format == "chat" || format == "prompt_completion",
      "data.format must be \"text\", \"chat\" or \"prompt_completion\", got \"" + format + "\"");
  require(overlong == "truncate" || overlong == "drop",
          "data.overlong must be \"truncate\" or \"drop\", got \"" + overlong + "\"");
  require(seq_len >= 1, "data.seq_len must be at least 1");
  require(seq_len <= model.context_length,
          "data.seq_len " + std::to_string(seq_len) + " exceeds the model's context length " +
              std::to_string(model.context_length) + " (model.context_length)");
  require(model.sliding_window == 0 || seq_len <= model.sliding_window,
          "data.seq_len " + std::to_string(seq_len) + " exceeds the model's sliding attention " +
              "window of " + std::to_string(model.sliding_window) +
              " tokens, which shardtrain does not implement: set data.seq_len to at most " +
              std::to_string(model.sliding_window));
  require(eval_sequences >= 0, "data.eval_sequences must be >= 0");
  require(steps >= 1, "train.steps must be at least 1");
  require(micro_batch >= 1, "train.micro_batch must be at least 1");
  require(grad_accum >= 1, "train.grad_accum must be at least 1");
  // NaN fails every comparison below and inf passes "positive": name non-finite values first.
  for (const auto& [key, value] : {std::pair<const char*, double>{"train.lr", lr},
                                   {"train.min_lr", min_lr},
                                   {"train.weight_decay", weight_decay},
                                   {"train.beta1", beta1},
                                   {"train.beta2", beta2},
                                   {"train.eps", eps},
                                   {"train.clip", clip},
                                   {"train.sample_temperature", sample_temperature},
                                   {"precision.initial_scale", initial_scale},
                                   {"precision.min_scale", min_scale},
                                   {"parallel.ddp.bucket_cap_mb", ddp_bucket_cap_mb},
                                   {"model.dropout", model.dropout},
                                   {"model.norm_eps", model.norm_eps},
                                   {"model.rope_theta", model.rope_theta},
                                   {"run.timeout", timeout}}) {
    require(std::isfinite(value),
            std::string(key) + " must be a finite number, got " + std::to_string(value));
  }
  require(lr > 0, "train.lr must be positive");
  require(min_lr >= 0 && min_lr <= lr, "train.min_lr must be between 0 and train.lr");
  require(warmup >= 0, "train.warmup must be >= 0");
  require(
      schedule == "cosine" || schedule == "linear" || schedule == "constant",
      "train.schedule must be \"cosine\", \"linear\" or \"constant\", got \"" + schedule + "\"");
  require(clip >= 0, "train.clip must be >= 0 (0 disables clipping)");
  require(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1,
          "train.beta1 and train.beta2 must be in [0, 1)");
  require(eval_every >= 0 && checkpoint_every >= 0,
          "train.eval_every and "
          "train.checkpoint_every must be >= 0");
  require(eval_every == 0 || eval_sequences > 0,
          "train.eval_every needs data.eval_sequences > 0 (sequences held out for evaluation)");
  require(keep_checkpoints >= 1, "train.keep_checkpoints must be at least 1");
  require(sample_tokens >= 0 && sample_top_k >= 0 && sample_temperature > 0,
          "train.sample_tokens and train.sample_top_k must be >= 0, sample_temperature > 0");
  require(autocast == "none" || autocast == "bf16" || autocast == "fp16",
          "precision.autocast must be \"none\", \"bf16\" or \"fp16\", got \"" + autocast + "\"");
  if (loss_scale != "none" && loss_scale != "dynamic") {
    char* end = nullptr;
    const double fixed = std::strtod(loss_scale.c_str(), &end);
    require(end && *end == '\0' && fixed > 0,
            "precision.loss_scale must be \"none\", \"dynamic\" or a positive number, got \"" +
                loss_scale + "\"");
  }
  require(initial_scale > 0 && min_scale > 0 && scale_window >= 1,
          "precision.initial_scale and min_scale must be positive, scale_window >= 1");
  require(strategy == "none" || strategy == "ddp" || strategy == "fsdp" || strategy == "zero",
          "parallel.strategy must be \"none\", \"ddp\", \"fsdp\" or \"zero\", got \"" + strategy +
              "\"");
  require(zero_stage >= 1 && zero_stage <= 3,
          "parallel.zero.stage must be 1, 2 or 3, got " + std::to_string(zero_stage));
  require(tp >= 1, "parallel.tp must be at least 1, got " + std::to_string(tp));
  require(!sequence_parallel || tp > 1,
          "parallel.sequence_parallel splits the sequence across tensor-parallel ranks: it needs "
          "parallel.tp > 1");
  require(!sequence_parallel || seq_len % tp == 0,
          "parallel.sequence_parallel: data.seq_len " + std::to_string(seq_len) +
              " is not divisible by parallel.tp=" + std::to_string(tp));
  require(tp == 1 || (zero_offload_optimizer != "nvme" && zero_offload_param != "nvme"),
          "parallel.tp > 1 with ZeRO offload to nvme: state streamed from files is not split "
          "by tensor parallelism in this build; offload to \"cpu\" or use tp = 1");
  require(tp == 1 || model.dropout == 0.0,
          "model.dropout > 0 with parallel.tp > 1: the ranks of a tensor-parallel group would "
          "draw different masks for the activations they share; this version trains tensor "
          "parallelism without dropout");
  validate_pipeline(*this);
  require(tp == 1 || lora_rank == 0,
          "lora.rank > 0 with parallel.tp > 1: adapters are not split across tensor-parallel "
          "ranks; use data parallelism (ddp or fsdp) for LoRA");
  for (const auto& [key, value] :
       {std::pair<std::string, std::string>{"offload_optimizer", zero_offload_optimizer},
        {"offload_param", zero_offload_param}}) {
    require(
        value == "none" || value == "cpu" || value == "nvme",
        "parallel.zero." + key + " must be \"none\", \"cpu\" or \"nvme\", got \"" + value + "\"");
  }
  require(zero_offload_param == "none" || zero_stage == 3,
          "parallel.zero.offload_param needs parallel.zero.stage = 3 (stages 1 and 2 keep the "
          "parameters whole on every rank)");
  require(
      (zero_offload_optimizer != "nvme" && zero_offload_param != "nvme") || !zero_nvme_path.empty(),
      "parallel.zero offload to nvme needs parallel.zero.nvme_path");
  require(zero_contiguous_gradients,
          "parallel.zero.contiguous_gradients = false is not supported: gradients are always "
          "reduced from one contiguous buffer per unit");
  require(zero_reduce_bucket_size > 0 && zero_allgather_bucket_size > 0 &&
              zero_prefetch_bucket_size >= 0 && zero_param_persistence_threshold >= 0 &&
              zero_max_live_parameters > 0,
          "parallel.zero bucket sizes and max_live_parameters must be positive, "
          "prefetch_bucket_size and param_persistence_threshold >= 0");
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"param_dtype", param_dtype},
                                   {"reduce_dtype", reduce_dtype},
                                   {"buffer_dtype", buffer_dtype}}) {
    require(value == "fp32" || value == "bf16",
            "precision." + key + " must be \"fp32\" or \"bf16\", got \"" + value + "\"");
  }
  require(strategy == "fsdp" || strategy == "zero" ||
              (param_dtype == "fp32" && reduce_dtype == "fp32" && buffer_dtype == "fp32"),
          "precision.param_dtype, reduce_dtype and buffer_dtype are FSDP's mixed-precision "
          "policy: they need parallel.strategy = \"fsdp\" or \"zero\" (use precision.autocast "
          "otherwise)");
  try {
    sharding_strategy_from_string(fsdp_sharding);
    backward_prefetch_from_string(fsdp_prefetch);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("parallel.fsdp: ") + e.what());
  }
  require(fsdp_wrap == "block" || fsdp_wrap == "size" || fsdp_wrap == "class",
          "parallel.fsdp.wrap must be \"block\", \"size\" or \"class\", got \"" + fsdp_wrap + "\"");
  require(fsdp_wrap != "class" || !fsdp_wrap_classes.empty(),
          "parallel.fsdp.wrap = \"class\" needs parallel.fsdp.wrap_classes");
  require(fsdp_min_params > 0, "parallel.fsdp.min_params must be positive");
  require(fsdp_limit_all_gathers >= 1, "parallel.fsdp.limit_all_gathers must be at least 1");
  require(fsdp_replicate >= 0, "parallel.fsdp.replicate must be >= 0");
  require(ddp_bucket_cap_mb > 0, "parallel.ddp.bucket_cap_mb must be positive");
  require(ddp_comm_hook == "none" || ddp_comm_hook == "bf16" || ddp_comm_hook == "fp16",
          "parallel.ddp.comm_hook must be \"none\", \"bf16\" or \"fp16\", got \"" + ddp_comm_hook +
              "\"");
  require(lora_rank >= 0,
          "lora.rank must be positive (0 trains every parameter, no adapters), "
          "got " +
              std::to_string(lora_rank));
  if (lora_rank > 0) {
    require(std::isfinite(lora_alpha) && lora_alpha >= 0,
            "lora.alpha must be a finite number >= 0, got " + std::to_string(lora_alpha));
    require(lora_dropout >= 0 && lora_dropout < 1,
            "lora.dropout must be in [0, 1), got " + std::to_string(lora_dropout));
    require(!lora_target_modules.empty(),
            "lora.target_modules is empty: name the linear layers to adapt (e.g. [\"attn.q\", "
            "\"attn.v\"]) or \"all-linear\"");
    require(
        lora_base_dtype == "fp32" || lora_base_dtype == "bf16" || lora_base_dtype == "nf4",
        "lora.base_dtype must be \"fp32\", \"bf16\" or \"nf4\", got \"" + lora_base_dtype + "\"");
    require(strategy != "zero",
            "lora.rank > 0 with parallel.strategy = \"zero\": ZeRO keeps optimizer state for "
            "every parameter and cannot hold a frozen base; use parallel.strategy = \"fsdp\" "
            "(sharding = \"shard_grad_op\" is ZeRO-2's layout, \"full_shard\" ZeRO-3's) or "
            "\"ddp\"");
  }
  require(max_skipped >= 1, "train.max_skipped must be at least 1");
  require(weight_decay >= 0 && eps > 0, "train.weight_decay must be >= 0 and train.eps positive");
  require(log_every >= 1, "run.log_every must be at least 1");
  require(threads >= 0, "run.threads must be >= 0");
  require(timeout > 0, "run.timeout must be a positive number of seconds");
  if (trace) {
    const std::string range =
        "run.trace_steps [" + std::to_string(trace_first) + ", " + std::to_string(trace_last) + "]";
    require(trace_first >= 1 && trace_last >= 0 && (trace_last == 0 || trace_last >= trace_first),
            range + " is not a range of steps: steps count from 1 and last >= first");
    require(trace_first <= steps && trace_last <= steps,
            range + " is outside the run, which has train.steps = " + std::to_string(steps));
  }
  model.validate();
}

}  // namespace shardtrain
