// AdamW state in files. The partition is walked in chunks through three rotating buffers: while
// the kernel updates chunk i in one, chunk i+1 is being read into the next and chunk i-1
// written from the previous, each on its own I/O thread, so a step costs about
// max(compute, read, write) instead of their sum once the pipeline is full.

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "optim/adamw_kernel.h"
#include "optim/io_thread.h"
#include "optim/swap_file.h"
#include "shardtrain/fused_adamw.h"

namespace shardtrain {
namespace {

// O_DIRECT transfers must be aligned to the logical block size; 4 KiB covers current devices.
constexpr int64_t kDirectAlign = 4096;

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

}  // namespace

struct NvmeAdamW::Io {
  int count = 2;  // files: exp_avg, exp_avg_sq, and param with swap_params
  std::unique_ptr<detail::SwapFile> files[3];
  int64_t chunk = 0;                              // elements per chunk
  std::unique_ptr<float, FreeDeleter> buf[3][3];  // [slot][file], only while a step or copy runs
  detail::IoThread reader, writer;
};

namespace {

// The chunk buffers exist only while a step or a copy runs: a model has one NvmeAdamW per unit,
// stepped one after another, so buffers held between steps would cost units x 6 chunks.
// Declared before the I/O in flight is drained, so they outlive it.
class ChunkBuffers {
 public:
  ChunkBuffers(std::unique_ptr<float, FreeDeleter> (&buf)[3][3], int files, int64_t chunk)
      : buf_(buf) {
    const int64_t bytes = round_up(chunk * 4, kDirectAlign);
    for (auto& slot : buf_) {
      for (int k = 0; k < files; ++k) {
        slot[k].reset(static_cast<float*>(std::aligned_alloc(kDirectAlign, bytes)));
        if (!slot[k]) throw std::bad_alloc();
      }
    }
  }
  ~ChunkBuffers() {
    for (auto& slot : buf_) {
      for (auto& b : slot) b.reset();
    }
  }
  ChunkBuffers(const ChunkBuffers&) = delete;
  ChunkBuffers& operator=(const ChunkBuffers&) = delete;

 private:
  std::unique_ptr<float, FreeDeleter> (&buf_)[3][3];
};

}  // namespace

NvmeAdamW::NvmeAdamW(int64_t numel, NvmeAdamWOptions options)
    : numel_(numel), options_(std::move(options)), io_(std::make_unique<Io>()) {
  if (numel_ <= 0)
    throw std::invalid_argument("NVMe offload: numel must be > 0, got " + std::to_string(numel_));
  if (options_.chunk_elements_ <= 0) {
    throw std::invalid_argument("NVMe offload: chunk_elements must be > 0, got " +
                                std::to_string(options_.chunk_elements_));
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (options_.dir_.empty() || !fs::is_directory(options_.dir_, ec)) {
    throw std::invalid_argument("NVMe offload: directory '" + options_.dir_ + "' does not exist");
  }
  io_->chunk = std::min(options_.chunk_elements_, numel_);
  if (options_.direct_io_) io_->chunk = round_up(io_->chunk, kDirectAlign / 4);
  const int files = io_->count = options_.swap_params_ ? 3 : 2;
  const std::string stem = detail::unique_swap_stem(options_.dir_, "adamw");
  const char* suffixes[3] = {".exp_avg", ".exp_avg_sq", ".param"};
  // Padded to the alignment so that the last O_DIRECT transfer may be a whole block. A file
  // that is all holes reads as zeros: AdamW's initial state, without writing it.
  const int64_t file_bytes = round_up(numel_ * 4, kDirectAlign);
  for (int k = 0; k < files; ++k) {
    io_->files[k] =
        std::make_unique<detail::SwapFile>(stem + suffixes[k], file_bytes, options_.direct_io_);
    paths_[k] = io_->files[k]->path();
  }
}

NvmeAdamW::~NvmeAdamW() = default;

void NvmeAdamW::step(const at::Tensor& param, const at::Tensor& grad, const AdamWStep& hyper,
                     const at::Tensor* param_bf16_out) {
  if (options_.swap_params_) {
    throw std::invalid_argument(
        "NVMe offload: the parameters are kept on file (swap_params): "
        "call step(grad, hyper)");
  }
  uint16_t* bf16 = detail::check_adamw_args(param, grad, nullptr, nullptr, hyper, param_bf16_out);
  if (param.numel() != numel_) {
    throw std::invalid_argument("NVMe offload: param has " + std::to_string(param.numel()) +
                                " elements, the state holds " + std::to_string(numel_));
  }
  run_step(param.data_ptr<float>(), grad.data_ptr<float>(), hyper, bf16);
}

void NvmeAdamW::step(const at::Tensor& grad, const AdamWStep& hyper,
                     const at::Tensor* param_bf16_out) {
  if (!options_.swap_params_) {
    throw std::invalid_argument(
        "NVMe offload: the parameters are not on file (swap_params is off): call "
        "step(param, grad, hyper)");
  }
  if (!grad.defined() || grad.numel() != numel_) {
    throw std::invalid_argument("NVMe offload: grad must have " + std::to_string(numel_) +
                                " elements, got " +
                                std::to_string(grad.defined() ? grad.numel() : 0));
  }
  // The gradient stands in for the parameter in the checks: same dtype, device and size.
  uint16_t* bf16 = detail::check_adamw_args(grad, grad, nullptr, nullptr, hyper, param_bf16_out);
  run_step(nullptr, grad.data_ptr<float>(), hyper, bf16);
}

void NvmeAdamW::run_step(float* p, const float* g, const AdamWStep& hyper, uint16_t* bf16) {
  const auto s = detail::AdamWScalars::from(hyper);
  Io& io = *io_;
  const int64_t chunks = (numel_ + io.chunk - 1) / io.chunk;
  auto io_job = [this, &io](bool write, int64_t chunk, int slot) {
    const int64_t begin = chunk * io.chunk;
    int64_t bytes = std::min(io.chunk, numel_ - begin) * 4;
    if (options_.direct_io_) bytes = round_up(bytes, kDirectAlign);
    return [this, &io, write, begin, bytes, slot] {
      for (int k = 0; k < io.count; ++k) {
        float* buffer = io.buf[slot][k].get();
        if (write) {
          io.files[k]->write(buffer, bytes, begin * 4);
        } else {
          io.files[k]->read(buffer, bytes, begin * 4);
        }
      }
    };
  };
  ChunkBuffers buffers(io.buf, io.count, io.chunk);
  std::future<void> r[3], w[3];  // reads and writes in flight, by buffer slot
  // On an error the buffers must outlive the I/O already queued: wait for all of it first.
  struct Drain {
    std::future<void>* r;
    std::future<void>* w;
    ~Drain() {
      for (int i = 0; i < 3; ++i) {
        if (r[i].valid()) r[i].wait();
        if (w[i].valid()) w[i].wait();
      }
    }
  } drain{r, w};
  r[0] = io.reader.submit(io_job(false, 0, 0));
  for (int64_t i = 0; i < chunks; ++i) {
    const int slot = static_cast<int>(i % 3);
    if (i + 1 < chunks) {
      const int next = static_cast<int>((i + 1) % 3);
      // That slot last held chunk i-2: its write must finish before it is refilled.
      detail::wait_for_io(w[next]);
      r[next] = io.reader.submit(io_job(false, i + 1, next));
    }
    detail::wait_for_io(r[slot]);
    const int64_t begin = i * io.chunk;
    const int64_t len = std::min(io.chunk, numel_ - begin);
    float* param = p ? p + begin : io.buf[slot][2].get();
    detail::adamw_parallel(s, param, g + begin, io.buf[slot][0].get(), io.buf[slot][1].get(),
                           bf16 ? bf16 + begin : nullptr, len);
    w[slot] = io.writer.submit(io_job(true, i, slot));
  }
  for (auto& f : w) detail::wait_for_io(f);
}

// Whole-file copies go through the first buffer (O_DIRECT needs aligned memory); not while a
// step runs.
void NvmeAdamW::copy_state(int k, at::Tensor* out, const at::Tensor* in) const {
  ChunkBuffers buffers(io_->buf, io_->count, io_->chunk);
  float* buffer = io_->buf[0][k].get();
  for (int64_t begin = 0; begin < numel_; begin += io_->chunk) {
    const int64_t len = std::min(io_->chunk, numel_ - begin);
    const int64_t bytes = options_.direct_io_ ? round_up(len * 4, kDirectAlign) : len * 4;
    char* raw = reinterpret_cast<char*>(buffer);
    if (in) {
      std::memcpy(buffer, in->data_ptr<float>() + begin, len * 4);
      std::memset(raw + len * 4, 0, bytes - len * 4);
      io_->files[k]->write(raw, bytes, begin * 4);
    } else {
      io_->files[k]->read(raw, bytes, begin * 4);
      std::memcpy(out->data_ptr<float>() + begin, buffer, len * 4);
    }
  }
}

at::Tensor NvmeAdamW::exp_avg() const {
  auto out = at::empty({numel_}, at::kFloat);
  copy_state(0, &out, nullptr);
  return out;
}

at::Tensor NvmeAdamW::exp_avg_sq() const {
  auto out = at::empty({numel_}, at::kFloat);
  copy_state(1, &out, nullptr);
  return out;
}

void NvmeAdamW::load(const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  const at::Tensor* state[2] = {&exp_avg, &exp_avg_sq};
  const char* names[2] = {"exp_avg", "exp_avg_sq"};
  for (int k = 0; k < 2; ++k) {
    const at::Tensor& t = *state[k];
    if (!t.defined() || t.scalar_type() != at::kFloat || t.numel() != numel_) {
      throw std::invalid_argument(std::string("NVMe offload: load: ") + names[k] +
                                  " must be a Float tensor of " + std::to_string(numel_) +
                                  " elements");
    }
  }
  for (int k = 0; k < 2; ++k) {
    const auto flat = state[k]->to(at::kCPU).contiguous();
    copy_state(k, nullptr, &flat);
  }
}

at::Tensor NvmeAdamW::param() const {
  if (!options_.swap_params_) {
    throw std::invalid_argument("NVMe offload: param(): the parameters are not on file");
  }
  auto out = at::empty({numel_}, at::kFloat);
  copy_state(2, &out, nullptr);
  return out;
}

void NvmeAdamW::load_param(const at::Tensor& param) {
  if (!options_.swap_params_) {
    throw std::invalid_argument("NVMe offload: load_param(): the parameters are not on file");
  }
  if (!param.defined() || param.scalar_type() != at::kFloat || param.numel() != numel_) {
    throw std::invalid_argument("NVMe offload: load_param: param must be a Float tensor of " +
                                std::to_string(numel_) + " elements");
  }
  const auto flat = param.to(at::kCPU).contiguous();
  copy_state(2, nullptr, &flat);
}

}  // namespace shardtrain
