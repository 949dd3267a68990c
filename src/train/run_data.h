// The run's data: the tokenizer and chat template data.* names (or model.init_from's), and
// data.corpus as a token shard (data.format "text") or a sample shard (instruction data),
// tokenized into RUN_DIR once and reused while nothing it was made from changed.
#pragma once

#include <memory>
#include <string>

#include "shardtrain/chat_template.h"
#include "shardtrain/config.h"
#include "shardtrain/data.h"
#include "shardtrain/samples.h"
#include "shardtrain/tokenizer.h"

namespace shardtrain::detail {

// data.tokenizer; unset, model.init_from's tokenizer.json when that folder has one, else "byte".
std::string tokenizer_source(const TrainConfig& config);
std::unique_ptr<Tokenizer> make_tokenizer(const TrainConfig& config);
// tokenizer_source() as a path that stays valid elsewhere: absolute for a tokenizer.json or model
// folder, else "byte" or "gpt2" (with data.gpt2_dir's files, absolute, after a colon).
std::string tokenizer_path(const TrainConfig& config);

// data.chat_template, or the template of the tokenizer's folder when it has one; null when there
// is none. Throws std::invalid_argument when data.format is "chat" and there is none, or when the
// template cannot be parsed (naming the file).
std::unique_ptr<ChatTemplate> make_chat_template(const TrainConfig& config);

struct TrainingData {
  std::shared_ptr<TokenShard> tokens;    // data.format "text"
  std::shared_ptr<SampleShard> samples;  // "chat", "prompt_completion"
  bool defined() const { return tokens || samples; }
  const std::string& path() const { return tokens ? tokens->path() : samples->path(); }
  uint64_t vocab_size() const {
    return tokens ? tokens->header().vocab_size : samples->vocab_size();
  }
  // "N tokens of 'path'", or the samples and their loss tokens.
  std::string describe() const;
};

// data.corpus when it is one prepared shard of the format's kind (opened and its header
// checked); otherwise nothing, after checking that every input exists. Writes nothing.
TrainingData open_prepared_data(const TrainConfig& config);

// data.corpus tokenized in memory, by rank 0 before the run directory is touched, so that bad
// data (a malformed JSONL line, a template that raises, nothing to learn) stops the run with
// nothing written. Nothing is tokenized when RUN_DIR/corpus.tokens or RUN_DIR/samples.bin was
// made from the same inputs (paths and modification times), tokenizer, template and format and
// stays where it is (`dir_kept`: the run directory is not moved aside).
struct TokenizedData {
  bool current = false;         // RUN_DIR's shard is still what the config makes
  std::vector<int32_t> tokens;  // data.format "text"
  TokenizedSamples samples;     // the other formats
  std::string made_from;        // JSON: what it was made from
};
TokenizedData tokenize_data(const TrainConfig& config, const Tokenizer& tokenizer,
                            const ChatTemplate* chat_template, bool dir_kept);

// Rank 0, once run.dir exists: writes the shard tokenize_data() made (with its description) and
// opens it. The other ranks, after it: open_data().
TrainingData store_data(const TrainConfig& config, const TokenizedData& tokenized,
                        int64_t vocab_size);
TrainingData open_data(const TrainConfig& config);

// A resume from `checkpoint` must use the tokenizer it was trained with (the one index.json's
// metadata names; the same tokenizer.json files read from another folder are the same): throws
// std::invalid_argument naming both otherwise. Checkpoints that name none pass.
void check_resume_tokenizer(const std::string& checkpoint, const Tokenizer& tokenizer);

// The mask token of a masked-language model trained with `tokenizer`: its "[MASK]" (BERT's
// WordPiece) or "<mask>" (RoBERTa's) token, else the first id past its vocabulary (the model's
// vocabulary then has one more row).
int64_t mask_token_id(const Tokenizer& tokenizer);

// The loader over the data with the run's batch settings; padding is the end-of-text id. A
// bidirectional model's batches are masked (train.mlm_probability), random replacements drawn
// from the tokenizer's ids.
std::unique_ptr<DataLoader> make_loader(const TrainConfig& config, const TrainingData& data,
                                        const Tokenizer& tokenizer, int dp_rank, int dp_size);

}  // namespace shardtrain::detail
