// The trainer's tensor-parallel step: parallel.tp and parallel.sequence_parallel onto
// parallelize_module with the model family's plan.
#include "parallel/parallelize.h"
#include "shardtrain/tensor_parallel.h"

namespace shardtrain {

void apply_tp(Transformer& model, const TrainConfig& config, const DeviceMesh& mesh) {
  const int tp = mesh.size(MeshAxis::kTp);
  if (tp == 1) return;
  parallelize_module(model, mesh.group_ptr(MeshAxis::kTp), transformer_tp_plan(model->config(), tp),
                     TensorParallelOptions().sequence_parallel(config.sequence_parallel));
}

}  // namespace shardtrain
