#include <filesystem>
#include <iostream>
#include <limits>

#include "commands.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/generate.h"
#include "shardtrain/hf_tokenizer.h"

namespace fs = std::filesystem;

namespace shardtrain::cli {
namespace {

// "gpt2:DIR" (a run's data.gpt2_dir, as the checkpoint records it), or a tokenizer name or path.
std::unique_ptr<Tokenizer> tokenizer_named(const std::string& name) {
  if (name.rfind("gpt2:", 0) == 0) return make_tokenizer("gpt2", name.substr(5));
  return make_tokenizer(name);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "generate",
      "Continue a prompt with a trained model, on this process: the checkpoint's model (a LoRA "
      "run's adapters on their base), tokenizer and, for a run on chat data, chat template");
  struct GenerateArgs {
    std::string checkpoint;
    std::string prompt;
    int64_t tokens = 64;
    std::string tokenizer;
    std::string chat_template;
    bool no_chat = false;
    double temperature = 0.8;
    int64_t top_k = 40;
    uint64_t seed = 1234;
  };
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("checkpoint", a->checkpoint,
                  "A checkpoint directory, or a checkpoints root (its latest)")
      ->required();
  cmd->add_option("--prompt,-p", a->prompt, "Text to continue (a user message under chat)");
  cmd->add_option("--tokens,-n", a->tokens, "Tokens to generate at most (1 or more)")
      ->check(CLI::Range(int64_t{1}, std::numeric_limits<int64_t>::max()))
      ->capture_default_str();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "gpt2, byte, or a tokenizer.json / model folder (default: the run's)");
  cmd->add_option("--chat-template", a->chat_template,
                  "tokenizer_config.json, chat_template.jinja or model folder (default: the run's "
                  "when it trained on chat data)");
  cmd->add_flag("--no-chat", a->no_chat, "Continue the prompt as plain text, with no template");
  cmd->add_option("--temperature", a->temperature)->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "0: every id; more than the vocabulary: every id")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--seed", a->seed)->capture_default_str();
  cmd->callback([a] {
    std::string dir = a->checkpoint;
    if (!fs::exists(fs::path(dir) / "index.json") && fs::exists(fs::path(dir) / "latest")) {
      dir = resolve_checkpoint(dir, "latest");
    }
    Transformer model = load_trained_model(dir);
    std::string tokenizer_name = a->tokenizer.empty() ? checkpoint_tokenizer(dir) : a->tokenizer;
    if (tokenizer_name.empty()) {
      throw std::invalid_argument("checkpoint '" + dir +
                                  "' does not record its tokenizer: give "
                                  "--tokenizer");
    }
    const std::unique_ptr<Tokenizer> tokenizer = tokenizer_named(tokenizer_name);
    const int64_t vocab = model->config().vocab_size;
    if (static_cast<int64_t>(tokenizer->vocab_size()) > vocab) {
      // Its ids would fall outside the model's embedding.
      const std::string recorded = checkpoint_tokenizer(dir);
      throw std::invalid_argument(
          "--tokenizer " + tokenizer_name + " has a vocabulary of " +
          std::to_string(tokenizer->vocab_size()) + " tokens, more than the model of checkpoint '" +
          dir + "' has (" + std::to_string(vocab) +
          (recorded.empty() ? "" : "; it was trained with tokenizer '" + recorded + "'") + ")");
    }
    std::unique_ptr<ChatTemplate> chat_template;
    const std::string template_path =
        a->chat_template.empty() ? checkpoint_chat_template(dir) : a->chat_template;
    if (!a->no_chat && !template_path.empty()) {
      chat_template = std::make_unique<ChatTemplate>(ChatTemplate::from_model_files(template_path));
    }
    // The prompt (as rendered) at once, then the continuation as it is generated.
    generate_text(model, *tokenizer, chat_template.get(), a->prompt,
                  SampleOptions()
                      .tokens(a->tokens)
                      .temperature(a->temperature)
                      .top_k(a->top_k)
                      .seed(a->seed)
                      .on_text([](const std::string& piece) { std::cout << piece << std::flush; }));
    std::cout << "\n";
  });
}

}  // namespace shardtrain::cli
