// Throughput of the GPT-2 tokenizer on text files, cold (a fresh tokenizer, empty cache) and warm
// (the same tokenizer again). Usage: build/bench_tokenizer FILE... ; prints MB/s per round and
// the medians of 5 rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "shardtrain/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_tokenizer FILE...\n");
    return 2;
  }
  std::string text;
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "bench_tokenizer: cannot read %s\n", argv[i]);
      return 2;
    }
    std::ostringstream content;
    content << in.rdbuf();
    text += content.str();
  }
  const std::filesystem::path dir = shardtrain::default_gpt2_dir();
  auto seconds_of = [&](const shardtrain::Tokenizer& tokenizer, size_t& tokens) {
    const auto start = std::chrono::steady_clock::now();
    tokens = tokenizer.encode(text).size();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<double> cold, warm;
  size_t tokens = 0;
  for (int round = 0; round < 5; ++round) {
    auto tokenizer = shardtrain::make_gpt2_tokenizer((dir / "encoder.json").string(),
                                                     (dir / "vocab.bpe").string());
    cold.push_back(text.size() / 1e6 / seconds_of(*tokenizer, tokens));
    warm.push_back(text.size() / 1e6 / seconds_of(*tokenizer, tokens));
    std::printf("round %d: cold %.1f MB/s, warm %.1f MB/s\n", round + 1, cold.back(), warm.back());
  }
  std::sort(cold.begin(), cold.end());
  std::sort(warm.begin(), warm.end());
  std::printf("%.2f MB of text, %zu tokens; median cold %.1f MB/s, warm %.1f MB/s (one thread)\n",
              text.size() / 1e6, tokens, cold[2], warm[2]);
  return 0;
}
