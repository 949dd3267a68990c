// tokenizer.json pre-tokenizers: Split, ByteLevel, Metaspace, Digits, BertPreTokenizer and
// Sequence, with the five split behaviors of the `tokenizers` library (NormalizedString::split).
#include <utf8proc.h>

#include <algorithm>

#include "data/hf_tokenizer.h"

namespace shardtrain::detail {
namespace {

// One span of a piece: a match of the pattern or the text between two matches.
struct Span {
  size_t start, end;
  bool is_match;
};

// The pieces `spans` (which cover `piece` in order) make under `behavior`; empty ones are dropped
// as `tokenizers` drops them.
void emit_spans(HfPiece piece, const std::vector<Span>& spans, HfSplitBehavior behavior,
                const HfPieceSink& out) {
  auto emit = [&](size_t start, size_t end) {
    if (end > start) out({piece.text.substr(start, end - start), piece.at_start && start == 0});
  };
  if (behavior == HfSplitBehavior::kIsolated || behavior == HfSplitBehavior::kRemoved) {
    for (const Span& s : spans) {
      if (!s.is_match || behavior == HfSplitBehavior::kIsolated) emit(s.start, s.end);
    }
    return;
  }
  std::vector<std::pair<size_t, size_t>> kept;
  kept.reserve(spans.size());
  bool previous_match = false;
  switch (behavior) {
    case HfSplitBehavior::kRemoved:
    case HfSplitBehavior::kIsolated:
      break;
    case HfSplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.start, s.end);
        }
        previous_match = s.is_match;
      }
      break;
    case HfSplitBehavior::kMergedWithNext:
      for (auto s = spans.rbegin(); s != spans.rend(); ++s) {
        if (s->is_match && !previous_match && !kept.empty()) {
          kept.back().first = s->start;
        } else {
          kept.emplace_back(s->start, s->end);
        }
        previous_match = s->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case HfSplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !kept.empty()) {
          kept.back().second = s.end;
        } else {
          kept.emplace_back(s.start, s.end);
        }
        previous_match = s.is_match;
      }
      break;
  }
  for (const auto& [start, end] : kept) emit(start, end);
}

// Spans of a pattern's matches, as `tokenizers`' Pattern::find_matches makes them.
void pattern_spans(const HfPattern& pattern, std::string_view text, bool invert,
                   std::vector<Span>& spans) {
  spans.clear();
  size_t previous = 0;
  pattern.for_each_match(text, [&](size_t start, size_t end) {
    if (start > previous) spans.push_back({previous, start, invert});
    spans.push_back({start, end, !invert});
    previous = end;
  });
  if (previous < text.size()) spans.push_back({previous, text.size(), invert});
}

// Spans of single characters that satisfy `is_match` (each its own match), as `tokenizers`'
// Pattern for Fn(char) -> bool and for char makes them. Bytes that are not UTF-8 never match.
template <typename IsMatch>
void char_spans(std::string_view text, IsMatch&& is_match, std::vector<Span>& spans) {
  spans.clear();
  size_t previous = 0;
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_length(text, i);
    if (length > 0 && is_match(utf8_decode(text, i, length))) {
      if (i > previous) spans.push_back({previous, i, false});
      spans.push_back({i, i + length, true});
      previous = i + length;
    }
    i += length ? length : 1;
  }
  if (previous < text.size()) spans.push_back({previous, text.size(), false});
}

// BertPreTokenizer's punctuation: ASCII punctuation (symbols such as $ + < = > ^ ` | ~ too) and
// Unicode's punctuation categories (Pc, Pd, Ps, Pe, Pi, Pf, Po).
bool is_bert_punctuation(uint32_t cp) {
  if (cp < 0x80) {
    return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
           (cp >= 0x7B && cp <= 0x7E);
  }
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

HfSplitBehavior parse_behavior(const std::string& name, const std::string& file) {
  if (name == "Removed") return HfSplitBehavior::kRemoved;
  if (name == "Isolated") return HfSplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return HfSplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return HfSplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return HfSplitBehavior::kContiguous;
  hf_fail(file, "pre-tokenizer Split: unsupported behavior '" + name +
                    "' (supported: Removed, Isolated, MergedWithPrevious, MergedWithNext, "
                    "Contiguous)");
}

}  // namespace

std::unique_ptr<HfPreTokenizer> HfPreTokenizer::from_json(const Json& json,
                                                          const std::string& file) {
  if (json.is_null()) return nullptr;
  std::unique_ptr<HfPreTokenizer> pre(new HfPreTokenizer());
  pre->add(json, file);
  if (pre->steps_.empty()) return nullptr;
  for (size_t i = 0; i + 1 < pre->steps_.size(); ++i) {
    // The model matches byte-level pieces by their bytes, so nothing may follow the mapping.
    if (pre->steps_[i].kind == Kind::kByteLevel) {
      hf_fail(file, "a ByteLevel pre-tokenizer followed by other pre-tokenizers is not supported");
    }
  }
  pre->byte_level_ = pre->steps_.back().kind == Kind::kByteLevel;
  // A ByteLevel step that neither adds a space nor splits does nothing here (the model reads the
  // bytes); dropping it spares a call per piece.
  const Step& last = pre->steps_.back();
  if (pre->byte_level_ && !last.add_prefix_space && !last.pattern) pre->steps_.pop_back();
  return pre;
}

void HfPreTokenizer::add(const Json& json, const std::string& file) {
  const std::string type = json_type(json, file, "pre_tokenizer");
  const std::string where = "pre-tokenizer " + type;
  Step step;
  if (type == "Sequence") {
    const Json& list = json.contains("pretokenizers") ? json["pretokenizers"] : Json();
    if (!list.is_array()) hf_fail(file, where + ": expected a 'pretokenizers' array");
    for (const Json& item : list) add(item, file);
    return;
  } else if (type == "Split") {
    step.kind = Kind::kSplit;
    if (!json.contains("pattern")) hf_fail(file, where + " has no 'pattern'");
    step.pattern = HfPattern::from_json(json["pattern"], file, where);
    step.behavior = parse_behavior(json_string(json, "behavior", "", file, where), file);
    step.invert = json_bool(json, "invert", false, file, where);
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    step.add_prefix_space = json_bool(json, "add_prefix_space", true, file, where);
    if (json_bool(json, "use_regex", true, file, where)) {
      step.pattern = HfPattern::regex(kGpt2SplitPattern, file, where);
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = json_string(json, "replacement", "\xE2\x96\x81", file, where);
    if (step.replacement.empty() || utf8_length(step.replacement, 0) != step.replacement.size()) {
      hf_fail(file, where + ": replacement '" + step.replacement + "' is not one character");
    }
    const std::string scheme = json_string(json, "prepend_scheme", "always", file, where);
    if (scheme == "always") {
      step.prepend = Step::kAlways;
    } else if (scheme == "first") {
      step.prepend = Step::kFirst;
    } else if (scheme == "never") {
      step.prepend = Step::kNever;
    } else {
      hf_fail(file, where + ": unsupported prepend_scheme '" + scheme +
                        "' (supported: always, first, never)");
    }
    // Files older than prepend_scheme say add_prefix_space: false for "never".
    if (!json_bool(json, "add_prefix_space", true, file, where)) step.prepend = Step::kNever;
    step.split = json_bool(json, "split", true, file, where);
  } else if (type == "Digits") {
    step.kind = Kind::kDigits;
    step.individual_digits = json_bool(json, "individual_digits", false, file, where);
  } else if (type == "BertPreTokenizer") {
    step.kind = Kind::kBert;
  } else {
    hf_fail(file, "unsupported pre-tokenizer type '" + type +
                      "' (supported: Sequence, Split, ByteLevel, Metaspace, Digits, "
                      "BertPreTokenizer)");
  }
  steps_.push_back(std::move(step));
}

void HfPreTokenizer::split(HfPiece piece, const HfPieceSink& sink,
                           std::deque<std::string>& storage) const {
  if (steps_.empty()) return sink(piece);
  apply(0, piece, sink, storage);
}

// Step `index` on `piece`; its pieces go on to the next step, or to `sink` after the last. Pieces
// flow through one at a time, never collected: a long text makes hundreds of thousands.
void HfPreTokenizer::apply(size_t index, HfPiece piece, const HfPieceSink& sink,
                           std::deque<std::string>& storage) const {
  const Step& step = steps_[index];
  auto forward = [&](HfPiece p) {
    if (index + 1 == steps_.size()) {
      sink(p);
    } else {
      apply(index + 1, p, sink, storage);
    }
  };
  const HfPieceSink next(forward);
  // The common case, Isolated or Removed without invert, streams matches as they are found.
  auto stream = [&](const HfPattern& pattern, bool keep_matches) {
    auto emit = [&](size_t start, size_t end) {
      if (end > start) next({piece.text.substr(start, end - start), piece.at_start && start == 0});
    };
    size_t previous = 0;
    pattern.for_each_match(piece.text, [&](size_t start, size_t end) {
      emit(previous, start);
      if (keep_matches) emit(start, end);
      previous = end;
    });
    emit(previous, piece.text.size());
  };
  std::vector<Span> spans;
  switch (step.kind) {
    case Kind::kSplit:
      if (!step.invert && (step.behavior == HfSplitBehavior::kIsolated ||
                           step.behavior == HfSplitBehavior::kRemoved)) {
        return stream(*step.pattern, step.behavior == HfSplitBehavior::kIsolated);
      }
      pattern_spans(*step.pattern, piece.text, step.invert, spans);
      return emit_spans(piece, spans, step.behavior, next);
    case Kind::kByteLevel:
      // The mapping of bytes to GPT-2's alphabet is left to the model, which reads bytes.
      if (step.add_prefix_space && (piece.text.empty() || piece.text[0] != ' ')) {
        piece.text = storage.emplace_back(" " + std::string(piece.text));
      }
      if (!step.pattern) return next(piece);
      return stream(*step.pattern, true);
    case Kind::kMetaspace: {
      std::string text;
      text.reserve(piece.text.size() + step.replacement.size());
      for (const char c : piece.text) {
        if (c == ' ') {
          text += step.replacement;
        } else {
          text += c;
        }
      }
      const bool starts = text.compare(0, step.replacement.size(), step.replacement) == 0;
      if (!starts &&
          (step.prepend == Step::kAlways || (step.prepend == Step::kFirst && piece.at_start))) {
        text.insert(0, step.replacement);
      }
      piece.text = storage.emplace_back(std::move(text));
      if (!step.split) return next(piece);
      const uint32_t replacement = utf8_decode(step.replacement, 0, step.replacement.size());
      char_spans(
          piece.text, [&](uint32_t cp) { return cp == replacement; }, spans);
      return emit_spans(piece, spans, HfSplitBehavior::kMergedWithNext, next);
    }
    case Kind::kBert: {
      // Whitespace removed, then each punctuation mark a piece of its own.
      std::vector<Span> words;
      char_spans(piece.text, is_white_space, words);
      for (const Span& word : words) {
        if (word.is_match) continue;
        const HfPiece part{piece.text.substr(word.start, word.end - word.start),
                           piece.at_start && word.start == 0};
        char_spans(part.text, is_bert_punctuation, spans);
        emit_spans(part, spans, HfSplitBehavior::kIsolated, next);
      }
      return;
    }
    case Kind::kDigits: {
      // Rust's char::is_numeric: general categories Nd, Nl and No.
      char_spans(
          piece.text,
          [](uint32_t cp) {
            const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
            return category == UTF8PROC_CATEGORY_ND || category == UTF8PROC_CATEGORY_NL ||
                   category == UTF8PROC_CATEGORY_NO;
          },
          spans);
      return emit_spans(
          piece, spans,
          step.individual_digits ? HfSplitBehavior::kIsolated : HfSplitBehavior::kContiguous, next);
    }
  }
}

}  // namespace shardtrain::detail
