// Text from a trained model: a model rebuilt whole from a trainer checkpoint, and sampling from
// it on one process (`shardtrain generate`). The trainer's own sample at the end of a run uses
// sample_token too.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>

#include "shardtrain/chat_template.h"
#include "shardtrain/model.h"
#include "shardtrain/tokenizer.h"

namespace shardtrain {

struct SampleOptions {
  SampleOptions& tokens(int64_t v) {
    tokens_ = v;
    return *this;
  }
  SampleOptions& temperature(double v) {
    temperature_ = v;
    return *this;
  }
  SampleOptions& top_k(int64_t v) {  // 0: every id
    top_k_ = v;
    return *this;
  }
  SampleOptions& seed(uint64_t v) {
    seed_ = v;
    return *this;
  }
  // Called with the prompt as rendered once the options are checked, then with each piece of
  // generated text as soon as it decodes to whole characters (a token that ends inside a
  // multi-byte character waits for the next), so that a long generation shows as it goes. The
  // pieces concatenate to what generate_text returns.
  SampleOptions& on_text(std::function<void(const std::string&)> v) {
    on_text_ = std::move(v);
    return *this;
  }
  int64_t tokens_ = 64;
  double temperature_ = 0.8;
  int64_t top_k_ = 40;
  uint64_t seed_ = 1234;
  std::function<void(const std::string&)> on_text_;
};

// One id drawn from `logits` [V] (any floating dtype): the first `vocab` ids only (a model's
// vocabulary padded past its tokenizer's has ids nothing decodes), divided by the temperature,
// the top_k largest kept.
int64_t sample_token(at::Tensor logits, int64_t vocab, double temperature, int64_t top_k,
                     at::Generator& generator);

// The model of a checkpoint the trainer wrote, whole on this process, in eval mode: its
// parameters as saved or, for a LoRA run's checkpoint, its adapters on the base the run started
// from (lora.init_from's Hugging Face weights, or the seed's initialization) stored as the run
// stored it. Throws std::invalid_argument naming the checkpoint when it lacks a tensor the model
// needs or a LoRA base it names is gone.
Transformer load_trained_model(const std::string& checkpoint_dir);

// The tokenizer and chat template the run that wrote `checkpoint_dir` used ("" when it did not
// record them: checkpoints written before they were).
std::string checkpoint_tokenizer(const std::string& checkpoint_dir);
std::string checkpoint_chat_template(const std::string& checkpoint_dir);

// Throws std::invalid_argument when a model of `config` does not continue text (a
// masked-language model: BERT), naming its family.
void require_text_generation(const ModelConfig& config);

// Continues `prompt` (require_text_generation first): with `chat_template`, the prompt is a user
// message rendered with the assistant's turn opened and generation stops at a special token (the
// end of the turn); without, the text continues until `tokens` ids or the end-of-text id. Returns
// the prompt (as rendered) followed by the generated text.
std::string generate_text(Transformer& model, const Tokenizer& tokenizer,
                          const ChatTemplate* chat_template, const std::string& prompt,
                          const SampleOptions& options);

}  // namespace shardtrain
