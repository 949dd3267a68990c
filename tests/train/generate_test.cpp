// generate_text's streaming: what on_text is given, piece by piece, is what it returns.
#include "shardtrain/generate.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace shardtrain {
namespace generate_test {

TEST(GenerateTest, StreamedPiecesAreThePromptThenTheContinuation) {
  torch::manual_seed(11);
  Transformer model(model_preset("tiny"));  // untrained: its bytes are anything, UTF-8 or not
  const auto tokenizer = make_byte_tokenizer();
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::vector<std::string> pieces;
    const std::string text =
        generate_text(model, *tokenizer, nullptr, "héllo",
                      SampleOptions().tokens(40).temperature(1.0).top_k(0).seed(seed).on_text(
                          [&](const std::string& piece) { pieces.push_back(piece); }));
    ASSERT_GE(pieces.size(), 1u);
    EXPECT_EQ(pieces.front(), "héllo");
    std::string joined;
    for (const auto& piece : pieces) joined += piece;
    EXPECT_EQ(joined, text) << "seed " << seed;
    // Without on_text the same continuation.
    EXPECT_EQ(generate_text(model, *tokenizer, nullptr, "héllo",
                            SampleOptions().tokens(40).temperature(1.0).top_k(0).seed(seed)),
              text);
  }
  EXPECT_THROW(generate_text(model, *tokenizer, nullptr, "a", SampleOptions().top_k(-1)),
               std::invalid_argument);
}

}  // namespace generate_test
}  // namespace shardtrain
