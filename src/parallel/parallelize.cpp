#include "parallel/parallelize.h"

#include <stdexcept>

namespace shardtrain {

MixedPrecision mixed_precision_of(const TrainConfig& config) {
  auto dtype = [](const std::string& name) { return name == "bf16" ? at::kBFloat16 : at::kFloat; };
  return MixedPrecision()
      .param_dtype(dtype(config.param_dtype))
      .reduce_dtype(dtype(config.reduce_dtype))
      .buffer_dtype(dtype(config.buffer_dtype));
}

void apply_activation_checkpointing(Transformer& model, const TrainConfig& config) {
  model->set_activation_checkpointing(config.activation_checkpointing);
}

Parallelized parallelize(Transformer& model, const TrainConfig& config,
                         const std::shared_ptr<ProcessGroup>& world) {
  Parallelized out;
  apply_activation_checkpointing(model, config);
  if (config.strategy == "fsdp") {
    apply_fsdp(model, config, world, out);
  } else if (config.strategy == "zero") {
    apply_zero(model, config, world, out);
  } else if (config.strategy == "ddp" && world) {
    out.ddp = apply_ddp(model, config, world);
  }
  // What no sharded step took over is held whole: "none", and DDP on one process.
  if (!out.sharded) model->materialize();
  return out;
}

}  // namespace shardtrain
