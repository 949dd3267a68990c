// Fully sharded data parallelism: each rank keeps 1/N of every unit's parameters, gradients and
// optimizer state, and gathers a unit's full parameters only while it computes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "shardtrain/dist.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/parallel_names.h"

namespace shardtrain {

// Which submodules become units. kBlocks: every transformer block (the model's hook points);
// kSize: consecutive blocks grouped until each unit holds at least min_params parameters (a
// last group below it joins the one before); kClassName: blocks whose class is one of
// `class_names` ("Block", "GPT2Block", "BertLayer", "LlamaDecoderLayer", ...). The parameters
// outside every unit form the root unit. A policy that makes no unit is an error.
struct WrapPolicy {
  enum class Kind { kBlocks, kSize, kClassName };
  static WrapPolicy blocks() { return {}; }
  static WrapPolicy size(int64_t min_params) {
    WrapPolicy p;
    p.kind = Kind::kSize;
    p.min_params = min_params;
    return p;
  }
  static WrapPolicy class_name(std::vector<std::string> names) {
    WrapPolicy p;
    p.kind = Kind::kClassName;
    p.class_names = std::move(names);
    return p;
  }
  Kind kind = Kind::kBlocks;
  int64_t min_params = 100000000;
  std::vector<std::string> class_names;
};

// Dtypes of the gathered parameters the model computes with, of gradient reduction, and of
// buffers. The optimizer always updates an fp32 master shard.
struct MixedPrecision {
  MixedPrecision& param_dtype(at::ScalarType value) {
    param_dtype_ = value;
    return *this;
  }
  MixedPrecision& reduce_dtype(at::ScalarType value) {
    reduce_dtype_ = value;
    return *this;
  }
  MixedPrecision& buffer_dtype(at::ScalarType value) {
    buffer_dtype_ = value;
    return *this;
  }
  at::ScalarType param_dtype_ = at::kFloat;
  at::ScalarType reduce_dtype_ = at::kFloat;
  at::ScalarType buffer_dtype_ = at::kFloat;
};

// DeepSpeed ZeRO's behaviour on the same flat-parameter machinery; zero_shard (zero.h) sets
// it, stage 0 is FSDP. Sizes in elements; 0 means unbounded.
struct ZeroBehaviour {
  int stage = 0;
  bool overlap_comm = true;           // false: wait for each gradient reduction at once
  int64_t reduce_bucket_size = 0;     // gradient elements being reduced at once
  int64_t allgather_bucket_size = 0;  // parameter elements being gathered after a step
  int64_t prefetch_bucket_size = 0;   // stage 3: elements prefetched ahead of the current unit
  int64_t persistence_threshold = 0;  // stage 3: units smaller than this stay gathered
  int64_t max_live_parameters = 0;    // stage 3: most elements gathered at once

  // What each stage means for the flat-parameter machinery (src/parallel/zero/).
  // The sharding: ZeRO-1/2 shard over every data-parallel rank and keep the parameters
  // gathered (shard_grad_op), ZeRO-3 is full_shard; stage 0 keeps FSDP's `fsdp`. Throws
  // std::invalid_argument for a stage outside 0 to 3.
  ShardingStrategy sharding(ShardingStrategy fsdp) const;
  // Whether a unit of `numel` elements stays gathered between steps: always at stages 1 and 2,
  // below persistence_threshold at stage 3.
  bool keeps_gathered(int64_t numel) const;
  // Stage 1: every rank keeps the whole gradient (an all-reduce), its shard a slice of it.
  bool whole_gradients() const { return stage == 1; }
  // Stages 1 and 2: the fp32 master is this rank's slice of the whole parameters it keeps.
  bool master_in_whole_parameters() const { return stage == 1 || stage == 2; }
  // Stage 3: prefetching bounded by prefetch_bucket_size and max_live_parameters elements
  // instead of FSDP's count of units.
  bool prefetch_by_elements() const { return stage == 3; }
  // Throws std::invalid_argument when a ZeRO stage meets a model with frozen parameters, or
  // gradients in files meet stage 1 (it keeps whole gradients).
  void check_frozen(bool any_frozen) const;
  void check_gradients_in_files() const;
};

struct FSDPOptions {
  FSDPOptions& sharding(ShardingStrategy value) {
    sharding_ = value;
    return *this;
  }
  FSDPOptions& wrap(WrapPolicy value) {
    wrap_ = std::move(value);
    return *this;
  }
  FSDPOptions& backward_prefetch(BackwardPrefetch value) {
    backward_prefetch_ = value;
    return *this;
  }
  // Gather the next unit while the current one computes its forward.
  FSDPOptions& forward_prefetch(bool value) {
    forward_prefetch_ = value;
    return *this;
  }
  // At most this many units (besides the root) gathered or being gathered at once: a prefetch
  // that would exceed it is not issued, so prefetching cannot grow memory beyond it. >= 1.
  // (kShardGradOp keeps every unit gathered through backward by design and ignores it.)
  FSDPOptions& limit_all_gathers(int value) {
    limit_all_gathers_ = value;
    return *this;
  }
  FSDPOptions& mixed_precision(MixedPrecision value) {
    mixed_precision_ = value;
    return *this;
  }
  // Keeps the parameter and gradient shards and the optimizer state in host memory and steps
  // there. On a CPU-only machine the shards already live in host memory, so this changes
  // placement only for CUDA modules.
  FSDPOptions& cpu_offload(bool value) {
    cpu_offload_ = value;
    return *this;
  }
  // ZeRO-Infinity's parameter offload to NVMe: between uses, this rank's fp32 master shards live
  // in files under this directory (an existing one) instead of memory. A unit's shard is read
  // for its gather and dropped when the gather completes; the optimizer step and checkpoints
  // bracket their access with load_shards() / store_shards(). Needs kFullShard. Empty: off.
  FSDPOptions& param_swap_dir(std::string value) {
    param_swap_dir_ = std::move(value);
    return *this;
  }
  // ZeRO-Infinity's gradient offload: between backward and the optimizer step, this rank's
  // fp32 gradient shards live in files under this directory instead of memory. Each reduction
  // reads the unit's shard, adds, and writes it back (a zeroed shard is not read); its sum of
  // squares and finiteness are kept from the write, so clip_grad_norm() and grads_finite() read
  // nothing, and clipping's factor is applied when a shard is next read. load_shards() brings
  // the gradient shards too; store_shards() then drops them unwritten (the step consumed them).
  // Not with ZeRO-1, which keeps whole gradients. Empty: off.
  FSDPOptions& grad_swap_dir(std::string value) {
    grad_swap_dir_ = std::move(value);
    return *this;
  }
  // Make every rank start from rank 0's parameters and buffers (a broadcast at construction).
  FSDPOptions& sync_module_states(bool value) {
    sync_module_states_ = value;
    return *this;
  }

  FSDPOptions& zero(ZeroBehaviour value) {
    zero_ = value;
    return *this;
  }

  ShardingStrategy sharding_ = ShardingStrategy::kFullShard;
  ZeroBehaviour zero_;
  WrapPolicy wrap_ = WrapPolicy::blocks();
  BackwardPrefetch backward_prefetch_ = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch_ = false;
  int limit_all_gathers_ = 2;
  MixedPrecision mixed_precision_;
  bool cpu_offload_ = false;
  std::string param_swap_dir_;
  std::string grad_swap_dir_;
  bool sync_module_states_ = true;
};

// One contiguous piece of this rank's shard: elements [offset, offset + numel) of the
// row-major flattening of parameter `name`. `param` is a leaf view into the fp32 master shard
// and its .grad() a view into the gradient shard: give these to the optimizer.
struct ShardSegment {
  std::string name;
  std::vector<int64_t> shape;  // the full parameter's
  int64_t offset = 0;
  at::Tensor param;
  int unit = 0;              // which flat parameter
  int64_t shard_offset = 0;  // where the piece starts in this rank's shard of it
  // False when a rank of another replica holds the same piece (hybrid_shard, no_shard): one
  // replica writes it to checkpoints.
  bool unique = true;
};

// Bytes this rank holds, for the progress line and metrics.
struct FSDPMemory {
  int64_t param_shards = 0;          // fp32 master shards (+ their param_dtype copies)
  int64_t grad_shards = 0;           // fp32 gradient shards
  int64_t gathered = 0;              // full parameters gathered right now
  int64_t gathered_peak = 0;         // most gathered at once since reset_peak()
  int64_t largest_unit = 0;          // bytes of the largest gathered non-root unit
  int64_t root_unit = 0;             // bytes of the gathered root unit
  int64_t resident_full = 0;         // whole parameters kept gathered between steps (ZeRO-1/2)
  int64_t param_shards_on_file = 0;  // master shards kept in files (param_swap_dir)
  int64_t grad_shards_on_file = 0;   // gradient shards kept in files (grad_swap_dir)
};

namespace detail {
class IoThread;
class GradAccumulatedHook;
}  // namespace detail

class FullyShardedDataParallel {
 public:
  // Collective over the mesh's data-parallel ranks (dp_replicate x dp_shard; kFullShard and
  // kShardGradOp need dp_replicate = 1, kNoShard dp_shard = 1, kHybridShard both > 1). Builds
  // one flat parameter per unit, keeps this rank's shard as fp32 master, and installs forward
  // hooks on the model and gradient hooks on its parameters. Under expert parallelism
  // (mesh.ep_size() > 1, the model holding this rank's experts) each block's experts are a unit
  // of their own, gathered and released with the block's, sharded and reduced over the expert
  // mesh (DeviceMesh::expert_mesh). The model is shared: call its
  // forward as usual; afterwards its parameters are views into gathered buffers that exist only
  // while a unit computes. Throws std::invalid_argument for a mesh that does not fit the
  // strategy or a wrap policy that matches nothing.
  FullyShardedDataParallel(Transformer model, const DeviceMesh& mesh, FSDPOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // The optimizer's parameters: this rank's pieces of every parameter.
  const std::vector<ShardSegment>& segments() const { return segments_; }
  // Zeroes the gradient shards (before the first micro-batch of a step). Backward passes add
  // into them: after each backward returns, every rank holds its shard of the gradient averaged
  // over the data-parallel ranks, summed over the backward passes since zero_grad.
  void zero_grad();
  // Global L2 norm of the gradient (fp64, across the shards); with max_norm > 0 scales the
  // shards so it is at most max_norm. Collective. Under pipeline parallelism `stages` is the
  // pipeline's group, across which the stages' norms add, and `counted_elsewhere` names the
  // parameters another stage also holds and counts (a tied embedding's copy): zero here.
  double clip_grad_norm(double max_norm, ProcessGroup* stages = nullptr,
                        const std::set<std::string>& counted_elsewhere = {});
  // Under pipeline parallelism a rank runs its stage's forwards and backwards for several
  // micro-batches, interleaved, and not through the model's own forward. From begin_pipeline()
  // to end_pipeline() the hooks stand aside: every unit is gathered at the start and stays
  // gathered, and each backward adds whole gradients into the parameters' .grad, unreduced.
  // end_pipeline() then reduces them as the end of one backward would (every rank holds its
  // shard of the average, added to what zero_grad() left) and frees what does not stay
  // gathered; with `gradients` false (evaluation, or a step that failed) it only frees.
  // Every data-parallel rank calls both, in the same order; begin_pipeline() gathers, so it is
  // collective too.
  void begin_pipeline();
  void end_pipeline(bool gradients = true);
  // After a forward or backward that failed part-way (a collective's error): drops the
  // gathers and reductions in flight and the gathered copies, so that the next forward starts
  // as after zero_grad(). Not collective; outside a pipeline.
  void abandon_pass();
  // True when every rank's gradient shard is finite. Collective.
  bool grads_finite();
  // Divides the gradient shards by `scale` (loss scaling).
  void unscale(double scale);
  // After the optimizer changed the master shards: gathered copies are stale and dropped. With
  // param_swap_dir the loaded shards are then written back (store_shards()).
  void after_optimizer_step();
  // With param_swap_dir the master shards, and so segments()' params and flat_shards()'
  // masters, hold memory only while loaded: load_shards() reads them from their files (every
  // unit, or one), store_shards() writes them back and frees the memory. Reading or changing
  // them outside forward and backward (the optimizer step, checkpoints) goes between the two.
  // With grad_swap_dir and `gradients`, the gradient shards are brought in too (and dropped
  // by store_shards()). Without either directory both do nothing.
  // Shards in files are read on an I/O thread, written back on it (store_shards() returns
  // before the write ends), and read ahead of their use in forward and backward.
  void load_shards(int unit = -1, bool gradients = true);
  void store_shards(int unit = -1);
  // Starts reading a unit's shards (master and gradient) on the I/O thread, for a
  // load_shards(unit) soon after: an optimizer walking the units calls it for the next one.
  void prefetch_shards(int unit);
  bool shards_on_file() const { return !options_.param_swap_dir_.empty(); }
  // The full value of every parameter, gathered (collective; for checkpoints and tests).
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();
  // The full tensors of a per-segment state (e.g. an optimizer moment), gathered like the
  // parameters: `state_of(segment_index)` returns the segment's piece (fp32, segment numel).
  std::vector<std::pair<std::string, at::Tensor>> full_state(
      const std::function<at::Tensor(size_t)>& state_of);
  // This rank's fp32 master shard and gradient shard of each unit (forward order, root last):
  // views, for optimizers that step whole shards.
  std::vector<std::pair<at::Tensor, at::Tensor>> flat_shards() const;
  // Names and unit of every parameter: the units in forward order, the root last.
  std::vector<std::vector<std::string>> unit_layout() const;
  // False on ranks whose shards are copies of another replica's (hybrid_shard, no_shard): one
  // replica writes checkpoints.
  bool holds_unique_shards() const { return !groups_.replicate || groups_.replicate->rank() == 0; }
  FSDPMemory memory() const;
  void reset_peak();
  const FSDPOptions& options() const { return options_; }

 private:
  struct Unit;
  class Hooks;
  struct HookPoint {
    int unit = 0;
    bool first = false;  // the unit's first block in forward order
    bool last = false;
  };
  // The constructor's phases, in order: the options against the mesh; the shard and replicate
  // groups; the directories of shards kept in files; the units from the wrap policy, then the
  // root; frozen parameters moved to companion units, then the experts' (expert parallelism);
  // rank 0's values broadcast (a materialized model) and buffers cast. Then for each unit: its
  // flat parameter, shard and gradient laid out (`init` fills what a deferred model has no
  // values for); the optimizer's segments; the shards moved to their files; the hooks that
  // reduce its gradients.
  void check_options(const DeviceMesh& mesh);
  void choose_groups(const DeviceMesh& mesh);
  void open_swap_dirs();
  void form_units(const DeviceMesh& mesh);
  void split_frozen_parameters();
  void split_expert_parameters();
  void sync_module_states();
  void lay_out_flat(Unit& unit, const ParameterInitializer& init);
  void add_segments(Unit& unit);
  void move_shards_to_files(Unit& unit);
  void add_gradient_hooks(Unit& unit);
  void install_hooks();
  bool reshard_after_forward() const;
  void pre_forward(torch::nn::Module& module);
  at::Tensor post_forward(torch::nn::Module& module, at::Tensor output);
  void start_backward();
  void pre_backward(Unit& unit);
  void gather(Unit& unit, bool wait);
  // Starts the all-gather of the unit's shards into its full buffer (already allocated).
  void start_gather(Unit& unit);
  // param_swap_dir: the master shard's memory is allocated and read from its file, or freed
  // (unless loaded by load_shards() or still being sent by a gather).
  void bring_master(Unit& unit);
  void drop_master(Unit& unit);
  // grad_swap_dir: the gradient shard's memory is allocated and read from its file (zeros after
  // zero_grad(), scaled by a pending clip), or written back (`write`) and freed.
  void bring_grad(Unit& unit);
  void drop_grad(Unit& unit, bool write);
  // The first half of bring_master() / bring_grad(): memory allocated, the read queued on the
  // I/O thread. Whatever uses the values waits for it (bring_*), as does freeing the memory.
  void read_master_async(Unit& unit);
  void read_grad_async(Unit& unit);
  // With param_swap_dir: queues the reads of the master shards of the units after those
  // prefetch_ahead() gathers, so that their gathers find them in memory.
  void read_ahead(int index, int step);
  // Frees the unit's gathered parameters (and its companion's, unless `companion` is false).
  void release(Unit& unit, bool companion = true);
  // Frees the gathered copy's memory and takes it off the gathered counts (no wait: release()
  // waits for the gather first, abandon_pass() drops a failed one).
  void free_gathered(Unit& unit);
  // When backward reaches unit `index`, the units after it are done with their frozen
  // parameters (the gradient of their input is complete): those are freed.
  void release_frozen_after(int index);
  void wait_gathered(Unit& unit);
  void prefetch(int index);
  // Prefetches the units after `index` in direction `step` (+1 forward, -1 backward), as the
  // options allow.
  void prefetch_ahead(int index, int step);
  // Whether a unit stays gathered between uses (ZeRO-1/2 parameters, ZeRO-3 small units).
  bool keeps_gathered(const Unit& unit) const;
  void refresh(Unit& unit);
  // A gradient reduction just issued (`elements` of them): waited for now, or kept in flight
  // within the ZeRO options' bounds.
  void pace_reduction(const WorkHandle& work, int64_t elements);
  void reduce(Unit& unit);
  // After reduce() queued the unit's reduction (the last of unit.pending): bounds the
  // reductions in flight as the options say, then releases the unit and prefetches.
  void reduction_issued(Unit& unit);
  void finish_backward();
  // A tied embedding in the root unit (tied_embedding.cpp): the model gives the head's and the
  // lookup's gradients of tok_emb.weight to a sink, when the layout allows it, and they are
  // reduced apart: the head's at once, the lookup's rows with the rest of the root.
  void install_tied_sink();
  at::Tensor tied_head_buffer();
  void reduce_tied_head(const at::Tensor& grad);
  void reduce_root_with_tied_rows(Unit& root);
  int64_t gathered_units() const;
  // Gathers a unit's fp32 flat parameter (or a per-segment state) and splits it per parameter.
  void split_full(const Unit& unit, const at::Tensor& shard,
                  std::vector<std::pair<std::string, at::Tensor>>& out);

  Transformer model_;
  FSDPOptions options_;
  // The groups a unit's flat parameter is sharded and reduced over: the mesh's for every unit
  // but the experts' (expert parallelism), which use the expert mesh's.
  struct Groups {
    std::shared_ptr<ProcessGroup> shard;      // null when dp_shard = 1
    std::shared_ptr<ProcessGroup> replicate;  // null when dp_replicate = 1
    std::shared_ptr<ProcessGroup> dp;
    int shard_rank = 0, shard_size = 1;
  };
  Groups groups_on(const DeviceMesh& mesh, bool experts) const;
  Groups groups_, expert_groups_;
  std::shared_ptr<ProcessGroup> ep_group_;    // null without expert parallelism
  std::vector<std::unique_ptr<Unit>> units_;  // forward order; the root last
  std::vector<Unit*> every_unit_;             // the units, each followed by its companions
  std::vector<Unit*> segment_units_;          // the unit of each of segments_
  std::vector<ShardSegment> segments_;
  std::shared_ptr<ForwardHooks> hooks_;  // attached to the model and each unit's blocks
  std::map<const torch::nn::Module*, HookPoint> hook_points_;
  std::set<const torch::nn::Module*> ran_;               // hook points run in the current forward
  std::vector<detail::GradAccumulatedHook> grad_hooks_;  // one per parameter
  enum class Phase { kIdle, kForward, kBackward } phase_ = Phase::kIdle;
  bool pipelined_ = false;  // between begin_pipeline() and end_pipeline()
  std::vector<std::pair<WorkHandle, int64_t>> reductions_in_flight_;
  int tied_param_ = -1;  // tok_emb.weight's index in the root unit when its sink is installed
  std::shared_ptr<detail::TiedGradientSink> tied_sink_;  // the one this object installed
  struct TiedLookup {
    at::Tensor ids, rows;  // [N] and [N, d_model]: a lookup's ids and their rows' gradient
  };
  std::vector<TiedLookup> tied_lookups_;  // since the last reduction of the root
  // The root's flat gradient layout whose embedding part the chunked loss accumulates the
  // head's gradient into (tied_head_buffer), reduce-scattered as it is when the head's
  // backward hands it on.
  at::Tensor tied_flat_;
  int64_t gathered_elements_ = 0;
  int64_t gathered_bytes_ = 0;
  int64_t gathered_peak_ = 0;
  // Transfers of shards in files (param_swap_dir, grad_swap_dir), in the order queued. Declared
  // after units_ so that it finishes them before the units' files and memory go.
  std::unique_ptr<detail::IoThread> io_;
};

// Shards `model` over the mesh's data-parallel ranks in flat units (PyTorch's FSDP1 layout);
// fully_shard (fully_shard.h) is the per-parameter sharding of any module.
std::unique_ptr<FullyShardedDataParallel> flat_shard(Transformer model, const DeviceMesh& mesh,
                                                     FSDPOptions options = {});

}  // namespace shardtrain
