// tokenizer.json's BPE model in id form: the vocabulary and merges resolved to ids once at load,
// the initial symbols of a piece (bytes for byte-level models; characters, with <0xNN> byte
// fallback or the unknown token, for SentencePiece-style ones), the shared merge loop, and a
// per-piece cache.
#include <mutex>

#include "data/hf_tokenizer.h"
#include "data/hf_tokenizer_cache.h"

namespace shardtrain::detail {
namespace {

// Bounds the id -> token table so a typo such as an id of 2^31 cannot allocate gigabytes.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

// Pieces longer than this are not cached: SentencePiece-style models see whole sentences as one
// piece, which rarely repeat, and the cache would only churn.
constexpr size_t kMaxCachedPiece = 128;

std::string byte_token(int byte) {
  static const char* const kHex = "0123456789ABCDEF";
  return std::string("<0x") + kHex[byte >> 4] + kHex[byte & 15] + ">";
}

}  // namespace

HfBpeModel::~HfBpeModel() = default;

std::string HfBpeModel::kind() const {
  return std::string("BPE (") +
         (byte_level_      ? "byte-level"
          : byte_fallback_ ? "byte fallback"
                           : "characters") +
         ")";
}

HfBpeModel::HfBpeModel(HfJsonFile& json, bool byte_level, const std::string& file)
    : byte_level_(byte_level), cache_(std::make_unique<HfPieceCache>()) {
  const Json& model = json.rest.contains("model") ? json.rest["model"] : Json();
  const std::string type = json_type(model, file, "model");
  if (type != "BPE")
    hf_fail(file, "unsupported model type '" + type + "' (supported: BPE, WordPiece)");
  if (!json.has_vocab) hf_fail(file, "model.vocab is missing");
  const auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null() &&
      !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    hf_fail(file, "model.dropout " + dropout->dump() +
                      " is not supported (BPE dropout randomizes encoding for training)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!json_string(model, key, "", file, "model").empty()) {
      hf_fail(file, std::string("model.") + key + " '" + model[key].get<std::string>() +
                        "' is not supported (only empty or null)");
    }
  }
  byte_fallback_ = json_bool(model, "byte_fallback", false, file, "model");
  fuse_unk_ = json_bool(model, "fuse_unk", false, file, "model");
  ignore_merges_ = json_bool(model, "ignore_merges", false, file, "model");

  int64_t max_id = -1;
  for (const auto& [token, id] : json.vocab) {
    if (id > kMaxTokenId) {
      hf_fail(file, "model.vocab: token '" + token + "' has id " + std::to_string(id) +
                        ", above the supported " + std::to_string(kMaxTokenId));
    }
    max_id = std::max(max_id, id);
  }
  id_to_spelled_.resize(static_cast<size_t>(max_id + 1));
  std::vector<bool>& used = id_present_;
  used.assign(id_to_spelled_.size(), false);
  for (auto& [token, id] : json.vocab) {
    if (used[id]) {
      hf_fail(file, "model.vocab: id " + std::to_string(id) + " is used by both '" +
                        id_to_spelled_[id] + "' and '" + token + "'");
    }
    used[id] = true;
    id_to_spelled_[id] = std::move(token);
  }
  json.vocab = {};
  // Views into id_to_spelled_, which no longer changes.
  spelled_to_id_.reserve(id_to_spelled_.size());
  for (size_t id = 0; id < id_to_spelled_.size(); ++id) {
    if (used[id]) spelled_to_id_[id_to_spelled_[id]] = static_cast<int32_t>(id);
  }

  // Merges in id form: (left, right) -> (rank, result). `tokenizers` refuses a merge whose parts
  // or result are not tokens, and so do we: id-form BPE needs every one of them to have an id.
  merges_.reserve(json.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < json.merges.size(); ++rank) {
    const auto& [left, right] = json.merges[rank];
    joined = left + right;
    const int32_t l = id_of(left), r = id_of(right), m = id_of(joined);
    const std::string where =
        "model.merges[" + std::to_string(rank) + "] ('" + left + "', '" + right + "'): ";
    if (l < 0) hf_fail(file, where + "token '" + left + "' is not in model.vocab");
    if (r < 0) hf_fail(file, where + "token '" + right + "' is not in model.vocab");
    if (m < 0) hf_fail(file, where + "the merged token '" + joined + "' is not in model.vocab");
    merges_.insert_or_assign(l, r, BpeMerge{static_cast<int32_t>(rank), m});
  }
  json.merges = {};

  const std::string unk = json_string(model, "unk_token", "", file, "model");
  if (!unk.empty()) {
    unk_id_ = id_of(unk);
    if (unk_id_ < 0) hf_fail(file, "model.unk_token '" + unk + "' is not in model.vocab");
  }

  byte_to_id_.fill(-1);
  if (byte_level_) {
    const auto byte_to_cp = gpt2_byte_to_code_point();
    for (int b = 0; b < 256; ++b) {
      std::string spelled;
      utf8_append(byte_to_cp[b], spelled);
      byte_to_id_[b] = id_of(spelled);
      if (byte_to_id_[b] < 0) {
        hf_fail(file, "model.vocab has no token '" + spelled + "' for byte " + std::to_string(b) +
                          ", which a byte-level model needs");
      }
    }
    if (ignore_merges_) {
      std::vector<std::pair<std::string, int32_t>> tokens;
      std::string bytes;
      for (size_t id = 0; id < id_to_spelled_.size(); ++id) {
        if (used[id] && gpt2_alphabet_to_bytes(id_to_spelled_[id], bytes)) {
          tokens.emplace_back(bytes, static_cast<int32_t>(id));
        }
      }
      whole_pieces_ = std::make_unique<HfTokenTable>();
      whole_pieces_->build(tokens);
    }
  } else {
    if (byte_fallback_) {
      for (int b = 0; b < 256; ++b) byte_to_id_[b] = id_of(byte_token(b));
    }
    // A piece's characters are looked up by code point rather than by building a string each.
    bmp_char_to_id_.assign(0x10000, -1);
    for (const auto& [spelled, id] : spelled_to_id_) {
      const size_t length = spelled.empty() ? 0 : utf8_length(spelled, 0);
      if (length == 0 || length != spelled.size()) continue;
      const uint32_t cp = utf8_decode(spelled, 0, length);
      if (cp < 0x10000) {
        bmp_char_to_id_[cp] = id;
      } else {
        astral_char_to_id_[cp] = id;
      }
    }
  }
}

int32_t HfBpeModel::id_of(std::string_view spelled) const {
  const auto it = spelled_to_id_.find(spelled);
  return it == spelled_to_id_.end() ? -1 : it->second;
}

int32_t HfBpeModel::char_id(uint32_t cp) const {
  if (cp < 0x10000) return bmp_char_to_id_[cp];
  const auto it = astral_char_to_id_.find(cp);
  return it == astral_char_to_id_.end() ? -1 : it->second;
}

void HfBpeModel::encode(std::string_view piece, bool maybe_invalid,
                        std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (byte_level_ && maybe_invalid && !utf8_valid(piece)) {
    // Each byte that is not UTF-8 becomes its own byte token, never merged with its neighbours;
    // the valid runs between them are encoded as usual.
    size_t run = 0, i = 0;
    while (i < piece.size()) {
      const size_t length = utf8_length(piece, i);
      if (length > 0) {
        i += length;
        continue;
      }
      encode_valid(piece.substr(run, i - run), out);
      out.push_back(byte_to_id_[static_cast<unsigned char>(piece[i])]);
      run = ++i;
    }
    encode_valid(piece.substr(run), out);
    return;
  }
  // (A SentencePiece-style model treats a byte that is not UTF-8 as an unknown one-byte
  // character: its <0xNN> token with byte_fallback, else the unknown token.)
  encode_valid(piece, out);
}

void HfBpeModel::encode_valid(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (byte_level_ && piece.size() == 1) {
    return out.push_back(byte_to_id_[static_cast<unsigned char>(piece[0])]);
  }
  // Natural text repeats a small set of words, so almost every piece is a cache hit. (The cache
  // holds what the lines below produce, ignore_merges included, so it may be asked first; it is
  // smaller, so faster to probe, than the table of whole tokens.)
  const bool cacheable = piece.size() <= kMaxCachedPiece;
  if (cacheable && cache_->find(piece, out)) return;
  const size_t first = out.size();
  bool whole = false;
  if (ignore_merges_) {
    // Llama 3: a pre-token that is itself a token is emitted as it is, even where the merges
    // would have split it differently.
    if (byte_level_) {
      if (const int32_t id = whole_pieces_->find(piece); id >= 0) {
        out.push_back(id);
        whole = true;
      }
    } else if (const int32_t id = id_of(piece); id >= 0) {
      out.push_back(id);
      whole = true;
    }
  }
  if (!whole) {
    initial_symbols(piece, out);
    bpe_merge(merges_, out, first);
  }
  if (cacheable) cache_->insert(piece, out.data() + first, out.size() - first);
}

void HfBpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& out) const {
  if (byte_level_) {
    for (const char c : piece) out.push_back(byte_to_id_[static_cast<unsigned char>(c)]);
    return;
  }
  // As `tokenizers`' BPE::merge_word: a character that is a token is its symbol; otherwise its
  // bytes' <0xNN> tokens (byte_fallback, when all exist), otherwise the unknown token, runs of
  // which fuse into one with fuse_unk; without an unknown token the character is dropped.
  bool unk_pending = false;
  for (size_t i = 0; i < piece.size();) {
    const size_t length = utf8_length(piece, i);
    const size_t size = length ? length : 1;
    const int32_t id = length ? char_id(utf8_decode(piece, i, length)) : -1;
    if (id >= 0) {
      if (unk_pending) out.push_back(unk_id_), unk_pending = false;
      out.push_back(id);
    } else {
      bool all_bytes = byte_fallback_;
      for (size_t b = i; all_bytes && b < i + size; ++b) {
        all_bytes = byte_to_id_[static_cast<unsigned char>(piece[b])] >= 0;
      }
      if (all_bytes) {
        // (`tokenizers` adds a pending unknown token after these bytes; that ordering slip only
        // shows with an incomplete set of <0xNN> tokens, and here the order is kept.)
        if (unk_pending) out.push_back(unk_id_), unk_pending = false;
        for (size_t b = i; b < i + size; ++b) {
          out.push_back(byte_to_id_[static_cast<unsigned char>(piece[b])]);
        }
      } else if (unk_id_ >= 0) {
        if (unk_pending && !fuse_unk_) out.push_back(unk_id_);
        unk_pending = true;
      }
    }
    i += size;
  }
  if (unk_pending) out.push_back(unk_id_);
}

}  // namespace shardtrain::detail
