// NF4: the codebook QLoRA defines, round trips within the format's bound, and the stored size.
#include "model/nf4.h"

#include <gtest/gtest.h>

#include <stdexcept>

namespace shardtrain::detail {
namespace nf4_test {

TEST(Nf4Test, CodebookIsQLoRAsNormalFloat) {
  const at::Tensor codebook = nf4_codebook();
  ASSERT_EQ(codebook.numel(), 16);
  EXPECT_FLOAT_EQ(codebook[0].item<float>(), -1.0f);
  EXPECT_FLOAT_EQ(codebook[15].item<float>(), 1.0f);
  EXPECT_EQ(codebook[7].item<float>(), 0.0f);
  EXPECT_TRUE((codebook.narrow(0, 1, 15) > codebook.narrow(0, 0, 15)).all().item<bool>());
  // Two entries of the table in the QLoRA paper's appendix (and bitsandbytes).
  EXPECT_NEAR(codebook[1].item<float>(), -0.6961928, 1e-6);
  EXPECT_NEAR(codebook[8].item<float>(), 0.0795803, 1e-6);
}

// Per value: half the widest gap of the codebook times the block's absmax, plus what the
// absmax lost to its 8-bit storage.
void expect_within_bound(const at::Tensor& values, const Nf4Tensor& q) {
  const at::Tensor codebook = nf4_codebook();
  const double half_gap =
      (codebook.narrow(0, 1, 15) - codebook.narrow(0, 0, 15)).max().item<double>() / 2;
  const int64_t n = values.numel();
  const int64_t blocks = (n + q.block - 1) / q.block;
  at::Tensor padded = at::zeros({blocks * q.block});
  padded.narrow(0, 0, n).copy_(values.reshape({-1}));
  const at::Tensor absmax = padded.view({blocks, q.block}).abs().amax(1);
  const at::Tensor stored = nf4_block_scales(q);
  const at::Tensor bound = (half_gap * absmax + (absmax - stored).abs() + 1e-6)
                               .unsqueeze(1)
                               .expand({blocks, q.block})
                               .reshape({-1})
                               .narrow(0, 0, n);
  const at::Tensor error = (nf4_dequantize(q).reshape({-1}) - values.reshape({-1})).abs();
  EXPECT_TRUE((error <= bound).all().item<bool>())
      << "largest error over bound: " << (error - bound).max().item<double>();
  // Nearest-code rounding does much better than the bound on average.
  EXPECT_LT(error.mean().item<double>(), 0.5 * bound.mean().item<double>());
}

TEST(Nf4Test, RoundTripStaysWithinTheFormatsBound) {
  at::Generator gen = at::detail::createCPUGenerator(7);
  // 37 x 101 values: the last block is partial.
  const at::Tensor weights = at::normal(0.0, 0.02, {37, 101}, gen);
  const Nf4Tensor q = nf4_quantize(weights);
  EXPECT_EQ(q.shape, weights.sizes().vec());
  expect_within_bound(weights, q);
  // Heavy tails and a zero block too.
  at::Tensor mixed = at::normal(0.0, 1.0, {4096}, gen).pow(3);
  mixed.narrow(0, 64, 64).zero_();
  const Nf4Tensor qm = nf4_quantize(mixed);
  expect_within_bound(mixed, qm);
  EXPECT_TRUE((nf4_dequantize(qm).narrow(0, 64, 64) == 0).all().item<bool>());
}

TEST(Nf4Test, CodebookValuesComeBackUpToTheirScale) {
  // Every block holds the 16 codes times one scale: only the scale's storage loses anything.
  const at::Tensor scales = at::linspace(0.5, 3.0, 32).unsqueeze(1);
  const at::Tensor values = (nf4_codebook().repeat({4}).unsqueeze(0) * scales).reshape({-1});
  const Nf4Tensor q = nf4_quantize(values);
  const at::Tensor stored = nf4_block_scales(q).unsqueeze(1);
  const at::Tensor expected = (nf4_codebook().repeat({4}).unsqueeze(0) * stored).reshape({-1});
  EXPECT_TRUE(at::allclose(nf4_dequantize(q), expected, 1e-6, 1e-6));
  EXPECT_LT((stored - scales).abs().max().item<double>(), 3.0 / 127);
}

TEST(Nf4Test, StoresAboutHalfAByteAValue) {
  const at::Tensor weights = at::randn({1024, 768});
  const Nf4Tensor q = nf4_quantize(weights);
  const double per_value = static_cast<double>(q.bytes()) / static_cast<double>(weights.numel());
  EXPECT_LE(per_value, 0.52);
  EXPECT_GE(per_value, 0.5);
  EXPECT_EQ(nf4_dequantize(q, at::kBFloat16).scalar_type(), at::kBFloat16);
}

TEST(Nf4Test, BadInputIsRefused) {
  EXPECT_THROW(nf4_quantize(at::ones({8}), 3), std::invalid_argument);
  at::Tensor bad = at::ones({8});
  bad[2] = std::nan("");
  EXPECT_THROW(nf4_quantize(bad), std::invalid_argument);
}

TEST(Nf4Test, PackedBytesHoldTheQuantizedTensorAtAnyOffset) {
  const at::Tensor w = at::randn({96, 40}) * 0.05;
  const Nf4Tensor q = nf4_quantize(w);
  const at::Tensor packed = nf4_pack(q);
  EXPECT_EQ(packed.numel(), nf4_packed_bytes(w.sizes()));
  EXPECT_GE(packed.numel(), q.bytes());
  EXPECT_LE(packed.numel() - q.bytes(), 3);  // alignment padding only
  // Inside a gathered buffer a packed weight may start at any byte.
  at::Tensor buffer = at::zeros({packed.numel() + 7}, at::kByte);
  buffer.narrow(0, 3, packed.numel()).copy_(packed);
  const at::Tensor back =
      nf4_dequantize(nf4_unpack(buffer.narrow(0, 3, packed.numel()), w.sizes()));
  EXPECT_TRUE(at::equal(back, nf4_dequantize(q)));
  EXPECT_THROW(nf4_unpack(packed.narrow(0, 0, packed.numel() - 1), w.sizes()),
               std::invalid_argument);
  EXPECT_LE(static_cast<double>(packed.numel()) / static_cast<double>(w.numel()), 0.6);
}

}  // namespace nf4_test
}  // namespace shardtrain::detail
