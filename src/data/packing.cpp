// Instruction samples packed into the loader's rows, and a batch of rows: inputs and targets
// shifted within each sample, positions restarting per sample, padding without a loss.
#include <random>
#include <stdexcept>

#include "shardtrain/data.h"

namespace shardtrain {

void DataLoader::pack_rows() {
  const int64_t capacity = options_.seq_len_;  // target positions per row
  const int64_t count = samples_->num_samples();
  packing_.samples = count;
  // One shuffle before packing, fixed by the seed alone, so that a row holds samples from all
  // over the data rather than neighbours of one file; rows are shuffled again per epoch.
  std::vector<int64_t> order(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) order[i] = i;
  std::mt19937_64 rng(options_.seed_ * 0x9E3779B97F4A7C15ull ^ 0x5A3D1E);
  for (int64_t i = count - 1; i > 0; --i) {
    std::swap(order[i], order[static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1))]);
  }
  int64_t used = capacity;  // of the row being filled; "full" before the first
  for (const int64_t sample : order) {
    int64_t tokens = samples_->length(sample);
    if (tokens < 2) {  // nothing to predict
      ++packing_.dropped;
      continue;
    }
    if (tokens - 1 > capacity) {
      if (options_.drop_overlong_) {
        ++packing_.dropped;
        continue;
      }
      ++packing_.truncated;
      tokens = capacity + 1;
    }
    if (!options_.packing_ || used + tokens - 1 > capacity) {
      if (!row_begin_.empty()) packing_.padding += capacity - used;
      row_begin_.push_back(static_cast<int64_t>(pieces_.size()));
      row_loss_.push_back(0);
      used = 0;
    }
    pieces_.push_back({sample, tokens});
    used += tokens - 1;
    // The targets are tokens [1, tokens) of the sample.
    const int64_t loss = samples_->loss_tokens(sample, 1, tokens - 1);
    row_loss_.back() += loss;
    packing_.loss_tokens += loss;
  }
  if (!row_begin_.empty()) packing_.padding += capacity - used;
  packing_.rows = static_cast<int64_t>(row_begin_.size());
  row_begin_.push_back(static_cast<int64_t>(pieces_.size()));
}

Batch DataLoader::gather_rows(const std::vector<int64_t>& rows) const {
  const int64_t len = options_.seq_len_;
  const auto batch = static_cast<int64_t>(rows.size());
  at::Tensor inputs = at::full({batch, len}, options_.pad_id_, at::kLong);
  at::Tensor targets = at::full({batch, len}, kIgnoreIndex, at::kLong);
  at::Tensor positions = at::zeros({batch, len}, at::kLong);
  at::Tensor segments = at::full({batch, len}, -1, at::kLong);  // -1: padding
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* out = targets.data_ptr<int64_t>();
  int64_t* position = positions.data_ptr<int64_t>();
  int64_t* segment = segments.data_ptr<int64_t>();
  std::vector<int64_t> ids;
  std::vector<uint8_t> loss;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t row = rows[b];
    int64_t at = b * len;
    for (int64_t p = row_begin_[row]; p < row_begin_[row + 1]; ++p) {
      const RowPiece& piece = pieces_[p];
      ids.resize(piece.tokens);
      loss.resize(piece.tokens);
      samples_->read(piece.sample, 0, piece.tokens, ids.data(), loss.data());
      for (int64_t j = 0; j + 1 < piece.tokens; ++j, ++at) {
        in[at] = ids[j];
        out[at] = loss[j + 1] ? ids[j + 1] : kIgnoreIndex;
        position[at] = j;
        segment[at] = p - row_begin_[row];
      }
    }
  }
  Batch result;
  result.inputs = inputs;
  result.targets = targets;
  // One sample per row needs no layout: its positions start at 0 and the padding after it is
  // never attended to by a causal query before it.
  if (options_.packing_) result.layout = SequenceLayout{positions, segments};
  return result;
}

}  // namespace shardtrain
