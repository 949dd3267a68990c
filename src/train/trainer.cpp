#include <unistd.h>

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

#include "model/autocast.h"
#include "model/layers.h"
#include "model/names.h"
#include "optim/swap_file.h"
#include "parallel/parallelize.h"
#include "parallel/pipeline/pipeline_runner.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/fused_adamw.h"
#include "shardtrain/generate.h"
#include "shardtrain/hf.h"
#include "shardtrain/lora.h"
#include "shardtrain/memory.h"
#include "shardtrain/tensor_parallel.h"
#include "shardtrain/threads.h"
#include "shardtrain/train.h"
#include "trace/telemetry.h"
#include "train/memory_check.h"
#include "train/rank_agreement.h"
#include "train/run_data.h"
#include "train/run_dir.h"
#include "train/run_manifest.h"
#include "train/run_setup.h"

namespace shardtrain {

at::Tensor detail::logits_loss(Transformer& model, const at::Tensor& logits, const Batch& batch) {
  const at::Tensor flat = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
  const at::Tensor targets = batch.targets.reshape({-1});
  // Split over the vocabulary: the loss is reduced across the group, never gathered.
  if (const auto& tp = model->tensor_parallel()) {
    return vocab_parallel_cross_entropy(flat, targets, *tp->group, batch.loss_divisor);
  }
  if (batch.loss_divisor <= 0) return at::cross_entropy_loss(flat, targets);
  // A sum over the tokens that carry a loss, divided by the global batch's share: every micro-
  // batch then weighs by its loss tokens, and the step's loss is the mean over all of them.
  return at::cross_entropy_loss(flat, targets, /*weight=*/{}, at::Reduction::Sum, kIgnoreIndex) /
         batch.loss_divisor;
}

namespace {

at::Tensor token_loss(Transformer& model, const Batch& batch) {
  return detail::logits_loss(model, model->forward(batch.inputs, batch.layout), batch);
}

}  // namespace

Trainer::Trainer(TrainConfig config, std::shared_ptr<ProcessGroup> world)
    : config_(std::move(config)), world_(std::move(world)) {
  set_up_ranks();
  set_up_tokenizer();
  const std::string resume_from = prepare_data();
  build_model();
  build_optimizer();
  if (!resume_from.empty()) load_checkpoint(resume_from);
  // Written last, so a run that fails to start leaves the previous run.json as it was.
  if (rank() == 0) detail::write_run_manifest(config_, world_size(), resident_at_start_);
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
  if (shape.degree(MeshAxis::kDpReplicate) * shape.degree(MeshAxis::kDpShard) > 1 &&
      config_.strategy == "none") {
    throw std::invalid_argument(
        "parallel.strategy = \"none\" trains on one process" +
        std::string(config_.tp > 1 ? " (or one tensor-parallel group)" : "") +
        ", but the world has " + std::to_string(world_size()) +
        " ranks; set parallel.strategy = \"ddp\" or \"fsdp\"");
  }
  if (!world_ && (config_.strategy == "fsdp" || config_.strategy == "zero")) {
    // FSDP's sharding, policy and accounting on one rank, so a single process can run it too.
    world_ = init_process_group(c10::make_intrusive<c10d::HashStore>(), 0, 1);
  }
  if (world_) mesh_ = std::make_unique<DeviceMesh>(world_, shape);
  if (config_.autocast == "fp16") {
    // LibTorch's CPU autocast has no fp16 kernels; fp16 needs the CUDA path.
    throw std::invalid_argument(
        "precision.autocast = \"fp16\" needs a CUDA device; on CPU use \"bf16\" (loss scaling "
        "via precision.loss_scale works with either)");
  }
  if (config_.threads > 0) set_num_threads(static_cast<int>(config_.threads));
  install_cpu_memory_tracking();
  telemetry_ = std::make_shared<detail::Telemetry>(rank());
  progress_bar_ = rank() == 0 && isatty(STDOUT_FILENO);
}

void Trainer::set_up_tokenizer() {
  // Inputs first: nothing under run.dir changes until the config, the tokenizer and the
  // corpus have been checked and every rank has decided how the run starts.
  tokenizer_ = detail::make_tokenizer(config_);
  chat_template_ = detail::make_chat_template(config_);
  if (!config_.vocab_size_set) {
    config_.model.vocab_size = tokenizer_->vocab_size();
  } else if (config_.model.vocab_size < tokenizer_->vocab_size()) {
    throw std::invalid_argument("model.vocab_size " + std::to_string(config_.model.vocab_size) +
                                " is smaller than the " + tokenizer_->name() +
                                " tokenizer's vocabulary of " +
                                std::to_string(tokenizer_->vocab_size()));
  }
  if (config_.tp > 1 && config_.model.vocab_size % config_.tp != 0) {
    const int64_t tp = config_.tp, vocab = config_.model.vocab_size;
    const int64_t multiple = std::lcm<int64_t>(tp, 64);
    throw std::invalid_argument(
        "tensor parallelism splits the vocabulary: " +
        std::string(config_.vocab_size_set ? "model.vocab_size"
                                           : tokenizer_->name() + " tokenizer's vocabulary") +
        " (" + std::to_string(vocab) + ") is not divisible by parallel.tp=" + std::to_string(tp) +
        "; set model.vocab_size to a multiple of " + std::to_string(tp) + " that holds it, e.g. " +
        std::to_string((vocab + multiple - 1) / multiple * multiple) +
        " (a multiple of 64 too, so that its checkpoints resume at any tp dividing 64)");
  }
  // Heads, key/value heads and the FFN width too, before the run directory is touched.
  if (config_.tp > 1) transformer_tp_plan(config_.model, static_cast<int>(config_.tp));
}

std::string Trainer::prepare_data() {
  // Nothing yet when the corpus is to be tokenized.
  data_ = std::make_unique<detail::TrainingData>(detail::open_prepared_data(config_));
  if (data_->defined()) check_vocabulary();
  const detail::RunStart start = detail::plan_run_start(config_, detail::restarted_by_launcher());
  // Rank 0 tokenizes before anything under run.dir changes: bad data stops every rank there.
  detail::TokenizedData tokenized;
  std::string bad_data;
  if (!data_->defined() && rank() == 0) {
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
  if (config_.memory_check) {
    detail::check_memory_fits(config_, world_size(), detail::rank_memory_budget(world_.get()),
                              resident_at_start_);
  }
  barrier();  // every rank has looked before rank 0 changes the directory
  if (rank() == 0) detail::prepare_run_dir(config_, start);
  barrier();
  std::filesystem::create_directories(config_.dir);  // ranks on other hosts' file systems
  // Checkpoints are written by every rank into one directory: it must be the same storage.
  if (world_) detail::check_shared_run_dir(config_, *world_);
  if (!data_->defined()) {
    // Rank 0 writes the tokenized data into RUN_DIR once, before the others open the shard.
    if (rank() == 0) {
      *data_ = detail::store_data(config_, tokenized, tokenizer_->vocab_size());
      tokenized = detail::TokenizedData();
    }
    barrier();
    if (rank() != 0) *data_ = detail::open_data(config_);
  }
  check_vocabulary();
  loader_ = detail::make_loader(config_, *data_, tokenizer_->eos_id(), dp_rank(), dp_size());
  return start.checkpoint;
}

void Trainer::build_model() {
  {
    // The seed fixes the initial weights (ModelInit); dropout draws from LibTorch's global
    // generator, which ranks that are threads of one process share: seeded one at a time.
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(static_cast<uint64_t>(config_.seed));
    // Described only: parallelize() allocates and initializes what this rank holds (with
    // model.init_from, reading just those bytes of the Hugging Face files).
    ModelInit init = ModelInit().seed(static_cast<uint64_t>(config_.seed)).deferred();
    if (!config_.init_from.empty()) init.values(hf_initializer(config_.model, config_.init_from));
    // A pipeline rank builds its stages only.
    if (config_.pp > 1) init.parts(pipeline_parts(config_, pp_rank()));
    model_ = Transformer(config_.model, std::move(init));
    // Fine-tuning with adapters: the base is frozen before any strategy sees the model, so
    // that only the adapters are in the optimizer, the gradient reductions and checkpoints.
    if (config_.lora_rank > 0) {
      add_lora(*model_, detail::lora_options(config_));
      // The frozen base's linear weights in lora.base_dtype: stored, gathered and sent so.
      if (config_.lora_base_dtype != "fp32") {
        detail::store_frozen_linears(*model_, config_.lora_base_dtype);
      }
    }
  }
  const bool prompt = detail::return_memory_promptly(config_);
  {
    Parallelized parallel = parallelize(model_, config_, world_, mesh_.get());
    ddp_ = std::move(parallel.ddp);
    fsdp_ = std::move(parallel.sharded);
    pipeline_ = std::move(parallel.pipeline);
  }
  if (prompt) detail::trim_heap();  // what initialization used and freed
}

void Trainer::build_optimizer() {
  // Weight decay on matrices only: biases, norms and 1-D tensors are not decayed (as GPT-2
  // and Llama training do). Under FSDP the optimizer holds this rank's pieces of them.
  std::vector<at::Tensor> decay, no_decay;
  if (fsdp_) {
    for (const auto& s : fsdp_->segments()) {
      (s.shape.size() >= 2 ? decay : no_decay).push_back(s.param);
    }
  } else {
    for (const auto& p : parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  auto options = torch::optim::AdamWOptions(config_.lr)
                     .betas({config_.beta1, config_.beta2})
                     .eps(config_.eps)
                     .weight_decay(config_.weight_decay);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(options).weight_decay(0.0)));
  // The fused kernel gives LibTorch's AdamW results bit for bit, in one pass over memory.
  optimizer_ = std::make_unique<FusedAdamW>(std::move(groups), options);
  if (config_.strategy == "zero" && config_.zero_offload_optimizer == "nvme") {
    // The moments of each unit's shard live in files; optimizer_ then holds no state.
    for (const auto& [master, grad] : fsdp_->flat_shards()) {
      nvme_.push_back(std::make_unique<NvmeAdamW>(master.numel(),
                                                  NvmeAdamWOptions().dir(config_.zero_nvme_path)));
    }
  }
  schedule_ =
      LrSchedule{config_.lr, config_.min_lr, config_.warmup, config_.steps, config_.schedule};
  scaler_ = LossScaler::from_config(config_.loss_scale, config_.initial_scale, config_.scale_window,
                                    config_.min_scale);
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

std::vector<at::Tensor> Trainer::parameters() const {
  std::vector<at::Tensor> pieces;
  if (!fsdp_) {
    for (const auto& p : model_->parameters()) {
      if (p.requires_grad()) pieces.push_back(p);  // not a LoRA run's frozen base
    }
    return pieces;
  }
  for (const auto& s : fsdp_->segments()) pieces.push_back(s.param);
  return pieces;
}

void Trainer::barrier() const {
  if (world_size() > 1) world_->barrier()->wait();
}

Trainer::~Trainer() {
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
  if (fsdp_) {
    fsdp_->zero_grad();  // the optimizer's gradients are views into the shards
    fsdp_->reset_peak();
  } else {
    optimizer_->zero_grad();
  }
  // Everything above the bytes held now (parameters, optimizer state) that forward and
  // backward add at their peak: activations, gradients and temporaries.
  const int64_t before = cpu_memory_stats().live_bytes;
  reset_peak_cpu_memory();
  const double loss_sum = forward_backward();
  StepResult result;
  result.step = step_ + 1;
  result.loss = loss_sum / static_cast<double>(config_.grad_accum);
  result.activations_peak = cpu_memory_stats().peak_bytes - before;
  if (after_backward_) after_backward_(step_);

  std::optional<detail::TraceSpan> update_span(std::in_place, "optimizer", "optimizer");
  const bool finite = gradients_finite();
  result.lr = schedule_.at(step_);
  result.grad_norm = NAN;  // none when the gradients are not finite (null in metrics.jsonl)
  if (finite) result.grad_norm = clip_gradients();
  result.skipped = !scaler_.update(finite);
  if (!result.skipped) optimizer_step(result.lr);
  update_span.reset();
  // A skipped step still consumes its data and advances the schedule, as AMP and DeepSpeed do.
  ++step_;
  samples_ += loader_->global_batch_size();
  const auto end = std::chrono::steady_clock::now();
  result.step_time_s = std::chrono::duration<double>(end - start).count();
  add_step_totals(result, start, end, io_before);
  result.tokens_per_s =
      static_cast<double>(loader_->global_batch_size() * config_.seq_len) / result.step_time_s;
  peak_rss_ = std::max(peak_rss_, detail::peak_resident_bytes());
  return result;
}

double Trainer::forward_backward() {
  double loss_sum = 0.0;
  for (int a = 0; a < config_.grad_accum && !pipeline_; ++a) {
    const Batch batch = loader_->micro_batch(samples_, a);
    at::Tensor loss;
    {
      detail::TraceSpan span("forward", "forward", {{"micro_batch", a}});
      detail::AutocastScope autocast(detail::cpu_bf16_autocast(config_.autocast == "bf16"));
      loss = token_loss(model_, batch);
    }
    detail::TraceSpan backward_span("backward", "backward", {{"micro_batch", a}});
    // Every micro-batch has the same number of tokens (or, for instruction data, its loss is
    // its sum over the global batch's mean share of loss tokens: Batch::loss_divisor), so the
    // mean over the global batch is the mean of the micro-batch losses: each contributes
    // 1/grad_accum of the gradient (and DDP averages over the ranks). Only the last
    // micro-batch's backward communicates.
    const at::Tensor scaled = loss * (scaler_.scale() / static_cast<double>(config_.grad_accum));
    if (ddp_ && a + 1 < config_.grad_accum) {
      auto local_only = ddp_->no_sync();
      scaled.backward();
    } else {
      scaled.backward();
    }
    loss_sum += loss.item<double>();
  }
  if (pipeline_) loss_sum = pipeline_step();
  if (world_size() > 1) {
    // The reported loss is the global batch's, the same number on every rank. A pipeline's
    // losses are on its last stage: the mean over the world is 1/pp of theirs.
    at::Tensor mean = at::tensor(loss_sum, at::kDouble);
    world_->all_reduce(mean, ReduceOp::kAvg)->wait();
    loss_sum = mean.item<double>() * static_cast<double>(config_.pp);
  }
  return loss_sum;
}

bool Trainer::gradients_finite() {
  bool finite = true;
  if (fsdp_) {
    if (scaler_.enabled()) fsdp_->unscale(scaler_.scale());
    finite = fsdp_->grads_finite();  // over its data-parallel and tensor-parallel ranks
  } else {
    finite = scaler_.unscale(parameters());
  }
  if (const auto& tp = model_->tensor_parallel(); pipeline_ || (tp && !fsdp_)) {
    // Each rank checked its own slices or stages: all skip a step together or not at all.
    finite = !detail::on_any_rank(pipeline_ ? *world_ : *tp->group, !finite);
  }
  return finite;
}

double Trainer::clip_gradients() {
  ProcessGroup* pipeline = pipeline_ ? &mesh_->group(MeshAxis::kPp) : nullptr;
  std::set<std::string> tied_copy;  // a pipeline's last stage counts no tied embedding
  if (detail::is_tied_head_copy(*model_, "tok_emb.weight")) tied_copy.insert("tok_emb.weight");
  return fsdp_ ? fsdp_->clip_grad_norm(config_.clip, pipeline, tied_copy)
         : model_->tensor_parallel() || pipeline ? clip_grad_norm(model_, config_.clip, pipeline)
                                                 : clip_grad_norm(parameters(), config_.clip);
}

void Trainer::optimizer_step(double lr) {
  for (auto& group : optimizer_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  if (nvme_.empty()) {
    if (fsdp_) fsdp_->load_shards();  // parameter shards kept in files
    optimizer_->step();
  } else {
    nvme_step(lr);
  }
  if (fsdp_) fsdp_->after_optimizer_step();
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

double Trainer::evaluate() {
  detail::TelemetryScope telemetry(telemetry_);
  detail::TraceSpan span("eval", "eval");
  torch::NoGradGuard no_grad;
  model_->eval();
  const detail::GatheredStage gathered(pipeline_ ? fsdp_.get() : nullptr);
  double total = 0.0;
  for (int64_t i = 0; i < config_.eval_batches; ++i) {
    detail::AutocastScope autocast(detail::cpu_bf16_autocast(config_.autocast == "bf16"));
    const Batch batch = loader_->eval_batch(i);
    if (!pipeline_) {
      total += token_loss(model_, batch).item<double>();
    } else if (const at::Tensor logits = pipeline_->forward(batch.inputs, batch.layout);
               logits.defined()) {
      total += detail::logits_loss(model_, logits, batch).item<double>();
    }
  }
  model_->train();
  if (pipeline_ && world_size() > 1) {
    // On the last stage's ranks only (the same number on each).
    at::Tensor mean = at::tensor(total, at::kDouble);
    world_->all_reduce(mean, ReduceOp::kAvg)->wait();
    total = mean.item<double>() * static_cast<double>(config_.pp);
  }
  return total / static_cast<double>(config_.eval_batches);
}

std::string Trainer::generate(const std::string& prompt, int64_t tokens) {
  torch::NoGradGuard no_grad;
  model_->eval();
  const detail::GatheredStage gathered(pipeline_ ? fsdp_.get() : nullptr);
  // Trained on conversations, the model continues the template's text: the prompt is the
  // user's message, the assistant's turn is opened, and the reply ends with its special token.
  const bool chat = chat_template_ && config_.format == "chat";
  const std::string text =
      chat ? chat_template_->render({ChatMessage{"user", prompt}}, /*add_generation_prompt=*/true)
           : prompt;
  // Documents were trained on with what the tokenizer puts before them (Llama's BOS); a chat
  // template writes its own.
  std::vector<int32_t> ids = tokenizer_->encode(text, /*add_special=*/!chat);
  if (ids.empty()) ids.push_back(tokenizer_->eos_id());
  const size_t prompt_length = ids.size();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(config_.seed));
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t start =
        std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - config_.model.context_length);
    at::Tensor context =
        at::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), at::kLong).unsqueeze(0);
    // Under pipeline parallelism the last stage samples, and the other stages learn the token.
    const at::Tensor logits = pipeline_ ? pipeline_->forward(context) : model_->forward(context);
    at::Tensor next = at::zeros({1}, at::kLong);
    if (logits.defined()) next.fill_(sample_next(logits[0][-1], generator));
    if (pipeline_) {
      mesh_->group(MeshAxis::kPp).broadcast(next, pipeline_->last_stage_rank())->wait();
    }
    const auto id = static_cast<int32_t>(next.item<int64_t>());
    // Every rank drew (or was sent) the same id, so all stop together.
    if (chat && tokenizer_->is_special(id)) break;
    ids.push_back(id);
  }
  model_->train();
  std::vector<int32_t> generated(ids.begin() + static_cast<int64_t>(prompt_length), ids.end());
  return text + tokenizer_->decode(generated);
}

int64_t Trainer::sample_next(at::Tensor logits, at::Generator& generator) {
  logits = logits.to(at::kFloat);
  if (const auto& tp = model_->tensor_parallel()) logits = gather_vocabulary(logits, *tp->group);
  return sample_token(logits, tokenizer_->vocab_size(), config_.sample_temperature,
                      config_.sample_top_k, generator);
}

void Trainer::fail_if_injected() const {
  // Fault injection for restart and timeout tests (docs/training.md): on a first attempt the
  // last rank dies (SIGKILL) or hangs (SIGSTOP) right after the given step, as a crashed,
  // preempted or wedged rank would.
  if (detail::restarted_by_launcher() || rank() != world_size() - 1) return;
  for (const auto& [variable, signal] :
       {std::pair<const char*, int>{"SHARDTRAIN_KILL_AFTER_STEP", SIGKILL},
        {"SHARDTRAIN_STOP_AFTER_STEP", SIGSTOP}}) {
    const char* at = std::getenv(variable);
    if (at && std::atoll(at) == step_) {
      std::fflush(stdout);
      std::raise(signal);
    }
  }
}

void Trainer::fit() {
  detail::TelemetryScope telemetry(telemetry_);
  const bool talk = rank() == 0;
  if (talk) print_start();
  while (step_ < config_.steps) {
    const StepResult result = train_step();
    double eval_loss = NAN;
    if (config_.eval_every > 0 && (step_ % config_.eval_every == 0 || step_ == config_.steps)) {
      eval_loss = evaluate();
    }
    write_metrics(result, eval_loss);
    count_skipped(result);
    check_divergence();
    print_progress(result, eval_loss);
    // A model whose last step was skipped may have diverged: it never replaces `latest`.
    if (config_.checkpoint_every > 0 && step_ % config_.checkpoint_every == 0 &&
        step_ != config_.steps && skipped_in_a_row_ == 0) {
      save_checkpoint();
    }
    // Recorded until the next step is one not traced: this step's evaluation and checkpoint too.
    if (!traces(step_ + 1)) write_trace();
    fail_if_injected();
  }
  if (skipped_in_a_row_ > 0) {
    if (talk) {
      std::printf("no final checkpoint: the last %lld step(s) had non-finite gradients\n",
                  static_cast<long long>(skipped_in_a_row_));
    }
    return;
  }
  if (config_.final_checkpoint) {
    const std::string dir = save_checkpoint();
    if (talk) std::printf("checkpoint: %s\n", dir.c_str());
  }
  // Under FSDP and tensor parallelism every rank takes part in the forward passes.
  if ((talk || fsdp_ || config_.tp > 1 || pipeline_) && config_.sample_tokens > 0) {
    const std::string sample = generate(config_.sample_prompt, config_.sample_tokens);
    if (talk) std::printf("sample: %s\n", sample.c_str());
  }
  std::fflush(stdout);
}

}  // namespace shardtrain
