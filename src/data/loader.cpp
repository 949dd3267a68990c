#include <algorithm>
#include <random>
#include <stdexcept>

#include "shardtrain/data.h"

namespace shardtrain {

namespace {

void check_options(const DataLoaderOptions& o, int dp_rank, int dp_size) {
  if (o.seq_len_ < 1 || o.micro_batch_ < 1 || o.grad_accum_ < 1 || o.eval_sequences_ < 0) {
    throw std::invalid_argument("data loader: seq_len, micro_batch and grad_accum must be >= 1");
  }
  TORCH_CHECK(dp_rank >= 0 && dp_rank < dp_size, "data loader: rank ", dp_rank,
              " outside data-parallel size ", dp_size);
  const DataLoaderOptions::MaskedLm& mlm = o.masked_lm_;
  if (!(mlm.probability >= 0.0 && mlm.probability <= 1.0)) {
    throw std::invalid_argument("data loader: the masking probability must be in [0, 1]");
  }
  if (mlm.probability > 0.0 && (mlm.mask_id < 0 || mlm.random_ids < 1)) {
    throw std::invalid_argument(
        "data loader: masked-language-model batches need a mask id and "
        "a vocabulary to draw random tokens from");
  }
  if (!std::is_sorted(mlm.unmasked.begin(), mlm.unmasked.end())) {
    throw std::invalid_argument("data loader: the ids never masked must be in ascending order");
  }
}

// What masking does to one position of a masked-language-model sequence.
enum class MaskAction { kNone, kMask, kRandom, kKeep };

// The masking of one sequence of `length` tokens, drawn from (seed, key) alone: each position
// chosen with `probability`, then masked (8 in 10), replaced by a random id (1 in 10) or kept;
// a position holding one of the ids never masked is not chosen (its draws are made all the
// same). `random` receives the random ids, in order of their positions.
std::vector<MaskAction> draw_masking(const DataLoaderOptions::MaskedLm& mlm, uint64_t seed,
                                     uint64_t key, const int64_t* tokens, int64_t length,
                                     std::vector<int64_t>* random = nullptr) {
  std::seed_seq seeds{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                      static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32),
                      0x4d4c4du};  // "MLM"
  std::mt19937_64 draw(seeds);
  std::vector<MaskAction> actions(static_cast<size_t>(length), MaskAction::kNone);
  for (int64_t t = 0; t < length; ++t) {
    const double u = static_cast<double>(draw() >> 11) * 0x1.0p-53;  // uniform in [0, 1)
    if (u >= mlm.probability) continue;
    const uint64_t kind = draw() % 10;
    const uint64_t id = draw() % static_cast<uint64_t>(mlm.random_ids);
    if (std::binary_search(mlm.unmasked.begin(), mlm.unmasked.end(), tokens[t])) continue;
    MaskAction& action = actions[static_cast<size_t>(t)];
    action = kind < 8 ? MaskAction::kMask : kind == 8 ? MaskAction::kRandom : MaskAction::kKeep;
    if (action == MaskAction::kRandom && random) random->push_back(static_cast<int64_t>(id));
  }
  return actions;
}

int64_t chosen_positions(const std::vector<MaskAction>& actions) {
  return static_cast<int64_t>(std::count_if(actions.begin(), actions.end(),
                                            [](MaskAction a) { return a != MaskAction::kNone; }));
}

// Row i of `batch` masked by the draws of keys[i]: inputs changed, targets the original tokens at
// the chosen positions and kIgnoreIndex elsewhere. Returns the positions chosen.
int64_t mask_batch(Batch& batch, const DataLoaderOptions& options,
                   const std::vector<uint64_t>& keys) {
  const DataLoaderOptions::MaskedLm& mlm = options.masked_lm_;
  const int64_t length = batch.inputs.size(1);
  batch.inputs = batch.inputs.contiguous();
  batch.targets = at::full(batch.inputs.sizes(), kIgnoreIndex, at::kLong);
  int64_t* in = batch.inputs.data_ptr<int64_t>();
  int64_t* out = batch.targets.data_ptr<int64_t>();
  int64_t chosen = 0;
  for (size_t row = 0; row < keys.size(); ++row) {
    int64_t* row_in = in + static_cast<int64_t>(row) * length;
    std::vector<int64_t> random;
    const auto actions = draw_masking(mlm, options.seed_, keys[row], row_in, length, &random);
    chosen += chosen_positions(actions);
    auto next_random = random.begin();
    for (int64_t t = 0; t < length; ++t) {
      const MaskAction action = actions[static_cast<size_t>(t)];
      if (action == MaskAction::kNone) continue;
      out[static_cast<int64_t>(row) * length + t] = row_in[t];
      if (action == MaskAction::kMask) row_in[t] = mlm.mask_id;
      if (action == MaskAction::kRandom) row_in[t] = *next_random++;
    }
  }
  return chosen;
}

// The masking key of a held-out sequence: apart from every training position's.
uint64_t eval_key(int64_t sequence) { return ~static_cast<uint64_t>(sequence); }

}  // namespace

DataLoader::DataLoader(std::shared_ptr<TokenShard> shard, DataLoaderOptions options, int dp_rank,
                       int dp_size)
    : shard_(std::move(shard)), options_(options), dp_rank_(dp_rank), dp_size_(dp_size) {
  check_options(options_, dp_rank, dp_size);
  // Each sequence needs seq_len + 1 tokens (targets are shifted by one); windows don't overlap.
  set_train_sequences((shard_->size() - 1) / options_.seq_len_,
                      "corpus '" + shard_->path() +
                          "' is too small: " + std::to_string(shard_->size()) + " tokens make");
}

DataLoader::DataLoader(std::shared_ptr<SampleShard> samples, DataLoaderOptions options, int dp_rank,
                       int dp_size)
    : samples_(std::move(samples)), options_(options), dp_rank_(dp_rank), dp_size_(dp_size) {
  check_options(options_, dp_rank, dp_size);
  if (options_.masked_lm_.probability > 0.0) {
    throw std::invalid_argument(
        "data loader: masked-language-model batches are made of a plain corpus, not of "
        "instruction samples");
  }
  pack_rows();
  set_train_sequences(packing_.rows, "data '" + samples_->path() + "' is too small: " +
                                         std::to_string(packing_.samples) + " samples (" +
                                         std::to_string(packing_.dropped) + " dropped) fill");
}

void DataLoader::set_train_sequences(int64_t total, const std::string& source) {
  train_sequences_ = total - options_.eval_sequences_;
  if (train_sequences_ < 1) {
    throw std::invalid_argument(source + " " + std::to_string(total) + " sequences of seq_len " +
                                std::to_string(options_.seq_len_) + ", and " +
                                std::to_string(options_.eval_sequences_) +
                                " are held out for evaluation");
  }
}

int64_t DataLoader::global_batch_size() const {
  return options_.micro_batch_ * options_.grad_accum_ * dp_size_;
}

int64_t DataLoader::sequence_at(int64_t position) const {
  const int64_t epoch = position / train_sequences_;
  if (epoch != cached_epoch_) {
    // Fisher-Yates with mt19937_64, whose output is fixed by the standard; std::shuffle is
    // not, and the order must be identical on every platform and rank.
    permutation_.resize(train_sequences_);
    for (int64_t i = 0; i < train_sequences_; ++i) permutation_[i] = i;
    std::mt19937_64 rng(options_.seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch));
    for (int64_t i = train_sequences_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
      std::swap(permutation_[i], permutation_[j]);
    }
    cached_epoch_ = epoch;
  }
  return permutation_[position % train_sequences_];
}

Batch DataLoader::gather(const std::vector<int64_t>& sequences) const {
  if (samples_) return gather_rows(sequences);
  const int64_t len = options_.seq_len_;
  at::Tensor tokens = at::empty({static_cast<int64_t>(sequences.size()), len + 1}, at::kLong);
  for (size_t i = 0; i < sequences.size(); ++i) {
    tokens[static_cast<int64_t>(i)].copy_(shard_->read(sequences[i] * len, len + 1));
  }
  Batch batch;
  batch.inputs = tokens.narrow(1, 0, len).contiguous();
  batch.targets = tokens.narrow(1, 1, len).contiguous();
  return batch;
}

Batch DataLoader::micro_batch(int64_t samples_before_step, int micro_step) const {
  TORCH_CHECK(micro_step >= 0 && micro_step < options_.grad_accum_, "micro-step ", micro_step,
              " outside grad_accum ", options_.grad_accum_);
  const int64_t m = options_.micro_batch_;
  const int64_t first = samples_before_step + micro_step * m * dp_size_ + dp_rank_ * m;
  std::vector<int64_t> sequences;
  for (int64_t i = 0; i < m; ++i) sequences.push_back(sequence_at(first + i));
  Batch batch = gather(sequences);
  if (options_.masked_lm_.probability > 0.0) {
    // Each row masked by its position in training; the loss the mean over the global batch's
    // chosen positions, however they fall on ranks and micro-batches.
    std::vector<uint64_t> keys;
    for (int64_t i = 0; i < m; ++i) keys.push_back(static_cast<uint64_t>(first + i));
    mask_batch(batch, options_, keys);
    if (masked_step_ != samples_before_step) {  // once per step, not per micro-batch
      masked_total_ = 0;
      const int64_t len = options_.seq_len_;
      for (int64_t p = samples_before_step; p < samples_before_step + global_batch_size(); ++p) {
        const at::Tensor tokens = shard_->read(sequence_at(p) * len, len).contiguous();
        masked_total_ += chosen_positions(draw_masking(options_.masked_lm_, options_.seed_,
                                                       static_cast<uint64_t>(p),
                                                       tokens.data_ptr<int64_t>(), len));
      }
      masked_step_ = samples_before_step;
    }
    batch.loss_divisor = static_cast<double>(std::max<int64_t>(masked_total_, 1)) /
                         static_cast<double>(options_.grad_accum_ * dp_size_);
  }
  if (samples_) {
    // The global batch's loss tokens, shared by its grad_accum x dp micro-batches (at least one
    // token, so that a batch of prompts alone gives loss 0 rather than 0 / 0).
    const int64_t global = loss_tokens_of(samples_before_step, global_batch_size());
    batch.loss_divisor = static_cast<double>(std::max<int64_t>(global, 1)) /
                         static_cast<double>(options_.grad_accum_ * dp_size_);
  }
  return batch;
}

int64_t DataLoader::loss_tokens_of(int64_t first_position, int64_t count) const {
  int64_t total = 0;
  for (int64_t p = first_position; p < first_position + count; ++p) {
    total += row_loss_[sequence_at(p)];
  }
  return total;
}

Batch DataLoader::eval_batch(int64_t index) const {
  TORCH_CHECK(options_.eval_sequences_ > 0,
              "data loader: no sequences are held out for evaluation");
  const int64_t m = options_.micro_batch_;
  std::vector<int64_t> sequences;
  int64_t loss_tokens = 0;
  for (int64_t i = 0; i < m; ++i) {
    sequences.push_back(train_sequences_ + (index * m + i) % options_.eval_sequences_);
    if (samples_) loss_tokens += row_loss_[sequences.back()];
  }
  Batch batch = gather(sequences);
  if (samples_) batch.loss_divisor = static_cast<double>(std::max<int64_t>(loss_tokens, 1));
  if (options_.masked_lm_.probability > 0.0) {
    std::vector<uint64_t> keys;
    for (const int64_t sequence : sequences) keys.push_back(eval_key(sequence));
    const int64_t chosen = mask_batch(batch, options_, keys);
    batch.loss_divisor = static_cast<double>(std::max<int64_t>(chosen, 1));
  }
  return batch;
}

}  // namespace shardtrain
