#include "parallel/tensor/tp_state.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "shardtrain/tensor_parallel.h"

namespace shardtrain::detail {

std::vector<int64_t> TpLayout::local_shape(int size) const {
  std::vector<int64_t> shape = whole_shape;
  shape[static_cast<size_t>(dim)] /= size;
  return shape;
}

std::vector<std::array<int64_t, 3>> TpLayout::runs(int rank, int size) const {
  std::vector<std::array<int64_t, 3>> out;
  const int64_t rows = whole_shape[0];
  const int64_t cols = whole_shape.size() > 1 ? whole_shape[1] : 1;
  if (dim == 0) {
    const int64_t part_rows = rows / parts;
    const int64_t local_rows = part_rows / size;
    for (int p = 0; p < parts; ++p) {
      out.push_back(
          {p * local_rows * cols, (p * part_rows + rank * local_rows) * cols, local_rows * cols});
    }
  } else {
    const int64_t local_cols = cols / size;
    for (int64_t r = 0; r < rows; ++r) {
      out.push_back({r * local_cols, r * cols + rank * local_cols, local_cols});
    }
  }
  return out;
}

at::Tensor TpState::copy_in(const at::Tensor& x) const {
  return copy_to_tensor_parallel(x, *group);
}

at::Tensor TpState::reduce_out(const at::Tensor& x) const {
  return reduce_from_tensor_parallel(x, *group);
}

at::Tensor TpState::gather_sequence(const at::Tensor& x) const {
  return shardtrain::gather_sequence(x, *group);
}

at::Tensor TpState::reduce_scatter_sequence(const at::Tensor& x) const {
  return shardtrain::reduce_scatter_sequence(x, *group);
}

void TpState::max_across(at::Tensor& x) const {
  all_reduce_tensor_parallel(x, *group, ReduceOp::kMax);
}

void TpState::sum_across(at::Tensor& x) const {
  all_reduce_tensor_parallel(x, *group, ReduceOp::kSum);
}

ParameterInitializer TpState::split_initializer(ParameterInitializer init) const {
  return tensor_parallel_initializer(shared_from_this(), std::move(init));
}

std::shared_ptr<TpState> tp_state(const Transformer& model) {
  return std::static_pointer_cast<TpState>(model->layer_split());
}

const TpLayout* TpState::layout_of(const std::string& tensor_name) const {
  std::string name = tensor_name;
  if (name.rfind("optim.", 0) == 0) {
    name = name.substr(6);
    for (const char* suffix : {".exp_avg_sq", ".exp_avg"}) {
      const std::string s = suffix;
      if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
        name.resize(name.size() - s.size());
        break;
      }
    }
  }
  const auto it = layouts.find(name);
  return it == layouts.end() ? nullptr : &it->second;
}

std::vector<std::array<int64_t, 3>> whole_ranges(const TpLayout& layout, int rank, int size,
                                                 int64_t offset, int64_t numel) {
  std::vector<std::array<int64_t, 3>> out;
  const int64_t end = offset + numel;
  for (const auto& [local, whole, length] : layout.runs(rank, size)) {
    const int64_t lo = std::max(local, offset), hi = std::min(local + length, end);
    if (lo < hi) out.push_back({lo, whole + (lo - local), hi - lo});
  }
  return out;
}

}  // namespace shardtrain::detail
