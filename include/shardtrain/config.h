// The training configuration: TOML sections [model] [data] [train] [parallel] [precision]
// [lora] [compression] [run], one struct each, with `section.key=value` overrides. Every key is
// known; an unknown key or a wrong type is an error that names it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/model.h"
#include "shardtrain/parallel_names.h"

namespace shardtrain {

// [model]: a preset (or a Hugging Face config.json), then any size overridden by key; and where
// its weights come from.
struct ModelSection : ModelConfig {
  ModelSection() : ModelConfig(model_preset("tiny")) {}
  // model.preset and model.hf_config replace the shape; the keys below stay.
  ModelSection& operator=(const ModelConfig& shape) {
    ModelConfig::operator=(shape);
    return *this;
  }
  bool vocab_size_set = false;  // else the tokenizer's vocabulary size is used
  // Hugging Face safetensors weights (a file or a model folder) to start from instead of the
  // random initialization; empty: none.
  std::string init_from;
};

// [data]
struct DataSection {
  // A token shard, or text / JSONL files and directories to tokenize (data.format).
  std::vector<std::string> corpus;
  // "byte", "gpt2", or a Hugging Face tokenizer.json (or a model folder holding one); empty:
  // model.init_from's tokenizer.json when that folder has one, else "byte".
  std::string tokenizer;
  std::string gpt2_dir;  // encoder.json + vocab.bpe; empty: default_gpt2_dir()
  // "text" (documents cut into windows), "chat" ({"messages": [...]} lines through the chat
  // template, loss on the assistant's turns) or "prompt_completion" (loss on the completion).
  std::string format = "text";
  // The chat template's file (tokenizer_config.json, chat_template.jinja) or model folder;
  // empty: the tokenizer's folder.
  std::string chat_template;
  bool packing = true;                // instruction samples: several per sequence, or padded
  std::string overlong = "truncate";  // a sample longer than seq_len: "truncate" or "drop"
  int64_t seq_len = 64;
  int64_t eval_sequences = 32;  // held out from the end of the corpus
};

// [train]
struct TrainSection {
  int64_t steps = 100;
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;
  // Sequences per optimizer step over all data-parallel ranks (DeepSpeed's train_batch_size);
  // 0: micro_batch x grad_accum x data-parallel ranks. When set, grad_accum follows from it at
  // the run's world size, so a resume on fewer or more ranks keeps the global batch.
  int64_t global_batch = 0;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup = 10;
  std::string schedule = "cosine";     // "cosine", "linear" or "constant" after warmup
  std::string warmup_type = "linear";  // "linear" or "log" (DeepSpeed's default shape)
  // "adamw"; "lamb" (each tensor's AdamW-style update scaled by its trust ratio ||w|| / ||update||
  // clamped to [lamb_min_coeff, lamb_max_coeff]: DeepSpeed's Lamb); "onebit_adam" (Adam for
  // freeze_step updates, then each rank's momentum averaged compressed to one bit per element
  // instead of the gradients: DeepSpeed's OneBitAdam); "onebit_lamb" (LAMB for freeze_step
  // updates, then its ratios frozen and the momentum compressed: DeepSpeed's OneBitLamb);
  // "zero_one_adam" (averaged gradients only at variance updates, whose interval doubles, until
  // var_freeze_step, compressed ones between them; then local steps synchronized at intervals:
  // DeepSpeed's ZeroOneAdam). All but AdamW need whole parameters on every rank:
  // parallel.strategy "none" or "ddp" (docs/optimizer.md, "LAMB, 1-bit Adam and 1-bit LAMB").
  std::string optimizer = "adamw";
  double lamb_min_coeff = 0.01;
  double lamb_max_coeff = 10.0;
  int64_t freeze_step = 100000;
  // 1-bit LAMB's frozen ratio (an average of the warmup's with this decay) and the factor that
  // scales it after the warmup: within [min, max], moving at most `threshold` per step.
  double lamb_coeff_beta = 0.9;
  double lamb_factor_min = 0.5;
  double lamb_factor_max = 4.0;
  double lamb_factor_threshold = 0.1;
  // 0/1 Adam (ZeroOneAdamOptions): the last variance update, the variance updates after which
  // their interval doubles, and the local steps after which theirs doubles, up to the clipper.
  int64_t var_freeze_step = 100000;
  int64_t var_update_scaler = 16;
  int64_t local_step_scaler = 32678;
  int64_t local_step_clipper = 16;
  // "progressive": progressive layer dropping (DeepSpeed's progressive_layer_drop): at step k
  // the blocks l = 1..L are each kept with probability 1 - (l / L)(1 - theta_k) and their
  // residual branches scaled by its inverse, where theta_k = layer_drop_theta + (1 -
  // layer_drop_theta) exp(-layer_drop_gamma x max(0, k - 2)); the same blocks on every rank and
  // micro-batch of a step. "none": every block runs.
  std::string layer_drop = "none";
  double layer_drop_theta = 0.5;
  double layer_drop_gamma = 0.001;
  // Random layer-token dropping (random-LTD; DeepSpeed's data_efficiency.data_routing.random_ltd
  // for decoder models): each block listed (0-based) runs on n_k of a sequence's tokens at step k,
  // drawn uniformly without replacement for each sample, block and forward and kept in their
  // order; the other tokens pass that block unchanged. n_1 = random_ltd_min; after k completed
  // steps, n = min(random_ltd_max, m - m mod random_ltd_step) with m = floor(random_ltd_min +
  // (random_ltd_max - random_ltd_min) k / random_ltd_steps). A sequence of no more than
  // n tokens runs whole. Empty: every block sees every token. random_ltd_model_layers > 0: the
  // block count the listed ids were written for, which must be model.n_layers.
  std::vector<int64_t> random_ltd_layers;
  int64_t random_ltd_min = 128;
  int64_t random_ltd_max = 1024;
  int64_t random_ltd_steps = 1000;
  int64_t random_ltd_step = 8;
  int64_t random_ltd_model_layers = 0;
  // A bidirectional model (BERT) is trained on masked tokens: this share of each sequence's
  // positions is chosen (each independently), and of those 80% are replaced by the mask token,
  // 10% by a random token and 10% kept; the loss is over the chosen positions (Hugging Face's
  // DataCollatorForLanguageModeling, BERT's recipe).
  double mlm_probability = 0.15;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  // Adam's bias corrections of the moments (DeepSpeed's bias_correction; off: the step is lr x m /
  // (sqrt(v) + eps) from the first step on, as BERT's original optimizer).
  bool bias_correction = true;
  double clip = 1.0;  // global gradient norm; 0 disables
  // Consecutive steps with non-finite gradients (skipped) after which the run stops.
  int64_t max_skipped = 5;
  int64_t seed = 1234;
  int64_t eval_every = 0;  // steps; 0 disables
  int64_t eval_batches = 4;
  int64_t checkpoint_every = 0;  // steps; 0: only at the end
  int64_t keep_checkpoints = 2;
  bool final_checkpoint = true;  // a checkpoint after the last step
  bool activation_checkpointing = false;
  // The attention kernel (AttentionKernel): "blockwise", "fused", "reference", or "auto"
  // (blockwise; fused for a model with dropout, which the blockwise kernel does not apply).
  std::string attention = "auto";
  // The loss over chunks of loss_chunk_tokens tokens (0: about 32 MiB of fp32 logits each), the
  // head's [tokens x vocabulary] logits never held whole in training and evaluation; or
  // (false) over the whole logits.
  bool chunked_loss = true;
  int64_t loss_chunk_tokens = 0;
  // Before training, the micro-batch with the highest throughput (DeepSpeed's autotuning, its
  // fast mode): micro-batches autotune_min_micro_batch, twice that, ... up to
  // autotune_max_micro_batch (and, when autotune_max_batch > 0, to micro-batch x grad_accum x
  // data-parallel ranks <= autotune_max_batch) each train autotune_steps steps in a scratch run
  // directory, timed from step autotune_first_timed; the search stops at the first that cannot
  // run (memory, data) or runs 5% slower than the best. A new run only.
  bool autotune = false;
  int64_t autotune_min_micro_batch = 1;
  int64_t autotune_max_micro_batch = 1024;
  int64_t autotune_max_batch = 0;
  int64_t autotune_steps = 5;
  int64_t autotune_first_timed = 3;
  int64_t sample_tokens = 64;  // generated at the end; 0 disables
  std::string sample_prompt;   // under data.format "chat", the user's message
  double sample_temperature = 0.8;
  int64_t sample_top_k = 40;
};

// [precision]
struct PrecisionSection {
  std::string autocast = "none";    // "none", "bf16", "fp16"
  std::string loss_scale = "none";  // "none", "dynamic", or a fixed number
  double initial_scale = 65536.0;
  int64_t scale_window = 1000;
  double min_scale = 1.0;
  // Overflows absorbed before the scale is lowered (DeepSpeed's fp16.hysteresis); with
  // consecutive_hysteresis the count refills at every good step, else at every growth.
  int64_t hysteresis = 1;
  bool consecutive_hysteresis = false;
  // The dtypes of FSDP's mixed-precision policy: "fp32" or "bf16".
  std::string param_dtype = "fp32";   // gathered parameters the model computes with
  std::string reduce_dtype = "fp32";  // gradient reduction
  std::string buffer_dtype = "fp32";
  // fp8 training, emulated (Transformer Engine's delayed scaling): "none", "e4m3" (inputs,
  // weights and gradients of the blocks' linear layers rounded to E4M3) or "hybrid" (E4M3 in
  // forward, E5M2 gradients). Each tensor's scale is fp8 max / amax / 2^fp8_margin, amax the
  // largest magnitude over the last fp8_amax_history steps (fp8_amax_algo "max") or the last
  // step's alone ("most_recent"), over every rank.
  std::string fp8 = "none";
  int64_t fp8_amax_history = 1024;
  std::string fp8_amax_algo = "max";
  int64_t fp8_margin = 0;
};

// [parallel.ddp]
struct DdpSection {
  double bucket_cap_mb = 25.0;
  bool find_unused_parameters = false;
  DDPCommHook comm_hook = DDPCommHook::kNone;
};

// [parallel.fsdp]
struct FsdpSection {
  ShardingStrategy sharding = ShardingStrategy::kFullShard;
  int64_t replicate = 0;  // hybrid_shard's dp_replicate; 0: one per node
  FsdpWrap wrap = FsdpWrap::kBlock;
  int64_t min_params = 100000000;         // with wrap = "size"
  std::vector<std::string> wrap_classes;  // with wrap = "class"
  BackwardPrefetch prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = false;
  int64_t limit_all_gathers = 2;
  bool cpu_offload = false;
};

// [parallel.zero]: DeepSpeed's ZeRO; sizes in elements, as DeepSpeed counts them.
struct ZeroSection {
  int64_t stage = 1;  // 1, 2 or 3
  OffloadDevice offload_optimizer = OffloadDevice::kNone;
  OffloadDevice offload_param = OffloadDevice::kNone;  // stage 3
  std::string nvme_path;                               // directory for nvme offload
  bool pin_memory = false;
  bool overlap_comm = true;
  bool contiguous_gradients = true;
  int64_t reduce_bucket_size = 500000000;
  int64_t allgather_bucket_size = 500000000;
  int64_t prefetch_bucket_size = 50000000;       // stage 3
  int64_t param_persistence_threshold = 100000;  // stage 3
  int64_t max_live_parameters = 1000000000;      // stage 3
};

// [parallel]
struct ParallelSection {
  // None (one process), ddp, fsdp or zero.
  ParallelStrategy strategy = ParallelStrategy::kNone;
  // Tensor parallelism (docs/tp.md): layers split across groups of `tp` neighbouring ranks;
  // the strategy runs across the world / tp data-parallel ranks ("none" when there is one).
  int64_t tp = 1;
  bool sequence_parallel = false;  // with tp > 1: norms and dropout on 1/tp of the sequence
  // Context parallelism (docs/cp.md): each sequence split over groups of `cp` ranks, each holding
  // two of its 2 cp chunks, attention by ring; they hold the same parameters, and the strategy
  // runs across dp_shard x cp.
  int64_t cp = 1;
  // Expert parallelism (docs/moe.md): a mixture-of-experts model's experts split over groups of
  // `ep` data-parallel ranks (carved out of dp_shard), tokens sent to the ranks holding their
  // experts by all-to-all; the data-parallel strategy shards the experts over the dp_shard / ep
  // ranks that hold the same ones, and everything else over every data-parallel rank.
  int64_t ep = 1;
  // Pipeline parallelism (docs/pp.md): the blocks split into pp x pp_virtual_stages stages on
  // the mesh's outermost axis, train.grad_accum micro-batches per step run by pp_schedule.
  // pp_split: blocks per stage (empty: balanced). pp_microbatches, when set, is
  // train.grad_accum under another name.
  int64_t pp = 1;
  PipelineScheduleKind pp_schedule = PipelineScheduleKind::kOneFOneB;
  int64_t pp_virtual_stages = 1;
  std::vector<int64_t> pp_split;
  int64_t pp_microbatches = 0;
  DdpSection ddp;
  FsdpSection fsdp;
  ZeroSection zero;
};

// [lora]: low-rank adapters (lora.h) on the chosen linear layers; every other parameter is
// frozen, and only the adapters are trained, communicated and checkpointed. rank 0: off
// (every parameter trains).
struct LoraSection {
  int64_t rank = 0;
  double alpha = 16.0;                                       // the update is scaled by alpha / rank
  double dropout = 0.0;                                      // on the adapters' input
  std::vector<std::string> target_modules = {"all-linear"};  // PEFT's target_modules
  std::string base_dtype = "fp32";  // the frozen base weights' storage dtype
};

// [compression]: quantization-aware training (DeepSpeed's compression_training weight and
// activation quantization, docs/compression.md). Each group names layers by regular
// expressions searched in their names (ours, "blocks.0.attn.qkv", and Hugging Face's,
// "transformer.h.0.attn.c_attn") and gives their bits; no groups: off.
struct CompressionSection {
  // Weights of the matched linear layers of the blocks, quantized in every forward (the
  // optimizer steps the unquantized ones): weight_bits[i] for the layers weight_modules[i]
  // matches; 1 is binary, 2 ternary, more the uniform grid of weight_type.
  std::vector<int64_t> weight_bits;
  std::vector<std::vector<std::string>> weight_modules;
  int64_t weight_groups = 1;  // each weight's elements in this many groups of their own scale
  std::string weight_type = "symmetric";  // or "asymmetric"
  int64_t weight_offset = 0;              // the first step (0-based) that quantizes
  // The inputs of the matched linear layers, each token's features on a grid of its own range.
  std::vector<int64_t> activation_bits;
  std::vector<std::vector<std::string>> activation_modules;
  std::string activation_type = "symmetric";
  int64_t activation_offset = 0;

  bool enabled() const { return !weight_bits.empty() || !activation_bits.empty(); }
};

// [run]
struct RunSection {
  std::string dir = "runs/default";
  int64_t log_every = 10;
  // "": a new run (refused when run.dir already holds one, unless run.overwrite); "latest" or a
  // checkpoint directory: continue from it; "auto": from the latest complete checkpoint when
  // there is one, else a new run in place (what a restarted job wants).
  std::string resume;
  // A new run into a run.dir that holds one moves the old run aside (to RUN_DIR.old.N).
  bool overwrite = false;
  int64_t threads = 0;  // intra-op threads; 0 leaves LibTorch's default
  // Where the model, its gradients, the optimizer state and the batches live: "cpu", or "cuda"
  // (the GPU LOCAL_RANK % the GPUs visible; one process, parallel.strategy "none").
  std::string device = "cpu";
  // What happens to large CPU blocks that tensors free (shardtrain/memory.h): "cache" keeps them
  // for the next step's tensors (within the most ever live at once), "return" hands them back to
  // the kernel at once, "malloc" leaves them to the C library; "auto" caches unless ZeRO keeps
  // state in files.
  std::string freed_memory = "auto";
  // Seconds a rendezvous or a collective may wait for the other ranks before failing (PyTorch's
  // default: 30 minutes). Checkpoint saves wait for the slowest rank's write regardless.
  double timeout = 1800.0;
  // Before anything is allocated, compare the planner's estimate of this run's memory per rank
  // with what a rank may use here (memory cgroup limit, available host memory) and refuse a
  // run that cannot fit, naming a strategy that would.
  bool memory_check = true;
  // Checkpoints written behind training: the step waits only while this rank's share is copied
  // to host memory; a thread writes the files, a second save waits for the first, and the
  // run's last checkpoint is waited for. Needs the training state in memory (not ZeRO's files).
  bool checkpoint_async = false;
  // "replicas": the data-parallel replicas (each rank of parallel.strategy = "ddp") train on
  // when one fails, and a replica restarted by `shardtrain launch --fault-tolerance` takes the
  // training state from a healthy one at a step boundary (docs/training.md). "none": a failed
  // rank stops the job (a launcher's --max-restarts restarts it from its latest checkpoint).
  std::string fault_tolerance = "none";
  // Each rank records a timeline of steps trace_first..trace_last (0: through the last step)
  // as Chrome trace events in RUN_DIR/trace/rank_N.json (docs/trace.md). The range is used and
  // checked only with trace = true.
  bool trace = false;
  int64_t trace_first = 1;
  int64_t trace_last = 0;
};

// One member per TOML section; a key "section.key" (or "parallel.fsdp.key") is the member of
// the same path, and the strategies' names are parsed into their enums here, once.
struct TrainConfig {
  ModelSection model;
  DataSection data;
  TrainSection train;
  PrecisionSection precision;
  ParallelSection parallel;
  LoraSection lora;
  CompressionSection compression;
  RunSection run;

  // Checks relations between keys (seq_len within the context, min_lr <= lr, ...) and throws
  // std::invalid_argument naming the keys.
  void validate() const;
};

// Parses TOML text (`source` names it in errors), then applies overrides "section.key=value",
// where value is a TOML value (strings may be left unquoted). Throws std::invalid_argument.
TrainConfig parse_train_config(const std::string& toml_text, const std::string& source,
                               const std::vector<std::string>& overrides = {});
TrainConfig load_train_config(const std::string& path,
                              const std::vector<std::string>& overrides = {});

// Importers of other tools' config files. Each translates a file into overrides
// "section.key=value" (what parse_train_config and `--set` take), to be applied on top of a TOML
// config, so every relation between keys is still checked in one place, by TrainConfig::validate.
// `world_size` is the number of launched ranks (all data parallel): it resolves batch sizes and
// is checked against the file's own process count. A key the importer does not know, or a value
// shardtrain cannot honour exactly, throws std::invalid_argument naming the key (by its path in
// the file, e.g. "zero_optimization.stage3_foo") and the value; nothing is silently downgraded.
// docs/deepspeed.md lists every key and what it becomes.

// What an imported file left to the TOML config or took from its tool's defaults, told to the
// user one line each before training (describe_import_notes).
struct ImportNote {
  std::string file_key;    // the key's path in the file ("bf16.enabled"), or the section absent
  std::string config_key;  // the key that keeps the TOML config's (or --set's) value; or empty
  std::string text;        // for a default the importer chose: what and why
};

// One line per note: "FILE: 'bf16.enabled' is \"auto\": precision.param_dtype = \"fp32\" (from the
// TOML config)", or "FILE: no 'scheduler': constant learning rate ...".
std::vector<std::string> describe_import_notes(const TrainConfig& config, const std::string& file,
                                               const std::vector<ImportNote>& notes);

// DeepSpeed's ds_config.json: zero_optimization, bf16, fp16, gradient_clipping, the three batch
// sizes ("auto" resolved from the others and world_size), optimizer (Adam/AdamW) and scheduler
// (WarmupLR, WarmupDecayLR, WarmupCosineLR). `source` names the text in errors.
// `notes`, when given, receives what the file left to the TOML config or to DeepSpeed's defaults.
std::vector<std::string> deepspeed_overrides_from_json(const std::string& json_text,
                                                       const std::string& source, int world_size,
                                                       std::vector<ImportNote>* notes = nullptr);
std::vector<std::string> deepspeed_overrides(const std::string& path, int world_size,
                                             std::vector<ImportNote>* notes = nullptr);

// accelerate's config YAML with distributed_type FSDP: its fsdp_config section, mixed_precision
// and num_processes (which must equal world_size).
std::vector<std::string> accelerate_overrides_from_yaml(const std::string& yaml_text,
                                                        const std::string& source, int world_size,
                                                        std::vector<ImportNote>* notes = nullptr);
std::vector<std::string> accelerate_overrides(const std::string& path, int world_size,
                                              std::vector<ImportNote>* notes = nullptr);

}  // namespace shardtrain
