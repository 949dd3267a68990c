// The trainer: config -> tokenizer and data -> model -> optimizer -> loop, with metrics,
// evaluation, checkpoints and resume.
#pragma once

#include <torch/optim/adamw.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "shardtrain/chat_template.h"
#include "shardtrain/config.h"
#include "shardtrain/data.h"
#include "shardtrain/ddp.h"
#include "shardtrain/dist.h"
#include "shardtrain/fsdp.h"
#include "shardtrain/fused_adamw.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/optim.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/tokenizer.h"
#include "shardtrain/zero.h"

namespace shardtrain {
class ParallelModel;
class ReplicaWorld;
namespace detail {
class Compression;
struct Fp8Scaling;
class RunDirLock;
class TraceSpan;
struct SwapIoTotals;
class Telemetry;
struct TrainingData;
}  // namespace detail

// What one optimizer step measured.
struct StepResult {
  int64_t step = 0;  // 1-based number of the step just taken
  double loss = 0;   // mean over every token of the global batch
  double lr = 0;
  double grad_norm = 0;  // before clipping
  bool skipped = false;  // the loss scaler found inf/nan gradients
  double step_time_s = 0;
  double tokens_per_s = 0;
  int64_t activations_peak = 0;  // resident-memory rise during forward+backward, bytes
  // State in files (ZeRO offload to nvme): bytes read and written during the step, and the
  // seconds spent in those transfers, summed over the threads doing them; of the step's time,
  // the seconds the training thread waited for them (the rest of the step overlapped them).
  int64_t file_read_bytes = 0, file_written_bytes = 0;
  double file_io_s = 0;
  double file_wait_s = 0;
  // This rank's collectives during the step: the seconds they ran (on their groups' threads),
  // the bytes of their tensors, and the seconds the training thread waited for them (the part
  // not hidden behind computation).
  double comm_s = 0;
  double comm_exposed_s = 0;
  int64_t comm_bytes = 0;
  // Of those, the tensor-parallel collectives inside forward and backward (run and waited for
  // on the training thread, so all exposed), and their bytes.
  double comm_tp_s = 0;
  int64_t comm_tp_bytes = 0;
  // A mixture-of-experts model: the load-balancing loss (the mean over layers and micro-batches
  // of the global batch; not part of `loss`), and the tokens each expert of each layer received
  // in the step, over the global batch: the least, the mean and the most. NaN otherwise.
  double aux_loss = NAN;
  double expert_tokens_min = NAN, expert_tokens_mean = NAN, expert_tokens_max = NAN;
  // Progressive layer dropping (train.layer_drop): the step's share kept (theta) and the blocks
  // it ran. NaN and -1 otherwise.
  double layer_drop_theta = NAN;
  int64_t blocks_run = -1;
  // Random layer-token dropping (train.random_ltd_layers): the tokens of a sequence that each
  // of its blocks ran on in the step (all of them where the sequence was no longer). -1 otherwise.
  int64_t random_ltd_tokens = -1;
};

class Trainer {
 public:
  // Builds everything from the config; with run.resume, restores the checkpoint. Nothing is
  // written under run.dir before the config, the tokenizer and the corpus inputs have been
  // checked, and a new run into a run.dir that already holds one (metrics or checkpoints) is
  // refused unless run.overwrite moves the old one aside or run.resume continues it. Under a
  // launcher's restart (`restart_count` > 0: RendezvousInfo::restart_count) an unset run.resume
  // means "auto".
  // Throws std::invalid_argument for bad input (files, sizes, the run directory), naming it.
  // With a `world` group of several ranks (parallel.strategy = "ddp", "fsdp" or "zero"), it is
  // collective: every rank constructs its Trainer and calls train_step/fit/evaluate/generate/
  // save_checkpoint in step; each takes its slice of every global batch; rank 0 alone prints,
  // and every rank writes its share of each checkpoint. FSDP and ZeRO without a world run on a
  // group of one rank. model.init_from (Hugging Face weights) is applied before training starts.
  explicit Trainer(TrainConfig config, std::shared_ptr<ProcessGroup> world = nullptr,
                   int restart_count = 0);
  // Writes the trace of traced steps not written yet (run.trace). Never throws: a trace that
  // cannot be written is reported on stderr.
  ~Trainer();
  Trainer(Trainer&&) = default;
  Trainer& operator=(Trainer&&) = default;

  // Trains until train.steps, printing one progress line per run.log_every steps, appending
  // RUN_DIR/metrics.jsonl, evaluating and checkpointing as configured, and saving a final
  // checkpoint. Prints a sample at the end when train.sample_tokens > 0. After
  // train.max_skipped consecutive steps with non-finite gradients it throws
  // std::runtime_error naming the step and the last finite loss; no checkpoint is written while
  // steps are being skipped, so `latest` stays the last good one. A run whose last steps were
  // skipped (fewer than max_skipped) throws std::runtime_error too, naming them, after writing
  // their metrics: it writes no final checkpoint.
  void fit();
  // One optimizer step over the global batch.
  StepResult train_step();
  // Mean loss over train.eval_batches held-out micro-batches.
  double evaluate();
  // Continues `prompt` by `tokens` sampled tokens (temperature, top-k; its own generator
  // seeded from train.seed, so training randomness is untouched). Under data.format "chat",
  // `prompt` is a user message: the chat template renders it with the assistant's turn opened,
  // generation stops at a special token (the end of the turn), and the rendered text with the
  // reply is returned.
  std::string generate(const std::string& prompt, int64_t tokens);
  // Writes RUN_DIR/checkpoints/step_NNNNNN atomically as a sharded checkpoint
  // (docs/checkpoints.md) and returns its directory. Collective: every rank calls it. With
  // run.checkpoint_async it first waits for the save in flight, then returns once this rank's
  // share is copied to host memory, while a thread writes it: the directory appears (and
  // `latest` names it) when wait_for_checkpoint() returns, or a later save or the destructor
  // waits.
  std::string save_checkpoint();
  // Waits for the asynchronous save in flight, if any, and rethrows its error (the first rank's
  // error on every rank). Collective when a save is in flight. Returns its directory, or ""
  // when none was in flight.
  std::string wait_for_checkpoint();
  // Restores a sharded checkpoint written at any world size. Collective. Throws
  // std::invalid_argument naming the file for a damaged checkpoint, or the first tensor whose
  // name, shape or dtype differs from the model's.
  void load_checkpoint(const std::string& dir);

  int64_t step() const { return step_; }
  int rank() const { return world_ ? world_->rank() : 0; }
  int world_size() const { return world_ ? world_->size() : 1; }
  // Ranks that see different data: tensor-parallel peers (parallel.tp neighbouring ranks) and
  // the stages of one pipeline see the same batch.
  int dp_size() const { return mesh_ ? mesh_->dp().size() : 1; }
  int dp_rank() const { return mesh_ ? mesh_->dp().rank() : 0; }
  // This rank's place on the pipeline (the mesh's outermost axis).
  int pp_rank() const { return mesh_ ? mesh_->coordinate(MeshAxis::kPp) : 0; }
  Transformer& model() { return model_; }
  const TrainConfig& config() const { return config_; }
  const LossScaler& loss_scaler() const { return scaler_; }
  const DataLoader& data() const { return *loader_; }
  // Called after backward and before unscaling, with the step about to be taken; tests use it
  // to inject an overflow.
  void set_after_backward(std::function<void(int64_t step)> hook) { after_backward_ = hook; }

 private:
  // The constructor's phases, in order. set_up_ranks: the settings checked and agreed across
  // ranks, the mesh built (the one source of data-parallel rank and size). set_up_tokenizer:
  // the tokenizer, the chat template and the vocabulary against the model. prepare_data: the
  // corpus tokenized or opened, the memory check, the run directory, the loader; returns the
  // checkpoint to resume from ("" for a new run). build_model: the model described, adapters
  // added, parallelize() applied. build_optimizer: AdamW over what this rank updates, the
  // schedule, the loss scaler.
  void set_up_ranks();
  void set_up_tokenizer();
  std::string prepare_data();
  void build_model();
  void build_optimizer();
  // train_step()'s parts, each asking parallel_ for what differs between strategies.
  // forward_backward: the step's micro-batches forward and backward; returns the step's loss
  // summed over the micro-batches, the same number on every rank. optimizer_step: AdamW at
  // `lr`. add_step_totals: the step's time, communication and file transfers into `result`.
  double forward_backward();
  void optimizer_step(double lr);
  // train.chunked_loss's tokens per chunk (0: about 32 MiB of logits), or none: the whole logits.
  std::optional<int64_t> loss_chunk() const;
  void add_step_totals(StepResult& result, std::chrono::steady_clock::time_point start,
                       std::chrono::steady_clock::time_point end,
                       const detail::SwapIoTotals& io_before);
  // A mixture-of-experts model: the step's load-balancing loss and tokens per expert over the
  // global batch into `result`. Collective.
  void add_routing(StepResult& result);
  void write_metrics(const StepResult& result, double eval_loss);
  void restore_training_state(const ShardedCheckpointReader& reader, const std::string& dir);
  // One token drawn from the logits of the last position (train.sample_*).
  int64_t sample_next(const at::Tensor& logits, at::Generator& generator);
  // Where fail_if_injected() is called.
  enum class InjectionPoint { kAfterStep, kEvaluation, kSave };
  // SHARDTRAIN_KILL_AFTER_STEP / SHARDTRAIN_STOP_AFTER_STEP: the last rank kills or stops
  // itself after that step; SHARDTRAIN_KILL_IN_EVALUATION / SHARDTRAIN_KILL_IN_SAVE: it kills
  // itself as that step's evaluation or checkpoint save starts (first attempt only).
  void fail_if_injected(InjectionPoint point = InjectionPoint::kAfterStep) const;
  // save_checkpoint(); under run.fault_tolerance = "replicas" a replica lost during the save
  // costs that checkpoint only ("" returned: `latest` stays the previous one), and the next
  // step runs without the lost replica.
  std::string save_checkpoint_on_replicas();
  // run.fault_tolerance = "replicas": every member takes the training state (parameters,
  // AdamW's state, buffers, step, data position, loss scale, random state) of rank `source`,
  // over the members' group, when a membership took in a restarted replica. Collective.
  void take_state_from(int source);
  // AdamW's state (zeros, step 0) for every tensor that has none yet.
  void make_adam_state();
  // train_step()'s body, taken again under replica fault tolerance when a replica failed in it:
  // forward and backward, the finite check and clipping. Returns whether the gradients are
  // finite.
  // `update_span` is opened at the finite check and left open for the optimizer's step.
  bool step_body(StepResult& result, std::optional<detail::TraceSpan>& update_span);
  // step_body() under replica fault tolerance: taken again until every member finished it,
  // after taking the state of a healthy replica when this step takes a restarted one in.
  bool step_on_replicas(StepResult& result, std::optional<detail::TraceSpan>& update_span);
  // Under replica fault tolerance, whether replicas are missing now (checkpoints then wait for
  // them: they are skipped, with a line on stderr when `talk`).
  bool replicas_missing(bool talk) const;
  // This rank's replica was restarted and joins the replicas that train (its run directory,
  // data and state are theirs).
  bool joins_running_replicas() const;
  // run.checkpoint_async: host buffers for this rank's share of a checkpoint, allocated and
  // faulted in behind the steps before the first save (collective: every rank calls it).
  void prepare_checkpoint_staging();
  // Throws when the token shard's vocabulary is larger than the model's.
  void check_vocabulary() const;
  // Rank 0: what the instruction samples made (masked tokens, rows, cut and dropped samples).
  void print_packing() const;
  // Waits for every rank (no-op on one process).
  void barrier() const;
  // run.trace: whether step `step` (1-based) is recorded.
  bool traces(int64_t step) const;
  // Starts or stops recording for step `step`; returns traces(step).
  bool trace_step(int64_t step);
  // Writes RUN_DIR/trace/rank_N.json with what was recorded, if anything is new.
  void write_trace();
  // The progress line printed every run.log_every steps (rank 0), and the bar on a terminal.
  void print_progress(const StepResult& result, double eval_loss);
  // Rank 0, before the first step: the model, the data and how the run is parallelized.
  void print_start() const;
  // Counts consecutive skipped steps and remembers the last finite loss; check_divergence()
  // throws after train.max_skipped of them in a row.
  void count_skipped(const StepResult& result);
  void check_divergence() const;

  TrainConfig config_;
  std::shared_ptr<ProcessGroup> world_;
  int restart_count_ = 0;  // which restart of the job this is (the launcher's count)
  // run.fault_tolerance = "replicas": the replicas training now, and world_ follows them.
  std::shared_ptr<ReplicaWorld> replicas_;
  std::unique_ptr<DeviceMesh> mesh_;
  at::Device device_{at::kCPU};  // run.device: the model's, the batches' and the state's
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ChatTemplate> chat_template_;  // null unless data.* or the tokenizer has one
  std::unique_ptr<detail::TrainingData> data_;
  std::unique_ptr<detail::RunDirLock> run_lock_;  // rank 0: run.dir is this run's while it lives
  std::unique_ptr<DataLoader> loader_;
  Transformer model_{nullptr};
  // The model as parallelize() made it: what the trainer drives for every strategy.
  std::unique_ptr<ParallelModel> parallel_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<detail::Compression> compression_;  // [compression]'s quantizers, or null
  // precision.fp8: each of the blocks' linear layers' scaling state, in order; empty: none.
  std::vector<std::shared_ptr<detail::Fp8Scaling>> fp8_layers_;
  LrSchedule schedule_;
  LossScaler scaler_;
  int64_t step_ = 0;
  int64_t samples_ = 0;  // sequences consumed, the data position
  int64_t peak_rss_ = 0;
  int64_t resident_at_start_ = 0;  // before the model existed: LibTorch, the groups, the data
  int64_t skipped_in_a_row_ = 0;   // consecutive skipped steps, for train.max_skipped
  double last_finite_loss_ = NAN;
  int64_t last_good_step_ = 0;
  std::function<void(int64_t)> after_backward_;
  // run.checkpoint_async: the group the writing thread's collectives run on (every rank, apart
  // from the training's groups), and the save in flight.
  std::shared_ptr<ProcessGroup> checkpoint_group_;
  std::future<std::string> checkpoint_in_flight_;
  std::shared_ptr<CheckpointStaging> checkpoint_staging_;  // the copies' buffers, reused
  std::shared_ptr<detail::Telemetry> telemetry_;  // this rank's communication times and trace
  bool trace_unwritten_ = false;
  // For the ETA: when this process's first step began, and how many steps it has taken.
  std::chrono::steady_clock::time_point first_step_at_;
  int64_t steps_this_process_ = 0;
  bool progress_bar_ = false;  // rank 0 on a terminal
};

// train.autotune: `config` with the micro-batch that trained fastest (tokens per second, the
// median over the timed steps) among those train.autotune_* lets it try, each trained for a few
// steps by a Trainer of its own on `world` (null: one process) in RUN_DIR.autotune, which is
// removed after. Rank 0 prints one line per micro-batch tried; every rank takes rank 0's
// measurements, so all choose the same. Throws std::invalid_argument when not even the smallest
// one can run (its own error).
TrainConfig autotune_micro_batch(const TrainConfig& config,
                                 const std::shared_ptr<ProcessGroup>& world);

// For a restarted job that tuned its micro-batch when it started: `config` with the micro-batch
// RUN_DIR/run.json records; nullopt when the run directory has no run.json yet (the first start
// ended before its run began). Throws std::invalid_argument for a run.json without one.
std::optional<TrainConfig> micro_batch_of_run(const TrainConfig& config);

}  // namespace shardtrain
