// GPT-2's byte-level BPE in id form: the vocabulary and merge ranks read from encoder.json +
// vocab.bpe, and the merge loop that turns one pre-token's bytes into token ids.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace shardtrain::detail {

// One merge rule: the pair it applies to is the key of BpeVocab::merges.
struct BpeMerge {
  int32_t rank;    // line order in vocab.bpe; lower merges first
  int32_t result;  // id of the concatenated token
};

// Everything needed to encode and decode, with GPT-2's byte-to-unicode indirection already
// resolved: tokens are stored as the raw bytes they stand for, so neither encoding nor decoding
// ever looks at the unicode spelling again.
struct BpeVocab {
  std::vector<std::string> id_to_bytes;  // indexed by id; see id_present
  std::vector<bool> id_present;          // encoder.json need not use every id below the maximum
  std::array<int32_t, 256> byte_to_id{};
  // Key: (left id << 32) | right id. Ids rather than strings make a lookup one integer hash.
  std::unordered_map<uint64_t, BpeMerge> merges;
  int32_t eos_id = -1;

  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
};

// Reads and validates both files. Throws std::invalid_argument naming the file (and the line,
// for malformed JSON or a malformed merge) on any problem.
BpeVocab load_gpt2_vocab(const std::string& encoder_json, const std::string& vocab_bpe);

// Applies the merges to one pre-token's bytes and appends the resulting ids to `out`. Same result
// as GPT-2's reference (lowest rank first, left to right), in O(n log n) rather than its O(n^2),
// so a pathological pre-token such as a megabyte of spaces stays cheap.
void bpe_encode_piece(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out);

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// code points 256..323, so every byte has a visible, non-space character in the vocabulary files.
std::array<uint32_t, 256> gpt2_byte_to_code_point();

// The whole of `path`, or std::invalid_argument "<what> '<path>' not found" / "cannot be read".
std::string read_whole_file(const std::string& path, const std::string& what);

}  // namespace shardtrain::detail
