// Byte-pair encoding in id form, shared by GPT-2's tokenizer and tokenizer.json's BPE models: the
// merge table, the merge loop, and GPT-2's vocabulary read from encoder.json + vocab.bpe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::detail {

// One merge rule: the pair it applies to is its key in a MergeTable.
struct BpeMerge {
  int32_t rank;    // order in the merges list; lower merges first
  int32_t result;  // id of the concatenated token
};

// (left id, right id) -> merge. Open addressing over one flat array: the merge loop looks a pair
// up for every symbol of every uncached pre-token, and std::unordered_map's node per entry costs a
// cache miss each time (Gemma 3 has half a million merges).
class MergeTable {
 public:
  // A pair inserted again keeps its last merge, as Python's dict(zip(merges, ranks)) does.
  void insert_or_assign(int32_t left, int32_t right, BpeMerge merge);
  const BpeMerge* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = pair_key(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key == key) return &slot.merge;
      if (slot.key == kEmpty) return nullptr;
    }
  }
  void reserve(size_t count);
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    BpeMerge merge;
  };
  // Ids are below 2^31, so no real pair has every bit set.
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  size_t slot_of(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  std::vector<Slot> slots_;
  size_t size_ = 0;
  size_t mask_ = 0;
  int shift_ = 64;
};

// Everything needed to encode and decode, with GPT-2's byte-to-unicode indirection already
// resolved: tokens are stored as the raw bytes they stand for, so neither encoding nor decoding
// ever looks at the unicode spelling again.
struct BpeVocab {
  std::vector<std::string> id_to_bytes;  // indexed by id; see id_present
  std::vector<bool> id_present;          // encoder.json need not use every id below the maximum
  std::array<int32_t, 256> byte_to_id{};
  // Ids rather than strings make a lookup one integer hash.
  MergeTable merges;
  int32_t eos_id = -1;
};

// Reads and validates both files. Throws std::invalid_argument naming the file (and the line,
// for malformed JSON or a malformed merge) on any problem.
BpeVocab load_gpt2_vocab(const std::string& encoder_json, const std::string& vocab_bpe);

// Applies `merges` to the symbol ids `symbols[first..]` in place, leaving the merged ids there.
// Same result as GPT-2's reference and Hugging Face's BPE (lowest rank first, leftmost first
// within a rank), in O(n log n) rather than the reference's O(n^2), so a pathological pre-token
// such as a megabyte of spaces stays cheap.
void bpe_merge(const MergeTable& merges, std::vector<int32_t>& symbols, size_t first = 0);

// Applies the merges to one pre-token's bytes and appends the resulting ids to `out`.
void bpe_encode_piece(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out);

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other 68 bytes to
// code points 256..323, so every byte has a visible, non-space character in the vocabulary files.
std::array<uint32_t, 256> gpt2_byte_to_code_point();

// That mapping read back: the byte a code point below 324 stands for, -1 outside the alphabet.
const std::array<int16_t, 324>& gpt2_code_point_to_byte();

// The bytes a token spelled in GPT-2's byte alphabet stands for, into `bytes`. Returns false if
// it holds a character outside the alphabet.
bool gpt2_alphabet_to_bytes(const std::string& spelled, std::string& bytes);

// GPT-2's pre-tokenizer pattern, verbatim from openai/gpt-2 encoder.py (also the one of
// tokenizer.json's ByteLevel pre-tokenizer with use_regex).
extern const char* const kGpt2SplitPattern;

// The whole of `path`, or std::invalid_argument "<what> '<path>' not found" / "cannot be read".
std::string read_whole_file(const std::string& path, const std::string& what);

}  // namespace shardtrain::detail
