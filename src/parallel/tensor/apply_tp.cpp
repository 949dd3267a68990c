// The trainer's tensor-parallel step: parallelize_module on the mesh's tp axis with the model
// family's plan.
#include "parallel/parallelize.h"
#include "shardtrain/tensor_parallel.h"

namespace shardtrain {

void apply_tp(Transformer& model, TensorParallelOptions options, const DeviceMesh& mesh) {
  const int tp = mesh.size(MeshAxis::kTp);
  if (tp == 1) return;
  TpPlan plan = transformer_tp_plan(model->config(), tp);
  // A pipeline stage holds some of the model: the plan's entries for the parts it does not hold
  // (another stage's blocks, the embeddings, the head) are left out.
  const ModelParts& parts = model->parts();
  TpPlan held;
  for (auto& [path, style] : plan) {
    const bool block = path.rfind("blocks.", 0) == 0;
    const bool first = path.rfind("tok_emb", 0) == 0 || path.rfind("pos_emb", 0) == 0;
    const bool tied_head = path.rfind("tok_emb", 0) == 0 && model->config().tie_embeddings;
    if (block || (first && parts.embedding) || (!first && parts.head) ||
        (tied_head && parts.head)) {
      held.emplace_back(std::move(path), std::move(style));
    }
  }
  parallelize_module(model, mesh.group_ptr(MeshAxis::kTp), held, options);
}

}  // namespace shardtrain
