// Hugging Face interoperability for the GPT-2 and Llama families: parameter names, config.json,
// importing a safetensors model as initial weights and exporting a checkpoint as one.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

#include "shardtrain/model.h"

namespace shardtrain {

// Where one of our parameters lives in a Hugging Face model of the same family.
struct HfParameterName {
  std::string name;     // ours, e.g. "blocks.0.attn.qkv.weight"
  std::string hf_name;  // e.g. "transformer.h.0.attn.c_attn.weight"
  // GPT-2's Conv1D stores weights as [in, out], the transpose of our nn.Linear [out, in].
  bool transposed = false;
};

// Every parameter of `config`, in parameter order, with its Hugging Face name: GPT2LMHeadModel
// ("transformer.wte.weight", "transformer.h.N.attn.c_attn.weight", ...) or LlamaForCausalLM
// ("model.embed_tokens.weight", "model.layers.N.self_attn.q_proj.weight", ...) or
// BertForMaskedLM ("bert.encoder.layer.N.attention.self.query.weight", "cls.predictions.bias",
// ...). A tied output head has no entry of its own (HF ties "lm_head.weight" to the token embedding
// too). A mixture-of-experts model's experts are named as MixtralForCausalLM's
// ("model.layers.N.block_sparse_moe.experts.E.w1.weight") or Qwen3MoeForCausalLM's
// ("model.layers.N.mlp.experts.E.gate_proj.weight"); one with shared experts throws
// std::invalid_argument (neither layout has them).
std::vector<HfParameterName> hf_parameter_names(const ModelConfig& config);

// The config.json Hugging Face writes for `config` (its ModelConfig::model_type()) with weights of
// `dtype` ("torch_dtype"); model_config_from_hf_json() reads it back to the same sizes.
std::string hf_config_json(const ModelConfig& config, at::ScalarType dtype = at::kFloat);

// The safetensors files of Hugging Face weights at `path`: the file itself, a folder's
// model.safetensors, or the files its model.safetensors.index.json maps weights to. Throws
// std::invalid_argument naming what is missing or corrupt.
std::vector<std::string> hf_weight_files(const std::string& path);

// The weights of a Hugging Face safetensors model of `config`'s family as a ParameterInitializer
// (values converted to the caller's dtype). `path` is a .safetensors file or a folder with
// model.safetensors or model.safetensors.index.json (weights split over several files). GPT-2
// names are accepted with or without the "transformer." prefix; attention-mask and rotary
// buffers are ignored. Only the headers are read here, and they are checked whole: throws
// std::invalid_argument naming the first of our parameters (in parameter order) whose tensor is
// missing or has another shape, or a tensor the model has no place for. Each call then reads
// just the bytes of the range asked for (GPT-2's transposed Conv1D weights: that one tensor), so
// a deferred model given ModelInit().values(hf_initializer(...)) streams each rank's shards from
// the files and never holds the whole model. Not collective.
ParameterInitializer hf_initializer(const ModelConfig& config, const std::string& path);

// Copies those weights into every parameter of `model` (allocating deferred ones). Throws as
// hf_initializer() does, before any parameter changes. Not collective: call it on every rank.
void load_hf_weights(Transformer& model, const std::string& path);

// Writes OUT/model.safetensors (the model's parameters under Hugging Face names, in the dtype
// they were saved in) and OUT/config.json from the sharded checkpoint `checkpoint_dir` written
// by the trainer. Streams tensor by tensor: host memory stays near the largest tensor. Each file
// appears in OUT only when complete; a failed export removes what it wrote. OUT must be empty
// or absent unless `overwrite`, which replaces those two files (and leaves others alone).
// Throws std::invalid_argument for a non-empty OUT, a checkpoint without a model description
// or with missing tensors.
void export_hf_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir,
                          bool overwrite = false);

// What ckpt export writes for a checkpoint of a LoRA run ([lora]): the adapters alone, as
// PEFT saves them, or the base model with every adapter merged into its weight.
enum class LoraExport { kAdapters, kMerged };

// kAdapters: OUT/adapter_model.safetensors (PEFT's names,
// "base_model.model.<Hugging Face module>.lora_A.weight" [rank, in] and ".lora_B.weight"
// [out, rank], fp32) and OUT/adapter_config.json (peft_type LORA, r, lora_alpha, lora_dropout,
// target_modules, fan_in_fan_out for GPT-2's Conv1D layers, base_model_name_or_path).
// kMerged: OUT/model.safetensors and OUT/config.json as export_hf_checkpoint writes them, with
// each adapted weight W replaced by W + (alpha / rank) B A in fp32. The base weights come from
// `base` (Hugging Face weights, as model.init_from takes them; empty: the run's
// model.init_from, or its seed's random initialization when it had none); the whole base model
// is held in memory. Files appear complete or not at all; OUT must be empty or absent unless
// `overwrite`. Throws std::invalid_argument for a checkpoint that holds no adapters, or a base
// whose tensors do not fit the checkpoint's model.
void export_lora_checkpoint(const std::string& checkpoint_dir, const std::string& out_dir,
                            LoraExport what, const std::string& base = "",
                            bool overwrite = false);

}  // namespace shardtrain
