// Parameter memory that comes and goes while the tensor stays (deferred construction, FSDP's
// gathered units), and the counter-based random numbers of the model's initialization.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "shardtrain/model.h"

namespace shardtrain::detail {

// Gives the memory of `tensor`'s storage back, keeping the storage object (and every view of it,
// including the ones autograd saved for backward); restore_storage allocates it again.
void release_storage(const at::Tensor& tensor);
void restore_storage(const at::Tensor& tensor, int64_t nbytes);
// Like release_storage, but hands the memory to the caller (for a write that frees it when done).
std::shared_ptr<at::DataPtr> take_storage(const at::Tensor& tensor);

// Fills every parameter of `module` through `init` (allocating the ones without memory), or with
// `only_missing` just the ones without memory.
void initialize_parameters(torch::nn::Module& module, const ParameterInitializer& init,
                           bool only_missing);

// The key of one parameter's stream of numbers: its name mixed into the seed.
uint64_t init_stream_key(uint64_t seed, const std::string& name);
// out[j] = mean + std * z(key, begin + j), z standard normal: Box-Muller on the pair
// (index / 2) of counter-based uniforms, so any element range comes out the same whoever fills
// it. Computed in double, stored in out's dtype.
void fill_normal(uint64_t key, int64_t begin, double mean, double std, at::Tensor out);
// out[j] uniform in [low, high) from the counter-based stream `key` at index begin + j.
void fill_uniform(uint64_t key, int64_t begin, double low, double high, at::Tensor out);

}  // namespace shardtrain::detail
