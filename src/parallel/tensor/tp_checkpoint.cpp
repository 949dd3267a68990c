// Split tensors in checkpoints: written and read as ranges of the whole tensor, so a checkpoint
// saved at one tensor-parallel size loads at any other, or with none.
#include "parallel/tensor/tp_state.h"

namespace shardtrain::detail {

std::vector<int64_t> whole_shape(const TpState* tp, const std::string& name,
                                 at::IntArrayRef local) {
  const TpLayout* layout = tp ? tp->layout_of(name) : nullptr;
  return layout ? layout->whole_shape : local.vec();
}

std::vector<FlatSlice> whole_slices(const TpState* tp, const FlatSlice& local) {
  const TpLayout* layout = tp ? tp->layout_of(local.name) : nullptr;
  if (!layout) return {local};
  std::vector<FlatSlice> out;
  for (const auto& [at_local, at_whole, length] :
       whole_ranges(*layout, tp->rank(), tp->size(), local.offset, local.data.numel())) {
    out.push_back({local.name, at_whole, local.data.narrow(0, at_local - local.offset, length)});
  }
  return out;
}

void read_local_into(const ShardedCheckpointReader& reader, const TpState* tp,
                     const std::string& name, int64_t offset, at::Tensor out) {
  const TpLayout* layout = tp ? tp->layout_of(name) : nullptr;
  if (!layout) return reader.read_flat_into(name, offset, out);
  for (const auto& [at_local, at_whole, length] :
       whole_ranges(*layout, tp->rank(), tp->size(), offset, out.numel())) {
    reader.read_flat_into(name, at_whole, out.narrow(0, at_local - offset, length));
  }
}

}  // namespace shardtrain::detail
