// The memory a frozen LoRA base holds, by storage: builds the GPT-2 124M shape described only,
// adds rank-8 adapters, stores the blocks' linear weights as asked (fp32, bf16 or nf4), then
// materializes it, and prints this process's resident memory (VmRSS, /proc/self/status) before
// and after, with the heap trimmed first so that freed temporaries do not count. One storage
// per process: bench/lora.sh runs it once for each and compares.
// Usage: bench_lora_base fp32|bf16|nf4
#include <cstdio>
#include <string>

#include "model/layers.h"
#include "model/nf4.h"
#include "shardtrain/lora.h"
#include "shardtrain/model.h"
#include "train/run_setup.h"

int main(int argc, char** argv) {
  using namespace shardtrain;
  namespace detail = shardtrain::detail;
  const std::string storage = argc > 1 ? argv[1] : "fp32";
  if (storage != "fp32" && storage != "bf16" && storage != "nf4") {
    std::fprintf(stderr, "usage: bench_lora_base fp32|bf16|nf4\n");
    return 2;
  }
  Transformer model(model_preset("gpt2-124m"), ModelInit().seed(1).deferred());
  add_lora(*model, LoraOptions().rank(8));
  if (storage != "fp32") detail::store_frozen_linears(*model, storage);
  // One-time state of the library's kernels (thread pools, lookup tables) is not the base's:
  // a small quantization runs before the first reading, in every storage alike.
  detail::nf4_dequantize(detail::nf4_unpack(detail::nf4_pack(detail::nf4_quantize(at::randn({64, 64}))), {64, 64}));
  detail::trim_heap();
  const int64_t before = detail::resident_bytes();
  model->materialize();
  detail::trim_heap();
  const int64_t after = detail::resident_bytes();
  int64_t quantized = 0;  // the blocks' linear weights, the ones the storage applies to
  for (const auto& p : model->config().parameter_shapes()) {
    if (p.name.rfind("blocks.", 0) == 0 && p.shape.size() == 2) quantized += p.numel();
  }
  std::printf("%s %lld %lld %lld\n", storage.c_str(), static_cast<long long>(before),
              static_cast<long long>(after), static_cast<long long>(quantized));
  return 0;
}
