// Samples packed into one row never see each other: the loss of a packed row equals the sum of
// the samples' losses computed one by one, for learned positions (GPT-2) and RoPE (Llama and
// its variants), through the fused attention kernel and the reference computation.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <vector>

#include "shardtrain/model.h"

namespace shardtrain {
namespace packing_test {

constexpr AttentionKernel kAttentionKernels[] = {
    AttentionKernel::kBlockwise, AttentionKernel::kFused, AttentionKernel::kReference};

at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                                /*weight=*/{}, at::Reduction::Sum, kIgnoreIndex);
}

TEST(Packing, PackedRowLossIsTheSumOfItsSamples) {
  const std::vector<int64_t> lengths = {5, 9, 3, 7};  // 20 targets in a row of 24
  const int64_t row = 24;
  for (const char* preset : {"tiny", "tiny-llama", "tiny-qwen3", "tiny-llama3.2"}) {
    torch::manual_seed(3);
    const ModelConfig config = model_preset(preset);
    Transformer model(config);
    model->eval();
    std::vector<at::Tensor> samples;
    for (int64_t n : lengths) samples.push_back(at::randint(config.vocab_size, {n}, at::kLong));
    at::Tensor inputs = at::zeros({1, row}, at::kLong);
    at::Tensor targets = at::full({1, row}, kIgnoreIndex, at::kLong);
    at::Tensor positions = at::zeros({1, row}, at::kLong);
    at::Tensor segments = at::full({1, row}, -1, at::kLong);
    int64_t at = 0;
    for (size_t s = 0; s < samples.size(); ++s) {
      const int64_t pairs = lengths[s] - 1;
      inputs[0].narrow(0, at, pairs).copy_(samples[s].narrow(0, 0, pairs));
      targets[0].narrow(0, at, pairs).copy_(samples[s].narrow(0, 1, pairs));
      positions[0].narrow(0, at, pairs).copy_(at::arange(pairs, at::kLong));
      segments[0].narrow(0, at, pairs).fill_(static_cast<int64_t>(s));
      at += pairs;
    }
    torch::NoGradGuard no_grad;
    for (AttentionKernel kernel : kAttentionKernels) {
      model->set_attention(kernel);
      double one_by_one = 0;
      for (const at::Tensor& sample : samples) {
        const int64_t pairs = sample.size(0) - 1;
        const at::Tensor logits = model->forward(sample.narrow(0, 0, pairs).unsqueeze(0));
        one_by_one += summed_loss(logits, sample.narrow(0, 1, pairs)).item<double>();
      }
      const double packed =
          summed_loss(model->forward(inputs, SequenceLayout{positions, segments}), targets)
              .item<double>();
      EXPECT_NEAR(packed, one_by_one, 1e-5 * one_by_one)
          << preset << " kernel " << static_cast<int>(kernel);
      // Without the layout the samples would read each other: the loss differs.
      const double unpacked = summed_loss(model->forward(inputs), targets).item<double>();
      EXPECT_GT(std::abs(unpacked - one_by_one), 1e-4 * one_by_one) << preset;
    }
  }
}

TEST(Packing, ALayoutOfAnotherShapeIsRefused) {
  Transformer model(model_preset("tiny"));
  const at::Tensor tokens = at::zeros({2, 8}, at::kLong);
  const SequenceLayout wrong{at::zeros({2, 7}, at::kLong), at::zeros({2, 7}, at::kLong)};
  EXPECT_THROW(model->forward(tokens, wrong), std::invalid_argument);
}

}  // namespace packing_test
}  // namespace shardtrain
