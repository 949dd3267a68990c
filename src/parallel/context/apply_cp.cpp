#include "parallel/context/ring_attention.h"
#include "parallel/parallelize.h"

namespace shardtrain {

void apply_cp(Transformer& model, const DeviceMesh& mesh) {
  if (mesh.size(MeshAxis::kCp) == 1) return;
  model->set_context_split(detail::ring_split(mesh.group_ptr(MeshAxis::kCp)));
}

}  // namespace shardtrain
