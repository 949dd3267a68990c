// Quantization-aware training on a model ([compression], DeepSpeed's compression_training
// weight and activation quantization): which linear layers quantize what, and from which step.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

#include "model/fake_quant.h"
#include "shardtrain/config.h"

namespace shardtrain::detail {

class Compression {
 public:
  // Gives the linear layers of `model` that `section`'s groups match their quantizers. A layer
  // is matched by a regular expression found in its name or its Hugging Face name (`config`'s
  // family). Throws std::invalid_argument for a pattern that matches no linear layer, a layer
  // two patterns of one technique match, or weight_groups not dividing a matched weight.
  Compression(torch::nn::Module& model, const ModelConfig& config,
              const CompressionSection& section);

  // Before the forwards of step `step` (0-based): each technique quantizes from its offset on.
  void set_step(int64_t step);

  // How many layers quantize their weight, their input.
  int64_t weight_layers() const { return weight_layers_; }
  int64_t activation_layers() const { return activation_layers_; }

 private:
  std::shared_ptr<CompressionSwitches> switches_;
  int64_t weight_offset_ = 0, activation_offset_ = 0;
  int64_t weight_layers_ = 0, activation_layers_ = 0;
};

}  // namespace shardtrain::detail
