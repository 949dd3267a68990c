// Token shards (a binary file of token ids with a small header), the tool that writes them from
// a text corpus, and the loader that cuts them into deterministic global batches.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/model.h"
#include "shardtrain/samples.h"
#include "shardtrain/tokenizer.h"

namespace shardtrain {
namespace detail {
class MappedFile;
}

// Layout of a token shard, little-endian:
//   bytes 0-7   magic "STTOKENS"
//   bytes 8-11  uint32 format version (1)
//   bytes 12-15 uint32 bytes per token (2 when the vocabulary fits in 16 bits, else 4)
//   bytes 16-23 uint64 number of tokens
//   bytes 24-31 uint64 vocabulary size of the tokenizer that wrote it
//   bytes 32-   the tokens
struct TokenShardHeader {
  uint32_t version = 1;
  uint32_t token_bytes = 2;
  uint64_t num_tokens = 0;
  uint64_t vocab_size = 0;
};
constexpr size_t kTokenShardHeaderBytes = 32;

// Writes `tokens` as a shard at `path`, atomically (a temporary file renamed into place).
void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t vocab_size);

// Tokenizes the text files (or every regular file inside a directory, in name order) and
// writes one shard; each file is one document (each line of a .jsonl file, {"text": ...}),
// tokenized with what the tokenizer adds before a sequence (encode(text, true): Llama's BOS)
// and followed by the end-of-text token. Returns the number of tokens. Throws
// std::invalid_argument naming a missing or unreadable input, or the file and line of a .jsonl
// line that is not JSON or has no string "text".
int64_t prepare_token_shard(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                            const std::string& out_path);
// The tokens prepare_token_shard() writes, in memory (nothing is written).
std::vector<int32_t> tokenize_corpus(const std::vector<std::string>& inputs,
                                     const Tokenizer& tokenizer);

// A shard mapped read-only into memory. Opening checks the magic, the version and that the file
// holds exactly the tokens the header announces; errors name the file and what is wrong.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const TokenShardHeader& header() const { return header_; }
  int64_t size() const { return static_cast<int64_t>(header_.num_tokens); }
  // Tokens [begin, begin + count) as int64, copied out of the mapping.
  at::Tensor read(int64_t begin, int64_t count) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  TokenShardHeader header_;
  std::unique_ptr<detail::MappedFile> file_;
  const unsigned char* data_ = nullptr;  // the whole mapping, header included
};

// Options of the loader, LibTorch style.
struct DataLoaderOptions {
  DataLoaderOptions& seq_len(int64_t v) {
    seq_len_ = v;
    return *this;
  }
  DataLoaderOptions& micro_batch(int64_t v) {
    micro_batch_ = v;
    return *this;
  }
  DataLoaderOptions& grad_accum(int64_t v) {
    grad_accum_ = v;
    return *this;
  }
  DataLoaderOptions& seed(uint64_t v) {
    seed_ = v;
    return *this;
  }
  // Sequences at the end of the shard kept out of training for evaluation.
  DataLoaderOptions& eval_sequences(int64_t v) {
    eval_sequences_ = v;
    return *this;
  }
  // Instruction samples: several per row (true), or one per row padded to seq_len (false).
  DataLoaderOptions& packing(bool v) {
    packing_ = v;
    return *this;
  }
  // Instruction samples longer than seq_len + 1 tokens: dropped (true) or cut to that (false).
  DataLoaderOptions& drop_overlong(bool v) {
    drop_overlong_ = v;
    return *this;
  }
  // The input id of padding positions (their targets are kIgnoreIndex); the end-of-text id.
  DataLoaderOptions& pad_id(int64_t v) {
    pad_id_ = v;
    return *this;
  }

  // Masked-language-model batches (a bidirectional model, over a token shard): each sequence's
  // inputs are its own seq_len tokens, of which every position is chosen with `probability`
  // (never one holding an id of `unmasked`, the tokenizer's special tokens), and a chosen one
  // becomes `mask_id` (80%), a random id in [0, random_ids) (10%) or stays (10%); targets are
  // the original tokens at the chosen positions and kIgnoreIndex elsewhere. The draws are a
  // function of (seed, the sample's position in training) alone, so any rank, world size or
  // resume masks a sequence alike; the loss divisor makes a step's loss the mean over the global
  // batch's chosen positions. probability 0: next-token batches.
  struct MaskedLm {
    double probability = 0.0;
    int64_t mask_id = -1;
    int64_t random_ids = 0;
    std::vector<int64_t> unmasked;  // ascending
  };
  DataLoaderOptions& masked_lm(MaskedLm v) {
    masked_lm_ = v;
    return *this;
  }

  int64_t seq_len_ = 128;
  int64_t micro_batch_ = 8;
  int64_t grad_accum_ = 1;
  uint64_t seed_ = 0;
  int64_t eval_sequences_ = 0;
  bool packing_ = true;
  bool drop_overlong_ = false;
  int64_t pad_id_ = 0;
  MaskedLm masked_lm_;
};

struct Batch {
  at::Tensor inputs;  // [micro_batch, seq_len] int64
  // Inputs shifted by one token; kIgnoreIndex (model.h) where no loss is taken (a prompt token,
  // padding). Masked-language-model batches: the original tokens at the chosen positions.
  at::Tensor targets;
  // Packed instruction samples: each token's position in its sample and its sample (undefined
  // for a plain corpus and for one sample per row).
  SequenceLayout layout;
  // 0: the loss is the mean over the micro-batch's targets (a plain corpus: every token counts
  // and every micro-batch has as many). Otherwise the sum over the targets that carry a loss,
  // divided by this: the global batch's loss tokens / (grad_accum x data-parallel size) for a
  // training micro-batch, the batch's own for evaluation, so that a step's loss is the mean
  // over every loss token of the global batch however they are spread over ranks.
  double loss_divisor = 0.0;
};

// What packing the instruction samples into rows made of them (DataLoader::packing_stats()).
struct PackingStats {
  int64_t samples = 0;    // in the shard
  int64_t rows = 0;       // sequences of seq_len the samples fill
  int64_t truncated = 0;  // longer than seq_len + 1 tokens, cut
  int64_t dropped = 0;    // longer, left out (drop_overlong), or of fewer than 2 tokens
  int64_t loss_tokens = 0;
  int64_t padding = 0;  // positions of the rows no sample fills
};

// Cuts the shard into non-overlapping sequences of seq_len + 1 tokens and walks them in an
// order shuffled per epoch from (seed, epoch). Sample position p (counted from the start of
// training) is sequence perm_{p / N}[p % N]. Step s consumes the global batch of
// B = micro_batch x grad_accum x dp_size positions starting at `samples_before_step`; rank r
// takes, at micro-step a, positions a*(micro_batch*dp_size) + r*micro_batch + [0, micro_batch).
// So the global batch is the same sequences for any dp size, and ranks are disjoint.
// The loader holds no position of its own: resuming means passing the saved sample count.
//
// Over a sample shard (instruction data) the sequences are rows: the samples, in an order
// shuffled once from the seed, packed greedily into rows of seq_len target positions (a sample
// whose seq_len + 1 tokens do not fit in what is left of a row starts the next one; a sample is
// never split), or one sample per row. Each sample's inputs and targets are shifted within the
// sample only, its positions restart at 0, and the rest of a row is padding without a loss. The
// rows then play the role of the sequences above: the global batch of a step is the same rows
// at any dp size, and the held-out rows are the last ones.
class DataLoader {
 public:
  DataLoader(std::shared_ptr<TokenShard> shard, DataLoaderOptions options, int dp_rank = 0,
             int dp_size = 1);
  DataLoader(std::shared_ptr<SampleShard> samples, DataLoaderOptions options, int dp_rank = 0,
             int dp_size = 1);
  // Over a sample shard: what packing made of it; all zero over a token shard.
  const PackingStats& packing_stats() const { return packing_; }

  // Micro-batch `micro_step` (0 .. grad_accum-1) of the step that starts at sample position
  // `samples_before_step`.
  Batch micro_batch(int64_t samples_before_step, int micro_step) const;
  // Held-out sequences [index*micro_batch, ...) for evaluation (same on every rank).
  Batch eval_batch(int64_t index) const;

  int64_t global_batch_size() const;  // sequences per step over all ranks
  int64_t train_sequences() const { return train_sequences_; }
  int64_t eval_sequences() const { return options_.eval_sequences_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  // Sequence index at sample position p.
  int64_t sequence_at(int64_t position) const;
  Batch gather(const std::vector<int64_t>& sequences) const;
  void set_train_sequences(int64_t total, const std::string& source);
  // Over a sample shard: the rows, and one row's tokens, targets and layout.
  void pack_rows();
  Batch gather_rows(const std::vector<int64_t>& rows) const;
  int64_t loss_tokens_of(int64_t first_position, int64_t count) const;

  struct RowPiece {
    int64_t sample;
    int64_t tokens;  // of the sample in the row (fewer when cut)
  };
  std::shared_ptr<TokenShard> shard_;
  std::shared_ptr<SampleShard> samples_;
  std::vector<RowPiece> pieces_;    // every row's samples, row after row
  std::vector<int64_t> row_begin_;  // row r's pieces: [row_begin_[r], row_begin_[r + 1])
  std::vector<int64_t> row_loss_;   // loss tokens of each row
  // Masked-language-model batches: the global batch's chosen positions, counted once per step
  // (the step's first sample position; -1: none yet).
  mutable int64_t masked_step_ = -1;
  mutable int64_t masked_total_ = 0;
  PackingStats packing_;
  DataLoaderOptions options_;
  int dp_rank_;
  int dp_size_;
  int64_t train_sequences_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> permutation_;
};

}  // namespace shardtrain
