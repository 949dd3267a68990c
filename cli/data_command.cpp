#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "shardtrain/data.h"
#include "shardtrain/hf_tokenizer.h"
#include "shardtrain/samples.h"

namespace shardtrain::cli {
namespace {

// The template of --chat-template, else of the tokenizer's folder.
ChatTemplate chat_template_of(const std::string& chat_template, const std::string& tokenizer) {
  if (!chat_template.empty()) return ChatTemplate::from_model_files(chat_template);
  if (tokenizer == "gpt2" || tokenizer == "byte") {
    throw std::invalid_argument("the " + tokenizer +
                                " tokenizer has no chat template: give "
                                "--chat-template (a tokenizer_config.json, chat_template.jinja "
                                "or model folder)");
  }
  return ChatTemplate::from_model_files(tokenizer);
}

void add_prepare(CLI::App& data) {
  auto* prepare = data.add_subcommand(
      "prepare",
      "Tokenize a corpus once: text files (or every file in a folder; .jsonl files hold "
      "{\"text\": ...} lines) into one token shard, each document followed by the end-of-text "
      "token; or, with --format chat or prompt_completion, JSONL samples into a sample shard "
      "with the loss flag of each token");
  // Every value an option writes into lives in `a`, which the callback owns (see ckpt_command).
  struct PrepareArgs {
    std::vector<std::string> inputs;
    std::string out;
    std::string tokenizer = "gpt2";
    std::string gpt2_dir;
    std::string format = "text";
    std::string chat_template;
  };
  auto a = std::make_shared<PrepareArgs>();
  prepare->add_option("--corpus", a->inputs, "Text or JSONL files, or folders")
      ->required()
      ->take_all();
  prepare->add_option("--out,-o", a->out, "Shard to write")->required();
  prepare
      ->add_option("--tokenizer", a->tokenizer,
                   "gpt2, byte, or a tokenizer.json file or model folder")
      ->capture_default_str();
  prepare->add_option("--gpt2-dir", a->gpt2_dir,
                      "Folder with encoder.json and vocab.bpe (default: set-up's copy)");
  prepare->add_option("--format", a->format, "text, chat or prompt_completion")
      ->capture_default_str()
      ->check(CLI::IsMember({"text", "chat", "prompt_completion"}));
  prepare->add_option("--chat-template", a->chat_template,
                      "tokenizer_config.json, chat_template.jinja or model folder (default: the "
                      "tokenizer's folder)");
  prepare->callback([a] {
    const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(a->tokenizer, a->gpt2_dir);
    const DataFormat format = data_format_from_string(a->format);
    if (format == DataFormat::kText) {
      const int64_t tokens = prepare_token_shard(a->inputs, *tokenizer, a->out);
      std::cout << "wrote " << tokens << " tokens (" << tokenizer->name() << ", vocabulary "
                << tokenizer->vocab_size() << ") to " << a->out << "\n";
      return;
    }
    std::unique_ptr<ChatTemplate> chat_template;
    if (format == DataFormat::kChat) {
      chat_template =
          std::make_unique<ChatTemplate>(chat_template_of(a->chat_template, a->tokenizer));
    }
    const SampleStats stats =
        prepare_sample_shard(a->inputs, format, *tokenizer, chat_template.get(), a->out);
    std::cout << "wrote " << stats.samples << " samples, " << stats.tokens << " tokens ("
              << stats.loss_tokens << " with a loss, " << stats.tokens - stats.loss_tokens
              << " masked) to " << a->out << "\n";
  });
}

void add_tokenize(CLI::App& data) {
  auto* tokenize = data.add_subcommand(
      "tokenize",
      "Print the token ids of each line of standard input as one JSON array per line (the "
      "line's text without its newline; no BOS/EOS unless --add-special); with --chat FILE.jsonl, "
      "each conversation's text as the chat template renders it, one JSON string per line");
  struct TokenizeArgs {
    std::string tokenizer;
    std::string gpt2_dir;
    bool add_special = false;
    std::string chat;
    std::string chat_template;
    bool generation_prompt = false;
  };
  auto a = std::make_shared<TokenizeArgs>();
  tokenize
      ->add_option("--tokenizer", a->tokenizer,
                   "gpt2, byte, or a tokenizer.json file or model folder")
      ->required();
  tokenize->add_option("--gpt2-dir", a->gpt2_dir, "Folder with encoder.json and vocab.bpe");
  tokenize->add_flag("--add-special", a->add_special,
                     "Add what the tokenizer puts around a sequence (Llama's BOS)");
  tokenize->add_option("--chat", a->chat,
                       "JSONL of {\"messages\": [...]}: print the rendered template instead");
  tokenize->add_option("--chat-template", a->chat_template,
                       "tokenizer_config.json, chat_template.jinja or model folder (default: the "
                       "tokenizer's folder)");
  tokenize->add_flag("--add-generation-prompt", a->generation_prompt,
                     "With --chat: end with what opens the assistant's reply");
  tokenize->callback([a] {
    if (!a->chat.empty()) {
      const ChatTemplate chat_template = chat_template_of(a->chat_template, a->tokenizer);
      std::ifstream in(a->chat);
      if (!in) throw std::invalid_argument("--chat: '" + a->chat + "' cannot be read");
      std::string line;
      for (int64_t number = 1; std::getline(in, line); ++number) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        nlohmann::json json;
        try {
          json = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
          throw std::invalid_argument("'" + a->chat + "' line " + std::to_string(number) +
                                      " is not JSON (" + e.what() + ")");
        }
        if (!json.is_object() || !json.contains("messages")) {
          throw std::invalid_argument("'" + a->chat + "' line " + std::to_string(number) +
                                      " has no \"messages\"");
        }
        const std::string text =
            chat_template.render_json(json.at("messages").dump(), a->generation_prompt);
        std::cout << nlohmann::json(text).dump(-1, ' ', false,
                                               nlohmann::json::error_handler_t::replace)
                  << "\n";
      }
      return;
    }
    const std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(a->tokenizer, a->gpt2_dir);
    std::string line;
    while (std::getline(std::cin, line)) {
      std::cout << nlohmann::json(tokenizer->encode(line, a->add_special)).dump() << "\n";
    }
  });
}

}  // namespace

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Data tools");
  data->require_subcommand(1);
  add_prepare(*data);
  add_tokenize(*data);
}

}  // namespace shardtrain::cli
