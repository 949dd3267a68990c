#include "model/context_split.h"

#include <stdexcept>
#include <string>

namespace shardtrain::detail {

at::Tensor context_positions(int64_t length, int rank, int size) {
  if (length % (2 * size) != 0) {
    throw std::invalid_argument("a sequence of " + std::to_string(length) +
                                " tokens does not split into 2 x " + std::to_string(size) +
                                " equal chunks");
  }
  const int64_t chunk = length / (2 * size);
  return at::cat({at::arange(rank * chunk, (rank + 1) * chunk, at::kLong),
                  at::arange((2 * size - 1 - rank) * chunk, (2 * size - rank) * chunk, at::kLong)});
}

}  // namespace shardtrain::detail
