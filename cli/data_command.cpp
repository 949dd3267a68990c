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
  auto inputs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto tokenizer_name = std::make_shared<std::string>("gpt2");
  auto gpt2_dir = std::make_shared<std::string>();
  prepare->add_option("--corpus", *inputs, "Text files or folders")->required()->take_all();
  prepare->add_option("--out,-o", *out, "Token shard to write")->required();
  prepare->add_option("--tokenizer", *tokenizer_name, "gpt2 or byte")
      ->capture_default_str()
      ->check(CLI::IsMember({"gpt2", "byte"}));
  prepare->add_option("--gpt2-dir", *gpt2_dir,
                      "Folder with encoder.json and vocab.bpe (default: set-up's copy)");
  prepare->callback([=] {
    std::unique_ptr<Tokenizer> tokenizer;
    if (*tokenizer_name == "byte") {
      tokenizer = make_byte_tokenizer();
    } else {
      const std::filesystem::path dir = gpt2_dir->empty() ? default_gpt2_dir() : *gpt2_dir;
      tokenizer =
          make_gpt2_tokenizer((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
    }
    const int64_t tokens = prepare_token_shard(*inputs, *tokenizer, *out);
    std::cout << "wrote " << tokens << " tokens (" << tokenizer->name() << ", vocabulary "
              << tokenizer->vocab_size() << ") to " << *out << "\n";
  });
}

}  // namespace shardtrain::cli
