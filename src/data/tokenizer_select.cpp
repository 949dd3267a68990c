// Which tokenizer a name or a path stands for (data.tokenizer, --tokenizer).
#include <filesystem>
#include <stdexcept>

#include "shardtrain/hf_tokenizer.h"

namespace shardtrain {

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name_or_path,
                                          const std::string& gpt2_dir) {
  if (name_or_path == "byte") return make_byte_tokenizer();
  if (name_or_path == "gpt2") {
    const std::filesystem::path dir = gpt2_dir.empty() ? default_gpt2_dir() : gpt2_dir;
    return make_gpt2_tokenizer((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
  }
  if (is_hf_tokenizer_path(name_or_path)) return load_hf_tokenizer(name_or_path);
  std::error_code error;
  throw std::invalid_argument(
      "tokenizer '" + name_or_path + "' is not \"byte\", \"gpt2\" or a tokenizer.json file or a " +
      "folder holding one" +
      (std::filesystem::is_directory(name_or_path, error) ? " (the folder has no tokenizer.json)"
                                                          : ""));
}

}  // namespace shardtrain
