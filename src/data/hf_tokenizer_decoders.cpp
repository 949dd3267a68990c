// tokenizer.json decoders (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, WordPiece,
// Sequence) and
// post-processors (TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel, Sequence).
#include "data/hf_tokenizer.h"

namespace shardtrain::detail {
namespace {

// A token of the byte-level alphabet as the bytes it stands for; a token with any other character
// (an added token such as "<｜end▁of▁sentence｜>") as it is, as `tokenizers` decodes it.
void append_byte_level(const std::string& token, std::string& out) {
  const auto& table = gpt2_code_point_to_byte();
  const size_t mark = out.size();
  for (size_t i = 0; i < token.size();) {
    const size_t length = utf8_length(token, i);
    const uint32_t cp = length ? utf8_decode(token, i, length) : 0xFFFFFFFF;
    if (cp >= table.size() || table[cp] < 0) {
      out.resize(mark);
      out += token;
      return;
    }
    out += static_cast<char>(table[cp]);
    i += length;
  }
}

// "<0xNN>" -> NN, or -1.
int byte_fallback_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// The `tokenizers` library's WordPiece cleanup: the spaces a join puts before punctuation and
// inside English contractions taken out again.
std::string wordpiece_cleanup(std::string text) {
  static const std::pair<const char*, const char*> kReplacements[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kReplacements) {
    const std::string needle = from;
    std::string out;
    size_t last = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, last)) {
      out.append(text, last, at - last);
      out += to;
      last = at + needle.size();
    }
    out.append(text, last, std::string::npos);
    text = std::move(out);
  }
  return text;
}

}  // namespace

std::unique_ptr<HfDecoder> HfDecoder::from_json(const Json& json, const std::string& file) {
  if (json.is_null()) return nullptr;
  std::unique_ptr<HfDecoder> decoder(new HfDecoder());
  decoder->add(json, file);
  return decoder;
}

void HfDecoder::add(const Json& json, const std::string& file) {
  const std::string type = json_type(json, file, "decoder");
  const std::string where = "decoder " + type;
  Step step;
  if (type == "Sequence") {
    const Json& list = json.contains("decoders") ? json["decoders"] : Json();
    if (!list.is_array()) hf_fail(file, where + ": expected a 'decoders' array");
    for (const Json& item : list) add(item, file);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    if (!json.contains("pattern")) hf_fail(file, where + " has no 'pattern'");
    step.pattern = HfPattern::from_json(json["pattern"], file, where);
    step.content = json_string(json, "content", "", file, where);
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.content = json_string(json, "content", " ", file, where);
    const Json start = json.value("start", Json(0)), stop = json.value("stop", Json(0));
    if (!start.is_number_unsigned() || !stop.is_number_unsigned()) {
      hf_fail(file, where + ": start and stop must be non-negative integers");
    }
    step.start = start.get<size_t>();
    step.stop = stop.get<size_t>();
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.content = json_string(json, "replacement", "\xE2\x96\x81", file, where);
    step.strip_first = json_string(json, "prepend_scheme", "always", file, where) != "never" &&
                       json_bool(json, "add_prefix_space", true, file, where);
  } else if (type == "WordPiece") {
    step.kind = Kind::kWordPiece;
    step.content = json_string(json, "prefix", "##", file, where);
    step.cleanup = json_bool(json, "cleanup", true, file, where);
  } else {
    hf_fail(file, "unsupported decoder type '" + type +
                      "' (supported: Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, "
                      "Metaspace, WordPiece)");
  }
  steps_.push_back(std::move(step));
}

std::string HfDecoder::decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kByteLevel: {
        // One string from all tokens, as `tokenizers` makes it, but with the bytes kept as they
        // are where it would replace invalid UTF-8 with U+FFFD: decode(encode(x)) == x.
        std::string text;
        for (const std::string& token : tokens) append_byte_level(token, text);
        tokens.assign(1, std::move(text));
        break;
      }
      case Kind::kReplace:
        for (std::string& token : tokens) {
          std::string out;
          size_t last = 0;
          step.pattern->for_each_match(token, [&](size_t start, size_t end) {
            out.append(token, last, start - last);
            out += step.content;
            last = end;
          });
          out.append(token, last, std::string::npos);
          token = std::move(out);
        }
        break;
      case Kind::kByteFallback: {
        // Runs of <0xNN> tokens become their bytes. `tokenizers` turns a run that is not valid
        // UTF-8 into one U+FFFD per byte; the bytes are kept here, so that text with invalid
        // UTF-8 survives encode and decode.
        std::vector<std::string> out;
        out.reserve(tokens.size());
        bool in_run = false;
        for (std::string& token : tokens) {
          const int value = byte_fallback_value(token);
          if (value < 0) {
            out.push_back(std::move(token));
            in_run = false;
          } else {
            if (!in_run) out.emplace_back();
            out.back() += static_cast<char>(value);
            in_run = true;
          }
        }
        tokens = std::move(out);
        break;
      }
      case Kind::kFuse: {
        std::string text;
        for (const std::string& token : tokens) text += token;
        tokens.assign(1, std::move(text));
        break;
      }
      case Kind::kStrip:
        for (std::string& token : tokens) {
          const std::string& c = step.content;
          size_t begin = 0, end = token.size();
          for (size_t k = 0; k < step.start && token.compare(begin, c.size(), c) == 0; ++k) {
            begin += c.size();
          }
          for (size_t k = 0; k < step.stop && end >= begin + c.size() &&
                             token.compare(end - c.size(), c.size(), c) == 0;
               ++k) {
            end -= c.size();
          }
          token = token.substr(begin, end - begin);
        }
        break;
      case Kind::kMetaspace:
        // `tokenizers` drops every replacement character of the first token (the prefix it
        // added) and turns the others into spaces.
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string out;
          const std::string& token = tokens[i];
          for (size_t at = 0; at < token.size();) {
            if (token.compare(at, step.content.size(), step.content) == 0) {
              if (!(i == 0 && step.strip_first)) out += ' ';
              at += step.content.size();
            } else {
              out += token[at++];
            }
          }
          tokens[i] = std::move(out);
        }
        break;
      case Kind::kWordPiece:
        // A piece inside a word loses its prefix; any other token after the first gets a space.
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string& token = tokens[i];
          if (i > 0) {
            if (token.compare(0, step.content.size(), step.content) == 0) {
              token.erase(0, step.content.size());
            } else {
              token.insert(0, " ");
            }
          }
          if (step.cleanup) token = wordpiece_cleanup(std::move(token));
        }
        break;
    }
  }
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

namespace {

void add_processor(const Json& json, const std::string& file, HfPostProcessor& pp) {
  if (json.is_null()) return;
  const std::string type = json_type(json, file, "post_processor");
  const std::string where = "post-processor " + type;
  std::vector<int32_t> prefix, suffix;
  if (type == "Sequence") {
    const Json& list = json.contains("processors") ? json["processors"] : Json();
    if (!list.is_array()) hf_fail(file, where + ": expected a 'processors' array");
    for (const Json& item : list) add_processor(item, file, pp);
    return;
  } else if (type == "ByteLevel") {
    return;  // it only adjusts offsets
  } else if (type == "TemplateProcessing") {
    const Json& single = json.contains("single") ? json["single"] : Json();
    const Json& specials = json.contains("special_tokens") ? json["special_tokens"] : Json();
    if (!single.is_array()) hf_fail(file, where + ": expected a 'single' array");
    bool after_sequence = false;
    for (const Json& item : single) {
      if (item.contains("Sequence")) {
        if (json_string(item["Sequence"], "id", "", file, where + " single item") != "A") {
          hf_fail(file, where + ": the single template names sequence " + item.dump());
        }
        after_sequence = true;
        continue;
      }
      const std::string name =
          item.contains("SpecialToken") && item["SpecialToken"].is_object()
              ? json_string(item["SpecialToken"], "id", "", file, where + " single item")
              : "";
      if (name.empty()) hf_fail(file, where + ": unsupported template item " + item.dump());
      if (!specials.is_object() || !specials.contains(name) || !specials[name].contains("ids") ||
          !specials[name]["ids"].is_array()) {
        hf_fail(file, where + ": special token '" + name + "' has no ids in special_tokens");
      }
      for (const Json& id : specials[name]["ids"]) {
        if (!id.is_number_integer()) hf_fail(file, where + ": '" + name + "' has a bad id");
        (after_sequence ? suffix : prefix).push_back(id.get<int32_t>());
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      const Json& entry = json.contains(key) ? json[key] : Json();
      if (!entry.is_array() || entry.size() != 2 || !entry[1].is_number_integer()) {
        hf_fail(file, where + ": expected '" + key + "' as [token, id]");
      }
      (key[0] == 'c' ? prefix : suffix).push_back(entry[1].get<int32_t>());
    }
  } else {
    hf_fail(file, "unsupported post-processor type '" + type +
                      "' (supported: Sequence, ByteLevel, TemplateProcessing, "
                      "RobertaProcessing, BertProcessing)");
  }
  // A later processor wraps what the earlier ones produced.
  prefix.insert(prefix.end(), pp.prefix.begin(), pp.prefix.end());
  pp.prefix = std::move(prefix);
  pp.suffix.insert(pp.suffix.end(), suffix.begin(), suffix.end());
}

}  // namespace

HfPostProcessor parse_post_processor(const Json& json, const std::string& file) {
  HfPostProcessor pp;
  add_processor(json, file, pp);
  return pp;
}

}  // namespace shardtrain::detail
