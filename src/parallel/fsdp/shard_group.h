// The state behind one fully_shard'ed module: its parameters' dim-0 shards, where their gathered
// copies stand, and the hooks that gather, free and reduce them around its forward and backward.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "parallel/grad_hook.h"
#include "shardtrain/fully_shard.h"

namespace shardtrain::detail {

// One parameter of the group. Rank r of the dp_shard group holds rows
// [r * rows_per_rank, (r + 1) * rows_per_rank) of it, the rows past the end being padding.
struct ShardParam {
  std::string name;  // relative to the group's module
  at::Tensor param;  // the module's own tensor: full shape, compute dtype, memory while gathered
  std::vector<int64_t> shape;
  int64_t rows = 0;           // dim 0 (1 for a 0-dim parameter)
  int64_t row_numel = 0;      // elements per row
  int64_t rows_per_rank = 0;  // ceil(rows / shard group size)
  int64_t row_begin = 0;      // this rank's first row
  int64_t local_rows = 0;     // rows of it this rank holds (0 on ranks past the end)
  int64_t offset = 0;         // where its padded shard starts in the group's buffers
  bool trainable = false;
  at::Tensor local;  // the shard the optimizer sees: a leaf view into the group's master
  bool ready = false;  // its gradient arrived in this backward

  int64_t padded_numel() const { return rows_per_rank * row_numel; }
  int64_t local_numel() const { return local_rows * row_numel; }
};

class ShardGroup : public ForwardHooks {
 public:
  ShardGroup(torch::nn::Module& module, const DeviceMesh& mesh,
             FullyShardOptions options);
  ~ShardGroup() override;

  void pre_forward(torch::nn::Module& module) override;
  at::Tensor post_forward(torch::nn::Module& module, at::Tensor output) override;
  std::optional<at::ScalarType> input_dtype() const override;

  // Fills the shards of `params` from the module's values (or options.init), then frees the
  // module's parameter memory; casts `buffers` to the buffer dtype. Collective over the
  // data-parallel ranks when sync_module_states (rank 0's values of both are broadcast).
  void shard(std::vector<std::pair<std::string, at::Tensor>> params,
             std::vector<at::Tensor> buffers);
  // Adopts an inner sharded module found at `prefix` ("blocks.0.") of this one.
  void adopt(const std::string& prefix, std::shared_ptr<FSDPModule> inner, ShardGroup& group);

  void unshard(bool async);
  void wait_for_unshard();
  void reshard();

  // This group and those inside it, construction order (inner ones first), with the prefix of
  // their names relative to this module.
  const std::vector<std::pair<std::string, ShardGroup*>>& tree() const { return tree_; }
  const std::vector<ShardParam>& params() const { return params_; }
  std::vector<ShardParam>& params() { return params_; }
  // Valid while the module lives (the group does not keep it alive: the registry drops the
  // group once the module is gone).
  torch::nn::Module& module() const { return *module_; }
  const torch::nn::Module* module_address() const { return module_; }
  const std::unordered_set<const torch::nn::Module*>& subtree() const { return subtree_; }
  const at::Tensor& master() const { return master_; }
  ProcessGroup* shard_group() const { return shard_group_.get(); }
  bool writes_checkpoint() const { return !replicate_group_ || replicate_group_->rank() == 0; }
  bool leads_buffers() const { return dp_group_->rank() == 0; }
  // Gathers the fp32 values of the group's parameters (collective over dp_shard).
  std::vector<at::Tensor> gather_full() const;

  bool sync = true;
  bool reshard_after_backward = true;
  std::vector<std::weak_ptr<FSDPModule>> forward_prefetch, backward_prefetch;

 private:
  enum class Phase { kIdle, kForward, kBackward };
  struct PendingReduce {
    at::Tensor output;  // reduce_dtype, this rank's padded shard of the averaged gradient
    WorkHandle work;
  };
  bool reshard_after_forward() const;
  ShardGroup* forward_root();
  void hook_gradients();
  void start_backward();
  void pre_backward();
  void post_backward();
  void reduce();
  // Waits for this group's reduction (and, under hybrid sharding, averages it across replicas)
  // and adds it into the gradient shards.
  void finish_reduce();
  void finish_backward();
  void prefetch(const std::vector<std::weak_ptr<FSDPModule>>& modules);

  torch::nn::Module* module_;
  FullyShardOptions options_;
  std::shared_ptr<ProcessGroup> shard_group_;      // null when dp_shard = 1
  std::shared_ptr<ProcessGroup> replicate_group_;  // null when dp_replicate = 1
  std::shared_ptr<ProcessGroup> dp_group_;
  int shard_size_ = 1, shard_rank_ = 0;
  std::vector<ShardParam> params_;
  int64_t total_ = 0;   // elements of the padded shards of all parameters
  at::Tensor master_;   // fp32 [total_]: this rank's shards, what the optimizer updates
  bool has_frozen_ = false;
  size_t trainable_ = 0;

  ShardGroup* owner_ = nullptr;  // the sharded module this one lies in
  std::vector<std::pair<std::string, ShardGroup*>> tree_;
  std::vector<std::shared_ptr<FSDPModule>> inner_;  // keeps the inner groups alive
  std::unordered_set<const torch::nn::Module*> subtree_;

  // Gathered copy.
  bool unsharded_ = false;
  bool gathering_ = false;
  std::vector<WorkHandle> gather_works_;  // one per parameter
  at::Tensor gather_in_;                   // what they send, alive until they complete

  // Per forward and backward (the root's phase and order; every group's flags).
  Phase phase_ = Phase::kIdle;
  std::vector<ShardGroup*> forward_order_;
  ShardGroup* root_ = nullptr;  // the root of the forward this group last ran in
  bool in_backward_ = false;
  bool reduced_ = false;
  size_t ready_ = 0;
  std::optional<PendingReduce> pending_;  // the reduction issued in this backward
  std::vector<GradAccumulatedHook> grad_hooks_;  // one per trainable parameter
};

}  // namespace shardtrain::detail
