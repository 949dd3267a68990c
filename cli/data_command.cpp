#include <filesystem>
#include <iostream>

#include "commands.h"
#include "shardtrain/data.h"

namespace shardtrain::cli {

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Data tools");
  data->require_subcommand(1);
  auto* prepare = data->add_subcommand(
      "prepare",
      "Tokenize text files (or every file in a folder) into one token shard; each file is one "
      "document followed by the end-of-text token");
  // Every value an option writes into lives in `a`, which the callback owns (see ckpt_command).
  struct PrepareArgs {
    std::vector<std::string> inputs;
    std::string out;
    std::string tokenizer = "gpt2";
    std::string gpt2_dir;
  };
  auto a = std::make_shared<PrepareArgs>();
  prepare->add_option("--corpus", a->inputs, "Text files or folders")->required()->take_all();
  prepare->add_option("--out,-o", a->out, "Token shard to write")->required();
  prepare->add_option("--tokenizer", a->tokenizer, "gpt2 or byte")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpt2", "byte"}));
  prepare->add_option("--gpt2-dir", a->gpt2_dir,
                      "Folder with encoder.json and vocab.bpe (default: set-up's copy)");
  prepare->callback([a] {
    std::unique_ptr<Tokenizer> tokenizer;
    if (a->tokenizer == "byte") {
      tokenizer = make_byte_tokenizer();
    } else {
      const std::filesystem::path dir = a->gpt2_dir.empty() ? default_gpt2_dir() : a->gpt2_dir;
      tokenizer =
          make_gpt2_tokenizer((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
    }
    const int64_t tokens = prepare_token_shard(a->inputs, *tokenizer, a->out);
    std::cout << "wrote " << tokens << " tokens (" << tokenizer->name() << ", vocabulary "
              << tokenizer->vocab_size() << ") to " << a->out << "\n";
  });
}

}  // namespace shardtrain::cli
