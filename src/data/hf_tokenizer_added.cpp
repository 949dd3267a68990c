// Finding added tokens in text, as the `tokenizers` library's AddedVocabulary::find_matches does:
// leftmost-longest matches of the token contents, then single_word, lstrip and rstrip.
#include <utf8proc.h>

#include "data/hf_tokenizer.h"

namespace shardtrain::detail {
namespace {

// The Rust `regex` crate's \w, which single_word tests: alphabetic characters, marks, decimal
// digits, connector punctuation and the joiners (approximated by general categories).
bool is_word(uint32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return cp == 0x200C || cp == 0x200D;
  }
}

// The character that ends at `end` (exclusive): its start, or `end` if the bytes before `end` do
// not end a valid character.
size_t char_before(std::string_view text, size_t end) {
  for (size_t back = 1; back <= 4 && back <= end; ++back) {
    const size_t start = end - back;
    if ((static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) continue;
    return utf8_length(text, start) == back ? start : end;
  }
  return end;
}

bool word_char_before(std::string_view text, size_t end) {
  const size_t start = char_before(text, end);
  return start < end && is_word(utf8_decode(text, start, end - start));
}

bool word_char_at(std::string_view text, size_t start) {
  const size_t length = start < text.size() ? utf8_length(text, start) : 0;
  return length > 0 && is_word(utf8_decode(text, start, length));
}

uint64_t edge_key(int32_t node, unsigned char byte) {
  return (static_cast<uint64_t>(node) << 8) | byte;
}

}  // namespace

int32_t HfAddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  const auto it = edges_.find(edge_key(node, byte));
  return it == edges_.end() ? -1 : it->second;
}

void HfAddedTokenMatcher::add(std::string pattern, const HfAddedToken& token) {
  if (pattern.empty()) return;                         // `tokenizers` ignores empty added tokens
  if (node_token_.empty()) node_token_.push_back(-1);  // the root
  int32_t node = 0;
  for (const char c : pattern) {
    const auto byte = static_cast<unsigned char>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(node_token_.size());
      node_token_.push_back(-1);
      edges_.emplace(edge_key(node, byte), next);
    }
    node = next;
  }
  first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  // Two tokens with the same text: Aho-Corasick reports the first one added.
  if (node_token_[node] < 0) {
    node_token_[node] = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(token);
  }
}

void HfAddedTokenMatcher::split(std::string_view text, std::vector<HfSegment>& out) const {
  size_t done = 0;  // end of the last segment pushed
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int32_t best = -1;
    size_t stop = i;
    for (int32_t node = 0, j = static_cast<int32_t>(i); static_cast<size_t>(j) < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (node_token_[node] >= 0) best = node_token_[node], stop = static_cast<size_t>(j) + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const HfAddedToken& token = tokens_[best];
    size_t start = i;
    // The search goes on after this match even when single_word discards it.
    i = stop;
    if (token.single_word && ((start > 0 && word_char_before(text, start)) ||
                              (stop < text.size() && word_char_at(text, stop)))) {
      continue;
    }
    if (token.lstrip) {
      // Whitespace before the token joins it, but never what an earlier segment took.
      while (start > done) {
        const size_t previous = char_before(text, start);
        if (previous == start || !is_white_space(utf8_decode(text, previous, start - previous)))
          break;
        start = previous;
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        const size_t length = utf8_length(text, stop);
        if (length == 0 || !is_white_space(utf8_decode(text, stop, length))) break;
        stop += length;
      }
      i = stop;
    }
    if (start > done) out.push_back({text.substr(done, start - done), done, -1});
    out.push_back({text.substr(start, stop - start), start, token.id});
    done = stop;
  }
  if (done < text.size()) out.push_back({text.substr(done), done, -1});
}

}  // namespace shardtrain::detail
