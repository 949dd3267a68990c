#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <numeric>
#include <optional>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "comm/join.h"
#include "comm/replica_world.h"
#include "model/autocast.h"
#include "model/compression.h"
#include "model/fp8.h"
#include "model/layers.h"
#include "optim/swap_file.h"
#include "parallel/parallelize.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/fused_adamw.h"
#include "shardtrain/generate.h"
#include "shardtrain/hf.h"
#include "shardtrain/lora.h"
#include "shardtrain/memory.h"
#include "shardtrain/optimizers.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/threads.h"
#include "shardtrain/train.h"
#include "trace/telemetry.h"
#include "train/layer_drop.h"
#include "train/memory_check.h"
#include "train/rank_agreement.h"
#include "train/run_data.h"
#include "train/run_dir.h"
#include "train/run_manifest.h"
#include "train/run_setup.h"
#include "train/training_device.h"

namespace shardtrain {

Trainer::Trainer(TrainConfig config, std::shared_ptr<ProcessGroup> world, int restart_count)
    : config_(std::move(config)), world_(std::move(world)), restart_count_(restart_count) {
  if (config_.run.fault_tolerance == "replicas") {
    config_.validate();
    if (world_) {
      throw std::invalid_argument(
          "run.fault_tolerance = \"replicas\": the trainer joins the replicas itself; pass no "
          "world group");
    }
    // Each rank of a ddp run is a replica, each shard group of a hybrid_shard run; the
    // launcher hosts the store.
    const RendezvousInfo info = rendezvous_info(current_environment());
    int replica_size = 1;
    if (config_.parallel.strategy != ParallelStrategy::kDdp) {
      const MeshShape shape = train_mesh_shape(config_, info.world_size, info.local_world_size);
      replica_size = info.world_size / shape.degree(MeshAxis::kDpReplicate);
    }
    replicas_ = ReplicaWorld::connect(info, replica_size,
                                      ProcessGroupOptions().timeout(std::chrono::milliseconds(
                                          static_cast<int64_t>(config_.run.timeout * 1000))));
    world_ = replicas_->world();
  }
  set_up_ranks();
  set_up_tokenizer();
  // A run directory this start-up creates goes again when the start-up fails (a model file or
  // an offload path refused after the corpus was tokenized into it): a refused run leaves no
  // half-made run behind for a later `resume = "auto"` to trip over.
  std::error_code error;
  const bool new_run_dir = rank() == 0 && !std::filesystem::exists(config_.run.dir, error);
  try {
    const std::string resume_from = prepare_data();
    build_model();
    build_optimizer();
    if (!resume_from.empty()) load_checkpoint(resume_from);
    // Written last, so a run that fails to start leaves the previous run.json as it was.
    if (rank() == 0 && !joins_running_replicas()) {
      detail::write_run_manifest(config_, world_size(), resident_at_start_);
    }
  } catch (...) {
    if (new_run_dir) {
      run_lock_.reset();
      std::filesystem::remove_all(config_.run.dir, error);
    }
    throw;
  }
}

void Trainer::set_up_ranks() {
  config_.validate();
  check_parallel_settings(config_);
  // Before anything else: every rank runs the same settings (a rank started with other ones
  // would fail later, or worse, not).
  if (world_) detail::check_same_config(config_, *world_);
  // The mesh first, the one source of data-parallel rank and size: tp dividing the world,
  // hybrid_shard's replicas.
  const MeshShape shape =
      train_mesh_shape(config_, world_size(), world_ ? world_->ranks_per_node() : 1);
  check_data_parallel_ranks(config_, shape, world_size());
  if (!world_ && runs_on_a_group(config_)) {
    // A group of one rank, so that a single process runs the same step.
    world_ = init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  }
  if (world_) mesh_ = std::make_unique<DeviceMesh>(world_, shape);
  // The micro-batches per step that keep train.global_batch on this world's data-parallel ranks.
  detail::apply_global_batch(config_, dp_size());
  if (config_.run.checkpoint_async && world_ && world_->size() > 1) {
    // The writing thread's collectives on a group of their own, never interleaved with the
    // training's on the same group.
    std::vector<int> everyone(static_cast<size_t>(world_->size()));
    std::iota(everyone.begin(), everyone.end(), 0);
    checkpoint_group_ = world_->new_group(everyone);
  }
  if (config_.run.checkpoint_async) checkpoint_staging_ = std::make_shared<CheckpointStaging>();
  if (config_.precision.autocast == "fp16") {
    // LibTorch's CPU autocast has no fp16 kernels, and the CUDA path trains in bf16.
    throw std::invalid_argument(
        "precision.autocast = \"fp16\" is not supported; use \"bf16\" (loss scaling via "
        "precision.loss_scale works with it)");
  }
  if (config_.run.device == "cuda") device_ = detail::cuda_device_of_this_rank();
  if (config_.run.threads > 0) set_num_threads(static_cast<int>(config_.run.threads));
  use_fp32_gemm_for_cpu_bf16();
  install_cpu_memory_tracking();
  telemetry_ = std::make_shared<detail::Telemetry>(rank());
  progress_bar_ = rank() == 0 && isatty(STDOUT_FILENO);
}

void Trainer::set_up_tokenizer() {
  // Inputs first: nothing under run.dir changes until the config, the tokenizer and the
  // corpus have been checked and every rank has decided how the run starts.
  tokenizer_ = detail::make_tokenizer(config_);
  chat_template_ = detail::make_chat_template(config_);
  // A masked-language model's mask token may be one past the tokenizer's ids.
  const int64_t needed =
      config_.model.bidirectional()
          ? std::max<int64_t>(tokenizer_->vocab_size(), detail::mask_token_id(*tokenizer_) + 1)
          : tokenizer_->vocab_size();
  if (!config_.model.vocab_size_set) {
    config_.model.vocab_size = needed;
  } else if (config_.model.vocab_size < needed) {
    throw std::invalid_argument(
        "model.vocab_size " + std::to_string(config_.model.vocab_size) + " is smaller than the " +
        tokenizer_->name() + " tokenizer's vocabulary of " +
        std::to_string(tokenizer_->vocab_size()) +
        (needed > tokenizer_->vocab_size() ? " plus the mask token the bert family trains with"
                                           : ""));
  }
  // The sizes tensor parallelism splits, before the run directory is touched.
  check_tp_sizes(config_, config_.model.vocab_size_set
                              ? std::string("model.vocab_size")
                              : tokenizer_->name() + " tokenizer's vocabulary");
}

std::string Trainer::prepare_data() {
  // Nothing yet when the corpus is to be tokenized.
  data_ = std::make_unique<detail::TrainingData>(detail::open_prepared_data(config_));
  if (data_->defined()) check_vocabulary();
  // A restarted replica joins the run in place: rank 0 of the first start made the directory
  // and the data, and the state comes from a healthy replica, not a checkpoint.
  const bool joins = joins_running_replicas();
  const detail::RunStart start =
      joins ? detail::RunStart{} : detail::plan_run_start(config_, restart_count_ > 0);
  // Before the corpus is tokenized again into the run directory: a resume with another
  // tokenizer would rewrite the run's shard and then fail on the embedding's shape.
  if (!start.checkpoint.empty()) detail::check_resume_tokenizer(start.checkpoint, *tokenizer_);
  // Rank 0 tokenizes before anything under run.dir changes: bad data stops every rank there.
  detail::TokenizedData tokenized;
  std::string bad_data;
  if (!data_->defined() && rank() == 0 && !joins) {
    try {
      tokenized = detail::tokenize_data(config_, *tokenizer_, chat_template_.get(),
                                        start.move_aside.empty());
    } catch (const std::invalid_argument& e) {
      bad_data = e.what();
    }
  }
  if (world_ ? detail::on_any_rank(*world_, !bad_data.empty()) : !bad_data.empty()) {
    throw std::invalid_argument(rank() == 0 ? bad_data
                                            : "rank 0 could not tokenize data.corpus (its error "
                                              "says why)");
  }
  // Before anything is allocated: a run that cannot fit says so instead of being killed.
  resident_at_start_ = detail::resident_bytes();
  // The estimate is of host memory; on CUDA the model and its state are on the GPU.
  if (config_.run.memory_check && !device_.is_cuda()) {
    detail::check_memory_fits(config_, world_size(), detail::rank_memory_budget(world_.get()),
                              resident_at_start_);
  }
  barrier();  // every rank has looked before rank 0 changes the directory
  // Rank 0 takes run.dir for this run, after checking that no live run holds it: a second run
  // (or run.overwrite) would otherwise move or mix a running job's files.
  std::string in_use;
  if (rank() == 0 && !joins) {
    try {
      detail::check_not_in_use(config_.run.dir);
      detail::prepare_run_dir(config_, start);
      run_lock_ = std::make_unique<detail::RunDirLock>(config_.run.dir);
    } catch (const std::invalid_argument& e) {
      in_use = e.what();
    }
  }
  if (world_ ? detail::on_any_rank(*world_, !in_use.empty()) : !in_use.empty()) {
    throw std::invalid_argument(rank() == 0 ? in_use
                                            : "rank 0 could not take run.dir (its error says why)");
  }
  std::filesystem::create_directories(config_.run.dir);  // ranks on other hosts' file systems
  // Checkpoints are written by every rank into one directory: it must be the same storage.
  if (world_ && !joins) detail::check_shared_run_dir(config_, *world_);
  if (!data_->defined()) {
    // Rank 0 writes the tokenized data into RUN_DIR once, before the others open the shard.
    if (rank() == 0 && !joins) {
      *data_ = detail::store_data(config_, tokenized, tokenizer_->vocab_size());
      tokenized = detail::TokenizedData();
    }
    barrier();
    if (rank() != 0 || joins) *data_ = detail::open_data(config_);
  }
  check_vocabulary();
  loader_ = detail::make_loader(config_, *data_, *tokenizer_, dp_rank(), dp_size());
  return joins ? std::string() : start.checkpoint;
}

void Trainer::build_model() {
  {
    // The seed fixes the initial weights (ModelInit); dropout draws from LibTorch's global
    // generator, which ranks that are threads of one process share: seeded one at a time.
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(static_cast<uint64_t>(config_.train.seed));
    // Described only: parallelize() allocates and initializes what this rank holds (with
    // model.init_from, reading just those bytes of the Hugging Face files).
    ModelInit init = ModelInit().seed(static_cast<uint64_t>(config_.train.seed)).deferred();
    if (!config_.model.init_from.empty())
      init.values(hf_initializer(config_.model, config_.model.init_from));
    // A pipeline rank builds its stages only, an expert-parallel rank its experts only.
    limit_to_own_parts(init, config_, pp_rank(), mesh_ ? mesh_->data_parallel_mesh().ep_rank() : 0);
    model_ = Transformer(config_.model, std::move(init));
    // Fine-tuning with adapters: the base is frozen before any strategy sees the model, so
    // that only the adapters are in the optimizer, the gradient reductions and checkpoints.
    if (config_.lora.rank > 0) {
      add_lora(*model_, detail::lora_options(config_));
      // The frozen base's linear weights in lora.base_dtype: stored, gathered and sent so.
      if (config_.lora.base_dtype != "fp32") {
        detail::store_frozen_linears(*model_, config_.lora.base_dtype);
      }
    }
    if (config_.compression.enabled()) {
      compression_ =
          std::make_unique<detail::Compression>(*model_, config_.model, config_.compression);
    }
    if (config_.precision.fp8 != "none") {
      auto recipe = std::make_shared<detail::Fp8Recipe>();
      recipe->hybrid = config_.precision.fp8 == "hybrid";
      recipe->history = config_.precision.fp8_amax_history;
      recipe->most_recent = config_.precision.fp8_amax_algo == "most_recent";
      recipe->margin = config_.precision.fp8_margin;
      fp8_layers_ = detail::enable_fp8(*model_->blocks(), std::move(recipe));
      // Where the model trains, all at once: a block skipped by layer dropping still reduces.
      for (const auto& layer : fp8_layers_) layer->to(device_);
    }
  }
  const bool give_back = detail::apply_freed_memory(config_);
  parallel_ = parallelize(model_, config_, world_, mesh_.get());
  if (give_back) detail::trim_heap();  // what initialization used and freed
}

void Trainer::build_optimizer() {
  // Weight decay on matrices only: biases, norms and 1-D tensors are not decayed (as GPT-2
  // and Llama training do). Under FSDP the optimizer holds this rank's pieces of them.
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& t : parallel_->optimized()) (t.matrix ? decay : no_decay).push_back(t.tensor);
  auto options = torch::optim::AdamWOptions(config_.train.lr)
                     .betas({config_.train.beta1, config_.train.beta2})
                     .eps(config_.train.eps)
                     .weight_decay(config_.train.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(options).weight_decay(0.0)));
  const TrainSection& train = config_.train;
  if (train.optimizer == "lamb") {
    optimizer_ = std::make_unique<Lamb>(
        std::move(groups), options,
        LambOptions{train.lamb_min_coeff, train.lamb_max_coeff, train.bias_correction});
  } else if (train.optimizer == "onebit_adam") {
    optimizer_ = std::make_unique<OneBitAdam>(std::move(groups), options, train.freeze_step);
  } else if (train.optimizer == "onebit_lamb") {
    OneBitLambOptions lamb;
    lamb.freeze_step = train.freeze_step;
    lamb.min_coeff = train.lamb_min_coeff;
    lamb.max_coeff = train.lamb_max_coeff;
    lamb.coeff_beta = train.lamb_coeff_beta;
    lamb.factor_min = train.lamb_factor_min;
    lamb.factor_max = train.lamb_factor_max;
    lamb.factor_threshold = train.lamb_factor_threshold;
    optimizer_ = std::make_unique<OneBitLamb>(std::move(groups), options, lamb);
  } else if (train.optimizer == "zero_one_adam") {
    optimizer_ = std::make_unique<ZeroOneAdam>(
        std::move(groups), options,
        ZeroOneAdamOptions{train.var_freeze_step, train.var_update_scaler, train.local_step_scaler,
                           train.local_step_clipper});
  } else {
    // The fused kernel gives LibTorch's AdamW results bit for bit, in one pass over memory.
    auto fused = std::make_unique<FusedAdamW>(std::move(groups), options);
    fused->set_bias_correction(train.bias_correction);
    optimizer_ = std::move(fused);
  }
  schedule_ = LrSchedule{config_.train.lr,    config_.train.min_lr,   config_.train.warmup,
                         config_.train.steps, config_.train.schedule, config_.train.warmup_type};
  scaler_ = LossScaler::from_config(config_.precision.loss_scale, config_.precision.initial_scale,
                                    config_.precision.scale_window, config_.precision.min_scale);
  scaler_.set_hysteresis(config_.precision.hysteresis, config_.precision.consecutive_hysteresis);
}

void Trainer::check_vocabulary() const {
  if (static_cast<int64_t>(data_->vocab_size()) > config_.model.vocab_size) {
    throw std::invalid_argument(std::string(data_->tokens ? "token" : "sample") + " shard '" +
                                data_->path() + "' was written with a " +
                                std::to_string(data_->vocab_size()) +
                                "-token vocabulary, larger than model.vocab_size " +
                                std::to_string(config_.model.vocab_size));
  }
}

void Trainer::barrier() const {
  if (world_size() > 1) world_->barrier()->wait();
}

Trainer::~Trainer() {
  try {
    wait_for_checkpoint();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardtrain: rank %d: the asynchronous checkpoint save failed: %s\n",
                 rank(), e.what());
  }
  try {
    write_trace();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardtrain: rank %d could not write its trace: %s\n", rank(), e.what());
  }
}

StepResult Trainer::train_step() {
  detail::TelemetryScope telemetry(telemetry_);
  const bool traced = trace_step(step_ + 1);
  if (!traced) write_trace();  // a traced range that ended (when steps are called one by one)
  const auto start = std::chrono::steady_clock::now();
  if (steps_this_process_++ == 0) first_step_at_ = start;
  // What was communicated and waited for between steps (start-up, evaluation, a checkpoint's
  // barriers) is no step's: a wait there would otherwise be counted as this step's.
  telemetry_->interval();
  telemetry_->name_thread("train");  // the row of whichever thread trains
  const detail::SwapIoTotals io_before = detail::swap_io_totals();
  model_->train();
  StepResult result;
  std::optional<detail::TraceSpan> update_span;  // from the finite check to the optimizer's end
  const bool finite =
      replicas_ ? step_on_replicas(result, update_span) : step_body(result, update_span);
  result.skipped = !scaler_.update(finite);
  if (!result.skipped) optimizer_step(result.lr);
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());  // its kernels in its time
  update_span.reset();
  // A skipped step still consumes its data and advances the schedule, as AMP and DeepSpeed do.
  ++step_;
  samples_ += loader_->global_batch_size();
  const auto end = std::chrono::steady_clock::now();
  result.step_time_s = std::chrono::duration<double>(end - start).count();
  add_step_totals(result, start, end, io_before);
  result.tokens_per_s =
      static_cast<double>(loader_->global_batch_size() * config_.data.seq_len) / result.step_time_s;
  peak_rss_ = std::max(peak_rss_, detail::peak_resident_bytes());
  return result;
}

bool Trainer::step_on_replicas(StepResult& result, std::optional<detail::TraceSpan>& update_span) {
  // The body runs again, on the replicas that remain, when one failed in it; it stands only
  // once every member finished it (comm/replica_world.h).
  for (;;) {
    bool finite = false;
    std::exception_ptr failure;
    std::string error;
    try {
      const int source = replicas_->begin_step(step_ + 1);
      if (source >= 0) take_state_from(source);
      finite = step_body(result, update_span);
    } catch (const std::exception& e) {
      failure = std::current_exception();
      error = e.what();
      replicas_->abandon();
      parallel_->abandon_pass();
    }
    bool stands = false;
    try {
      stands = replicas_->finish_step(step_ + 1, !failure, kReplicaLossWait);
    } catch (const std::runtime_error&) {
      if (failure) std::rethrow_exception(failure);  // not a lost replica: its own error
      throw;
    }
    if (stands) return finite;
    if (rank() == 0) {
      std::fprintf(stderr,
                   "shardtrain: step %lld is taken again without the replica that failed%s%s\n",
                   static_cast<long long>(step_ + 1), error.empty() ? "" : ": ",
                   detail::first_line(error).c_str());
    }
  }
}

bool Trainer::step_body(StepResult& result, std::optional<detail::TraceSpan>& update_span) {
  parallel_->zero_grad(*optimizer_);
  if (compression_) compression_->set_step(step_);
  // 1-bit Adam and LAMB past their warmup, and 0/1 Adam between its variance updates, leave the
  // gradients unaveraged.
  if (auto* onebit = dynamic_cast<CompressedMomentumOptimizer*>(optimizer_.get()))
    onebit->set_group(parallel_->keep_gradients_local(onebit->compressing()));
  // Everything above the bytes held now (parameters, optimizer state) that forward and
  // backward add at their peak: activations, gradients and temporaries.
  const int64_t before = cpu_memory_stats().live_bytes;
  reset_peak_cpu_memory();
  // Progressive layer dropping: the blocks this step runs, drawn once for its forwards.
  std::vector<double> drop;
  if (config_.train.layer_drop != "none") {
    drop =
        detail::layer_drop_scales(config_.train, step_, config_.model.n_layers, config_.train.seed);
    model_->set_layer_drop(drop);
  }
  // Random layer-token dropping: the step's token count; each rank and forward draws its own.
  int64_t ltd_tokens = -1;
  if (!config_.train.random_ltd_layers.empty()) {
    TransformerImpl::TokenDrop token_drop =
        detail::random_ltd_drop(config_.train, step_, config_.model.n_layers, rank());
    ltd_tokens = token_drop.tokens;
    model_->set_token_drop(std::move(token_drop));
  }
  const double loss_sum = forward_backward();
  // precision.fp8: the step's largest magnitudes of every rank make the next step's scales.
  detail::update_fp8_scales(fp8_layers_, world_.get());
  result = StepResult();
  result.random_ltd_tokens = ltd_tokens;
  result.step = step_ + 1;
  result.loss = loss_sum / static_cast<double>(config_.train.grad_accum);
  if (config_.model.moe()) add_routing(result);
  if (!drop.empty()) {
    result.layer_drop_theta = detail::layer_drop_theta(config_.train, step_);
    result.blocks_run = std::count_if(drop.begin(), drop.end(), [](double s) { return s > 0; });
  }
  result.activations_peak = cpu_memory_stats().peak_bytes - before;
  if (after_backward_) after_backward_(step_);

  update_span.emplace("optimizer", "optimizer");
  const bool finite = parallel_->gradients_finite(scaler_);
  result.lr = schedule_.at(step_);
  result.grad_norm = NAN;  // none when the gradients are not finite (null in metrics.jsonl)
  if (finite) result.grad_norm = parallel_->clip_grad_norm(config_.train.clip);
  return finite;
}

double Trainer::forward_backward() {
  StepInputs step;
  step.micro_batch = [this](int micro_batch) {
    return detail::batch_on_device(loader_->micro_batch(samples_, micro_batch), device_);
  };
  step.micro_batches = static_cast<int>(config_.train.grad_accum);
  step.loss_scale = scaler_.scale();
  step.bf16_autocast = config_.precision.autocast == "bf16";
  step.device = device_.type();
  step.loss_chunk = loss_chunk();
  step.rows = config_.train.micro_batch;
  step.length = config_.data.seq_len;
  // The load-balancing loss's gradient is scaled as the training loss's is.
  model_->set_aux_loss_weight(step.loss_scale / static_cast<double>(step.micro_batches));
  return parallel_->forward_backward(step);
}

void Trainer::add_routing(StepResult& result) {
  const MoeStats stats = model_->take_moe_stats();
  // Every rank's counts and losses summed: data-parallel ranks routed different sequences and
  // pipeline stages different layers (the other entries of their counts are zero); the ranks of
  // a tensor-parallel group routed the same tokens, counted once.
  at::Tensor totals = at::cat(
      {stats.tokens_per_expert.reshape({-1}).to(at::kDouble),
       at::tensor({stats.aux_loss_sum, static_cast<double>(stats.aux_losses)}, at::kDouble)});
  if (world_ && world_->size() > 1) world_->all_reduce(totals, ReduceOp::kSum)->wait();
  const int64_t n = stats.tokens_per_expert.numel();
  const at::Tensor tokens = totals.narrow(0, 0, n) / static_cast<double>(config_.parallel.tp);
  result.expert_tokens_min = tokens.min().item<double>();
  result.expert_tokens_mean = tokens.mean().item<double>();
  result.expert_tokens_max = tokens.max().item<double>();
  const double count = totals[n + 1].item<double>();
  if (count > 0) result.aux_loss = totals[n].item<double>() / count;
}

void Trainer::optimizer_step(double lr) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  parallel_->optimizer_step(*optimizer_, lr);
}

void Trainer::add_step_totals(StepResult& result, std::chrono::steady_clock::time_point start,
                              std::chrono::steady_clock::time_point end,
                              const detail::SwapIoTotals& io_before) {
  // A collective started before the step (ZeRO's gathers after the previous optimizer step)
  // counts here when it finishes during the step.
  const detail::Telemetry::Totals comm = telemetry_->interval();
  result.comm_s = comm.comm_seconds;
  result.comm_exposed_s = comm.wait_seconds;
  result.comm_bytes = comm.comm_bytes;
  result.comm_tp_s = comm.tp_seconds;
  result.comm_tp_bytes = comm.tp_bytes;
  telemetry_->add_span(("step " + std::to_string(result.step)).c_str(), "step", start, end,
                       {{"step", result.step}});
  const detail::SwapIoTotals io = detail::swap_io_totals();
  result.file_read_bytes = io.read_bytes - io_before.read_bytes;
  result.file_written_bytes = io.written_bytes - io_before.written_bytes;
  result.file_io_s = io.seconds - io_before.seconds;
  result.file_wait_s = io.wait_seconds - io_before.wait_seconds;
}

std::optional<int64_t> Trainer::loss_chunk() const {
  if (!config_.train.chunked_loss) return std::nullopt;
  return config_.train.loss_chunk_tokens;
}

double Trainer::evaluate() {
  detail::TelemetryScope telemetry(telemetry_);
  detail::TraceSpan span("eval", "eval");
  fail_if_injected(InjectionPoint::kEvaluation);
  torch::NoGradGuard no_grad;
  model_->eval();
  // The model the next step would train: quantized once the offsets are reached.
  if (compression_) compression_->set_step(step_);
  const std::unique_ptr<StageScope> held = parallel_->inference_scope();
  double total = 0.0;
  for (int64_t i = 0; i < config_.train.eval_batches; ++i) {
    detail::AutocastScope autocast(
        detail::bf16_autocast(config_.precision.autocast == "bf16", device_.type()));
    const Batch batch = detail::batch_on_device(loader_->eval_batch(i), device_);
    // Undefined on ranks that do not hold the last stage.
    const at::Tensor loss = parallel_->batch_loss(batch, loss_chunk());
    if (loss.defined()) total += loss.item<double>();
  }
  model_->train();
  total = parallel_->eval_total(total);
  return total / static_cast<double>(config_.train.eval_batches);
}

std::string Trainer::generate(const std::string& prompt, int64_t tokens) {
  require_text_generation(config_.model);
  torch::NoGradGuard no_grad;
  model_->eval();
  if (compression_) compression_->set_step(step_);
  const std::unique_ptr<StageScope> held = parallel_->inference_scope();
  // Trained on conversations, the model continues the template's text: the prompt is the
  // user's message, the assistant's turn is opened, and the reply ends with its special token.
  const bool chat = chat_template_ && config_.data.format == "chat";
  const std::string text =
      chat ? chat_template_->render({ChatMessage{"user", prompt}}, /*add_generation_prompt=*/true)
           : prompt;
  // Documents were trained on with what the tokenizer puts before them (Llama's BOS); a chat
  // template writes its own.
  std::vector<int32_t> ids = tokenizer_->encode(text, /*add_special=*/!chat);
  if (ids.empty()) ids.push_back(tokenizer_->eos_id());
  const size_t prompt_length = ids.size();
  auto generator =
      at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(config_.train.seed));
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t start =
        std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - config_.model.context_length);
    at::Tensor context = at::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), at::kLong)
                             .unsqueeze(0)
                             .to(device_);
    // The rank that holds the last position's logits samples; the others learn the token.
    const at::Tensor logits = parallel_->logits(context, SequenceLayout());
    at::Tensor next = at::zeros({1}, at::kLong);
    if (logits.defined()) next.fill_(sample_next(logits[0][-1].to(at::kCPU), generator));
    parallel_->share_sampled(next);
    const auto id = static_cast<int32_t>(next.item<int64_t>());
    // Every rank drew (or was sent) the same id, so all stop together.
    if (chat && tokenizer_->is_special(id)) break;
    ids.push_back(id);
  }
  model_->train();
  std::vector<int32_t> generated(ids.begin() + static_cast<int64_t>(prompt_length), ids.end());
  return text + tokenizer_->decode(generated);
}

int64_t Trainer::sample_next(const at::Tensor& logits, at::Generator& generator) {
  return sample_token(parallel_->whole_vocabulary(logits), tokenizer_->vocab_size(),
                      config_.train.sample_temperature, config_.train.sample_top_k, generator);
}

void Trainer::fail_if_injected(InjectionPoint point) const {
  // Fault injection for restart and timeout tests (docs/training.md): on a first attempt the
  // last rank dies (SIGKILL) or hangs (SIGSTOP) right after the given step, or as its
  // evaluation or save starts, as a crashed, preempted or wedged rank would.
  if (restart_count_ > 0 || rank() != world_size() - 1) return;
  if (joins_running_replicas()) return;
  struct Injection {
    InjectionPoint point;
    const char* variable;
    int signal;
  };
  static constexpr Injection kInjections[] = {
      {InjectionPoint::kAfterStep, "SHARDTRAIN_KILL_AFTER_STEP", SIGKILL},
      {InjectionPoint::kAfterStep, "SHARDTRAIN_STOP_AFTER_STEP", SIGSTOP},
      {InjectionPoint::kEvaluation, "SHARDTRAIN_KILL_IN_EVALUATION", SIGKILL},
      {InjectionPoint::kSave, "SHARDTRAIN_KILL_IN_SAVE", SIGKILL}};
  for (const auto& [at_point, variable, signal] : kInjections) {
    if (at_point != point) continue;
    const char* at = std::getenv(variable);
    if (at && std::atoll(at) == step_) {
      std::fflush(stdout);
      std::raise(signal);
    }
  }
}

bool Trainer::joins_running_replicas() const { return replicas_ && replicas_->restarted(); }

bool Trainer::replicas_missing(bool talk) const {
  if (!replicas_ || replicas_->replicas_now() == replicas_->replicas()) return false;
  if (talk) {
    std::fprintf(stderr,
                 "shardtrain: no checkpoint at step %lld: %d of %d replicas train now (a "
                 "checkpoint is written by every replica's ranks)\n",
                 static_cast<long long>(step_), replicas_->replicas_now(), replicas_->replicas());
  }
  return true;
}

void Trainer::make_adam_state() {
  auto& state = optimizer_->state();
  for (const auto& t : parallel_->optimized()) {
    const auto key = detail::optimizer_state_key(t.tensor);
    if (state.count(key)) continue;
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(at::zeros_like(t.tensor, at::MemoryFormat::Contiguous));
    fresh->exp_avg_sq(at::zeros_like(t.tensor, at::MemoryFormat::Contiguous));
    state[key] = std::move(fresh);
  }
}

void Trainer::take_state_from(int source) {
  detail::TraceSpan span("replica healing", "checkpoint");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> tensors;
  std::vector<at::Tensor> adam_steps;
  make_adam_state();  // what a replica that has not stepped lacks, overwritten below
  auto& state = optimizer_->state();
  for (const auto& t : parallel_->optimized()) {
    auto& adam =
        static_cast<torch::optim::AdamWParamState&>(*state[detail::optimizer_state_key(t.tensor)]);
    tensors.insert(tensors.end(), {t.tensor, adam.exp_avg(), adam.exp_avg_sq()});
    adam_steps.push_back(at::scalar_tensor(adam.step(), at::kLong));
  }
  for (const auto& buffer : model_->buffers()) tensors.push_back(buffer);
  at::Tensor steps = at::stack(adam_steps);
  at::Tensor training = at::tensor(
      {static_cast<double>(step_), static_cast<double>(samples_), scaler_.scale(),
       static_cast<double>(scaler_.good_steps()), static_cast<double>(scaler_.skipped_steps()),
       static_cast<double>(scaler_.hysteresis_left())},
      at::kDouble);
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  at::Tensor rng = generator.get_state();
  tensors.insert(tensors.end(), {steps, training, rng});
  // Fault injection for tests: a restarted rank dies while it takes the state, once.
  const bool dies = replicas_->restart() == 1 && rank() != source &&
                    std::getenv("SHARDTRAIN_KILL_WHILE_JOINING") != nullptr;
  // Each rank takes its own part from the rank at its position in the source replica: over the
  // world under ddp (a replica is one rank), else over the replicate group, whose ranks are one
  // per replica in replica order.
  ProcessGroup* peers = world_.get();
  int root = source;
  if (replicas_->replica_size() > 1) {
    peers = &mesh_->group(MeshAxis::kDpReplicate);
    root = source / replicas_->replica_size();
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    peers->broadcast(tensors[i], root)->wait();
    if (dies && i == tensors.size() / 2) std::raise(SIGKILL);
  }
  int64_t k = 0;
  for (const auto& t : parallel_->optimized()) {
    auto& adam =
        static_cast<torch::optim::AdamWParamState&>(*state[detail::optimizer_state_key(t.tensor)]);
    adam.step(steps[k++].item<int64_t>());
  }
  const auto value = [&](int i) { return training[i].item<double>(); };
  step_ = static_cast<int64_t>(value(0));
  samples_ = static_cast<int64_t>(value(1));
  scaler_.restore(value(2), static_cast<int64_t>(value(3)), static_cast<int64_t>(value(4)),
                  static_cast<int64_t>(value(5)));
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(rng);
}

void Trainer::fit() {
  detail::TelemetryScope telemetry(telemetry_);
  const bool talk = rank() == 0;
  if (joins_running_replicas()) {
    // A restarted replica waits to be taken in at a step boundary; its first step takes the
    // state of a healthy replica. The memory that state goes into is made (and its pages
    // faulted in) before, while the others train on.
    make_adam_state();
    const int64_t first = replicas_->join();
    if (first > config_.train.steps) {
      std::printf("rank %d: the replicas finished training before this one was taken in\n", rank());
      return;
    }
    std::printf("rank %d: taken in by the running replicas at step %lld\n", rank(),
                static_cast<long long>(first));
    std::fflush(stdout);
  }
  if (talk) print_start();
  while (step_ < config_.train.steps) {
    const StepResult result = train_step();
    if (steps_this_process_ == 1) prepare_checkpoint_staging();
    double eval_loss = NAN;
    if (config_.train.eval_every > 0 &&
        (step_ % config_.train.eval_every == 0 || step_ == config_.train.steps)) {
      eval_loss = evaluate();
    }
    write_metrics(result, eval_loss);
    count_skipped(result);
    check_divergence();
    print_progress(result, eval_loss);
    // A model whose last step was skipped may have diverged: it never replaces `latest`.
    if (config_.train.checkpoint_every > 0 && step_ % config_.train.checkpoint_every == 0 &&
        step_ != config_.train.steps && skipped_in_a_row_ == 0 && !replicas_missing(talk)) {
      save_checkpoint_on_replicas();
    }
    // Recorded until the next step is one not traced: this step's evaluation and checkpoint too.
    if (!traces(step_ + 1)) write_trace();
    fail_if_injected();
  }
  if (skipped_in_a_row_ > 0) {
    // A model whose last steps were skipped may have diverged: the run has not trained what it
    // was asked to, and says so with a failure rather than a quiet end.
    throw std::runtime_error(
        "the run ended on " + std::to_string(skipped_in_a_row_) +
        " step(s) with non-finite gradients (steps " +
        std::to_string(step_ - skipped_in_a_row_ + 1) + " to " + std::to_string(step_) +
        "): no final checkpoint was written" +
        (last_good_step_ > 0
             ? ", the last finite loss was at step " + std::to_string(last_good_step_)
             : std::string()) +
        "; resume from the latest checkpoint with a lower train.lr or a higher train.clip");
  }
  if (config_.train.final_checkpoint && !replicas_missing(talk)) {
    std::string dir = save_checkpoint_on_replicas();
    if (config_.run.checkpoint_async) dir = wait_for_checkpoint();
    if (talk && !dir.empty()) std::printf("checkpoint: %s\n", dir.c_str());
  }
  wait_for_checkpoint();  // the last save is on disk before the run ends
  // Where every rank takes part in the forward passes, every rank generates. A masked-language
  // model does not continue text: no sample.
  if ((talk || parallel_->forward_is_collective()) && config_.train.sample_tokens > 0 &&
      !config_.model.bidirectional()) {
    const std::string sample = generate(config_.train.sample_prompt, config_.train.sample_tokens);
    if (talk) std::printf("sample: %s\n", sample.c_str());
  }
  std::fflush(stdout);
}

}  // namespace shardtrain
