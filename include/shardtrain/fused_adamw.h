// A fused CPU AdamW: one pass over memory per element, vectorized and multi-threaded; a
// drop-in torch::optim::AdamW built on it; and AdamW state kept in files (NVMe offload).
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain {

// Hyper-parameters of one AdamW update. `step_` is the 1-based count of updates including this
// one (it sets the bias corrections), as torch::optim::AdamWParamState::step() after its
// increment.
struct AdamWStep {
  AdamWStep& lr(double value) {
    lr_ = value;
    return *this;
  }
  AdamWStep& betas(double beta1, double beta2) {
    beta1_ = beta1;
    beta2_ = beta2;
    return *this;
  }
  AdamWStep& eps(double value) {
    eps_ = value;
    return *this;
  }
  AdamWStep& weight_decay(double value) {
    weight_decay_ = value;
    return *this;
  }
  AdamWStep& step(int64_t value) {
    step_ = value;
    return *this;
  }
  // false: no bias corrections (1 - beta^t taken as 1), DeepSpeed's bias_correction = false.
  AdamWStep& bias_correction(bool value) {
    bias_correction_ = value;
    return *this;
  }
  // lr, betas, eps and weight decay of `options` (amsgrad is rejected: not supported).
  static AdamWStep from(const torch::optim::AdamWOptions& options, int64_t step);

  double lr_ = 1e-3;
  double beta1_ = 0.9;
  double beta2_ = 0.999;
  double eps_ = 1e-8;
  double weight_decay_ = 1e-2;
  int64_t step_ = 1;
  bool bias_correction_ = true;
};

// One AdamW update of `param` in place, with LibTorch 1.13's torch::optim::AdamW rule and
// order of floating-point operations (the result is bit-for-bit LibTorch's on x86-64):
//   p = p * (1 - lr*wd)                      (skipped when wd == 0)
//   m = beta1*m + (1-beta1)*g                (LibTorch's mul_ then add_: one fused multiply-add)
//   v = beta2*v + (1-beta2)*g*g              (mul_ then addcmul_: one fused multiply-add)
//   p = p - lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
// Scalars are computed in double and rounded to float once, as LibTorch does.
// param, grad, exp_avg and exp_avg_sq: fp32, CPU, contiguous, the same numel (any shape: they
// are walked as flat arrays, so 1-D views of a flat shard work). When `param_bf16_out` is given
// it must be a contiguous CPU bf16 tensor of the same numel; it receives the updated param
// rounded to nearest even (the value of param.to(at::kBFloat16)) in the same pass.
// param, exp_avg, exp_avg_sq and *param_bf16_out are written in place through their handles
// (so `flat.narrow(0, offset, length)` can be passed directly).
// Runs on at::get_num_threads() threads in large contiguous ranges; synchronous. Throws
// std::invalid_argument naming the tensor and the mismatch, or a bad hyper-parameter.
void fused_adamw_step(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& exp_avg,
                      const at::Tensor& exp_avg_sq, const AdamWStep& hyper,
                      const at::Tensor* param_bf16_out = nullptr);

// The instruction set fused_adamw_step uses on this CPU: "avx512", "avx2" or "generic".
// SHARDTRAIN_ADAM_ISA=avx2|generic in the environment caps it (for comparisons).
std::string fused_adamw_isa();

// torch::optim::AdamW with step() on the fused kernel: the same options, param groups and
// per-parameter torch::optim::AdamWParamState (step, exp_avg, exp_avg_sq), so code that reads
// or restores AdamW state works unchanged, and the same results bit-for-bit. Parameters that
// are not contiguous fp32 CPU tensors with a contiguous gradient take LibTorch's own sequence
// of tensor operations. amsgrad is rejected (std::invalid_argument) at construction and step.
class FusedAdamW : public torch::optim::AdamW {
 public:
  explicit FusedAdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                      torch::optim::AdamWOptions defaults = {});
  explicit FusedAdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {});

  // Same contract as torch::optim::AdamW::step: parameters without a gradient are skipped.
  at::Tensor step(LossClosure closure = nullptr) override;

  // Adam's bias corrections (on by default, as LibTorch's AdamW); off for every parameter group.
  void set_bias_correction(bool value) { bias_correction_ = value; }
  bool bias_correction() const { return bias_correction_; }

 private:
  bool bias_correction_ = true;
};

struct NvmeAdamWOptions {
  // Directory for the state files; it must exist and be writable.
  NvmeAdamWOptions& dir(std::string value) {
    dir_ = std::move(value);
    return *this;
  }
  // Elements per chunk: the unit of I/O and of the update. Three chunks of each file are held
  // in memory (24 bytes per chunk element, 36 with swap_params).
  NvmeAdamWOptions& chunk_elements(int64_t value) {
    chunk_elements_ = value;
    return *this;
  }
  // O_DIRECT: bypass the page cache, so the files are really read from and written to the
  // device (chunks are then rounded up to multiples of 1024 elements, 4 KiB).
  NvmeAdamWOptions& direct_io(bool value) {
    direct_io_ = value;
    return *this;
  }

  // Keep the fp32 master parameters in a third file too (step(grad, ...)); the caller then
  // holds only the gradient and, usually, the bf16 copy the step writes.
  NvmeAdamWOptions& swap_params(bool value) {
    swap_params_ = value;
    return *this;
  }

  std::string dir_;
  int64_t chunk_elements_ = int64_t{1} << 22;
  bool direct_io_ = false;
  bool swap_params_ = false;
};

// The AdamW state (exp_avg, exp_avg_sq) of one flat partition of `numel` fp32 elements, kept
// in two files under options.dir_ instead of memory; starts at zero, as AdamW's state does.
// With swap_params the fp32 parameters are a third file (zero until load_param()).
// step() walks the partition in chunks: while chunk i is updated in memory by the fused kernel,
// chunk i+1 is read and chunk i-1 written on two I/O threads (pread/pwrite), three rotating
// buffers, so the update overlaps the I/O. The files are removed by the destructor.
// Not thread-safe: one caller at a time. Errors (a missing or unwritable directory, a failed
// read or write) throw, naming the file and the system's reason.
class NvmeAdamW {
 public:
  NvmeAdamW(int64_t numel, NvmeAdamWOptions options);
  ~NvmeAdamW();
  NvmeAdamW(const NvmeAdamW&) = delete;
  NvmeAdamW& operator=(const NvmeAdamW&) = delete;

  // One update of `param` (fp32, contiguous, CPU, numel elements) with `grad`; same results as
  // fused_adamw_step on in-memory state. Synchronous: the state is on file when it returns.
  // `param_bf16_out` as in fused_adamw_step.
  // Without swap_params only.
  void step(const at::Tensor& param, const at::Tensor& grad, const AdamWStep& hyper,
            const at::Tensor* param_bf16_out = nullptr);
  // With swap_params only: the parameters are read from and written back to their file.
  void step(const at::Tensor& grad, const AdamWStep& hyper,
            const at::Tensor* param_bf16_out = nullptr);

  // Copies of the full state read from the files (new fp32 tensors of numel elements, owned by
  // the caller), e.g. for a checkpoint.
  at::Tensor exp_avg() const;
  at::Tensor exp_avg_sq() const;
  // Replaces the state on file with these tensors (fp32, numel elements), e.g. on resume.
  void load(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);
  // With swap_params only: a copy of the parameters on file, and replacing them.
  at::Tensor param() const;
  void load_param(const at::Tensor& param);

  int64_t numel() const { return numel_; }
  const std::string& exp_avg_path() const { return paths_[0]; }
  const std::string& exp_avg_sq_path() const { return paths_[1]; }
  const std::string& param_path() const { return paths_[2]; }  // empty without swap_params

 private:
  struct Io;
  // Reads file k (0: exp_avg, 1: exp_avg_sq, 2: param) into *out, or writes *in to it.
  void copy_state(int k, at::Tensor* out, const at::Tensor* in) const;
  // The chunked pipeline; param null means the parameters are on file.
  void run_step(float* param, const float* grad, const AdamWStep& hyper, uint16_t* bf16);

  int64_t numel_;
  NvmeAdamWOptions options_;
  std::string paths_[3];
  std::unique_ptr<Io> io_;
};

struct AdamBenchOptions {
  // Parameters updated per step (the flat fp32 partition).
  AdamBenchOptions& params(int64_t value) {
    params_ = value;
    return *this;
  }
  // Intra-op threads for every variant (at::set_num_threads); 0 keeps the current setting.
  AdamBenchOptions& threads(int value) {
    threads_ = value;
    return *this;
  }
  // Timed steps per variant; the median is reported. One untimed step precedes them.
  AdamBenchOptions& repeats(int value) {
    repeats_ = value;
    return *this;
  }
  // Directory for the NVMe-swapped variant's files; empty skips that variant.
  AdamBenchOptions& nvme_dir(std::string value) {
    nvme_dir_ = std::move(value);
    return *this;
  }
  AdamBenchOptions& nvme_chunk_elements(int64_t value) {
    nvme_chunk_elements_ = value;
    return *this;
  }

  int64_t params_ = 100'000'000;
  int threads_ = 0;
  int repeats_ = 5;
  std::string nvme_dir_ = "/tmp";
  int64_t nvme_chunk_elements_ = int64_t{1} << 22;
};

struct AdamBenchRow {
  std::string name;           // "copy (memcpy)", "torch::optim::AdamW", "fused AdamW", ...
  double median_s = 0;        // median seconds per step (per copy for the copy rows)
  double elements_per_s = 0;  // params / median_s
  double gbps_28 = 0;         // elements/s x 28 bytes (copy rows: 8 bytes, read + written)
  double vs_torch = 0;        // speed relative to torch::optim::AdamW (higher is faster)
  double of_bound = 0;        // elements/s over the bound: best copy GB/s / 28 bytes
};

// Measures, in one run and at one thread count: a copy bandwidth (a params-sized fp32 buffer
// copied into another by at::Tensor::copy_ and by memcpy on the same threads, counted as 8 bytes
// per element; the faster sets the bound), LibTorch's AdamW
// step, fused_adamw_step without and with the bf16 copy, and NvmeAdamW (page cache and
// O_DIRECT, when the directory allows it). Allocates about 10 x 4 bytes per parameter.
// Throws std::invalid_argument for a bad option.
std::vector<AdamBenchRow> bench_adam(const AdamBenchOptions& options);

// The rows as an aligned text table with a header line.
std::string format_adam_bench_table(const std::vector<AdamBenchRow>& rows);

}  // namespace shardtrain
