// The WordPiece model of a tokenizer.json (BERT's): each pre-token is cut greedily into the
// longest vocabulary entries from its start, the pieces after the first spelled with the
// continuing-subword prefix ("##"); a pre-token that cannot be cut so, or that has more than
// max_input_chars_per_word characters, becomes the unknown token (the `tokenizers` library's
// WordPiece::tokenize).
#include "data/hf_tokenizer.h"

namespace shardtrain::detail {

HfWordPieceModel::HfWordPieceModel(const HfJsonFile& file_json, const std::string& file) {
  const Json& model = file_json.rest.at("model");
  const std::string where = "model (WordPiece)";
  prefix_ = json_string(model, "continuing_subword_prefix", "##", file, where);
  const std::string unk = json_string(model, "unk_token", "[UNK]", file, where);
  const auto max = model.find("max_input_chars_per_word");
  if (max != model.end() && !max->is_null()) {
    if (!max->is_number_unsigned()) {
      hf_fail(file, "model.max_input_chars_per_word: expected a non-negative integer");
    }
    max_chars_ = max->get<size_t>();
  }
  std::vector<std::pair<std::string, int64_t>> entries = file_json.vocab;
  if (!file_json.has_vocab) {
    const auto vocab = model.find("vocab");
    if (vocab == model.end() || !vocab->is_object()) {
      hf_fail(file, "model.vocab: expected an object of token: id");
    }
    for (const auto& [token, id] : vocab->items()) {
      if (!id.is_number_unsigned()) {
        hf_fail(file, "model.vocab: token '" + token + "' needs a non-negative integer id");
      }
      entries.emplace_back(token, id.get<int64_t>());
    }
  }
  for (auto& [token, id] : entries) {
    if (id >= (int64_t{1} << 24)) {
      hf_fail(file, "model.vocab: token '" + token + "' has id " + std::to_string(id) +
                        ", beyond the ids this reader takes");
    }
    if (static_cast<size_t>(id) >= id_to_spelled_.size()) {
      id_to_spelled_.resize(static_cast<size_t>(id) + 1);
      id_present_.resize(static_cast<size_t>(id) + 1, false);
    }
    id_to_spelled_[static_cast<size_t>(id)] = std::move(token);
    id_present_[static_cast<size_t>(id)] = true;
  }
  for (size_t id = 0; id < id_to_spelled_.size(); ++id) {
    if (id_present_[id]) spelled_to_id_.emplace(id_to_spelled_[id], static_cast<int32_t>(id));
  }
  unk_id_ = id_of(unk);
  if (unk_id_ < 0) hf_fail(file, "model.unk_token '" + unk + "' is not in model.vocab");
}

int32_t HfWordPieceModel::id_of(std::string_view spelled) const {
  const auto it = spelled_to_id_.find(spelled);
  return it == spelled_to_id_.end() ? -1 : it->second;
}

void HfWordPieceModel::encode(std::string_view piece, bool /*maybe_invalid*/,
                              std::vector<int32_t>& out) const {
  // Character boundaries (a byte that is not UTF-8 counts as one character).
  std::vector<size_t> bounds;
  for (size_t i = 0; i < piece.size();) {
    bounds.push_back(i);
    const size_t length = utf8_length(piece, i);
    i += length > 0 ? length : 1;
  }
  bounds.push_back(piece.size());
  const size_t chars = bounds.size() - 1;
  if (chars == 0) return;
  if (chars > max_chars_) {
    out.push_back(unk_id_);
    return;
  }
  const size_t first = out.size();
  std::string candidate;
  size_t start = 0;  // index into bounds
  while (start < chars) {
    int32_t found = -1;
    size_t end = chars;
    for (; end > start; --end) {
      candidate.assign(start > 0 ? prefix_ : std::string());
      candidate.append(piece.substr(bounds[start], bounds[end] - bounds[start]));
      found = id_of(candidate);
      if (found >= 0) break;
    }
    if (found < 0) {  // no piece starts here: the whole word is unknown
      out.resize(first);
      out.push_back(unk_id_);
      return;
    }
    out.push_back(found);
    start = end;
  }
}

}  // namespace shardtrain::detail
