// Expert parallelism: a mixture-of-experts model's experts split over the mesh's ep groups
// (DeviceMesh::ep_ptr), each layer's rows sent to the ranks holding their experts and back by
// all-to-all (GShard, arXiv:2006.16668; torchtitan's ExpertParallel). What the data-parallel
// strategies need to tell the experts' parameters apart is here too.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/expert_split.h"
#include "shardtrain/dist.h"
#include "shardtrain/mesh.h"
#include "shardtrain/model.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain {

// The experts of each mixture-of-experts block that `ep_rank` of `ep` holds: n_experts / ep of
// them, from ep_rank x n_experts / ep (nothing changes for ep = 1).
void limit_to_own_experts(ModelParts& parts, const ModelConfig& config, int ep_rank, int ep);

// Hands the model the mesh's ep group (a no-op for ep = 1): its layers then dispatch their rows
// through it. The model must hold this rank's experts (limit_to_own_experts).
void apply_ep(Transformer& model, const DeviceMesh& mesh);

namespace detail {

// The model's ExpertSplit over `group`: rows travel by all-to-all, the counts first.
std::shared_ptr<ExpertSplit> make_expert_split(std::shared_ptr<ProcessGroup> group,
                                               int64_t n_experts);

// Whether tensor `name` (a parameter, or optimizer state named after one) belongs to an
// expert of a mixture-of-experts block ("blocks.{i}.moe.experts.{e}...").
bool is_expert_tensor(const std::string& name);

// `specs` of this rank's tensors with each held expert's specs standing for every expert's:
// the same list on every rank of an expert-parallel model (checkpoints list every tensor), in
// the order of the first held expert. Specs of other tensors are kept as they are.
std::vector<TensorSpec> with_every_expert(const std::vector<TensorSpec>& specs, int64_t n_experts);

}  // namespace detail
}  // namespace shardtrain
