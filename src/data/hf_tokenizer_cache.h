// Piece lookup tables of the BPE model: HfPieceCache (over an HfPieceMap), the per-piece cache
// filled as text is encoded, and HfTokenTable, ignore_merges' table of whole tokens. Natural text
// repeats a small set of words, so after the first few kilobytes almost every piece is a cache hit
// and the merge loop is skipped.
//
// Open addressing over arenas of key bytes and ids rather than an unordered_map of strings to
// vectors: a lookup is one hash of the piece and, usually, one probe, with no string built for
// the key; these lookups are most of the cost of encoding cached text.
#pragma once

#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::detail {

// A 64-bit hash of a piece's bytes, never 0 (the tables' mark of an empty slot).
inline uint64_t hf_piece_hash(std::string_view piece) {
  const char* p = piece.data();
  size_t n = piece.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xFF51AFD7ED558CCDull);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ word) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  if (n > 0) {
    uint64_t word = 0;
    std::memcpy(&word, p, n);
    h = (h ^ word) * 0x94D049BB133111EBull;
  }
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h | 1;
}

class HfPieceMap {
 public:
  // Appends the ids of `piece` to `out` and returns true, or returns false.
  bool find(std::string_view piece, std::vector<int32_t>& out) const {
    const Slot* slot = find_slot(piece, hf_piece_hash(piece));
    if (!slot || slot->hash == 0) return false;
    out.insert(out.end(), ids_.begin() + slot->ids, ids_.begin() + slot->ids + slot->id_count);
    return true;
  }
  // Keeps the first ids given for a piece. `piece` must be at most 65535 bytes and map to at most
  // 65535 ids.
  void insert(std::string_view piece, const int32_t* ids, size_t count) {
    const uint64_t hash = hf_piece_hash(piece);
    if (2 * (entries_ + 1) > slots_.size()) grow();
    Slot* slot = find_slot(piece, hash);
    if (slot->hash != 0) return;
    *slot = {hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
             static_cast<uint16_t>(piece.size()), static_cast<uint16_t>(count)};
    keys_.append(piece.data(), piece.size());
    ids_.insert(ids_.end(), ids, ids + count);
    ++entries_;
  }
  size_t size() const { return entries_; }
  void clear() {
    slots_.clear();
    keys_.clear();
    ids_.clear();
    entries_ = 0;
  }

 private:
  struct Slot {
    uint64_t hash;  // 0: empty
    uint32_t key, ids;
    uint16_t key_length, id_count;
  };

  // The slot holding `piece`, or the empty slot where it would go; nullptr while empty.
  const Slot* find_slot(std::string_view piece, uint64_t hash) const {
    if (slots_.empty()) return nullptr;
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const Slot& slot = slots_[i];
      if (slot.hash == 0) return &slot;
      if (slot.hash == hash && slot.key_length == piece.size() &&
          std::memcmp(keys_.data() + slot.key, piece.data(), piece.size()) == 0) {
        return &slot;
      }
    }
  }
  Slot* find_slot(std::string_view piece, uint64_t hash) {
    return const_cast<Slot*>(static_cast<const HfPieceMap*>(this)->find_slot(piece, hash));
  }
  void grow() {
    std::vector<Slot> old(slots_.size());
    old.swap(slots_);
    slots_.assign(old.empty() ? 4096 : 2 * old.size(), Slot{0, 0, 0, 0, 0});
    const size_t mask = slots_.size() - 1;
    for (const Slot& slot : old) {
      if (slot.hash == 0) continue;
      size_t i = slot.hash & mask;
      while (slots_[i].hash != 0) i = (i + 1) & mask;
      slots_[i] = slot;
    }
  }

  std::vector<Slot> slots_;  // a power of two in size, at most half full
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t entries_ = 0;
};

// Token bytes -> id, built once, for ignore_merges (a piece that is a token is that token). Slots
// of 8 bytes (32 bits of hash, an entry number) over one arena of token bytes: a third of an
// HfPieceMap's size, which counts, as the lookups of uncached pieces miss the CPU caches.
class HfTokenTable {
 public:
  void build(const std::vector<std::pair<std::string, int32_t>>& tokens) {
    size_t capacity = 16;
    while (capacity < 2 * tokens.size()) capacity *= 2;
    slots_.assign(capacity, 0);
    for (const auto& [bytes, id] : tokens) {
      const uint64_t hash = hf_piece_hash(bytes);
      if (find(bytes) >= 0) continue;  // the first token with these bytes wins
      size_t i = hash & (capacity - 1);
      while (slots_[i] != 0) i = (i + 1) & (capacity - 1);
      slots_[i] = ((hash >> 32) << 32) | (ids_.size() + 1);
      offsets_.push_back(static_cast<uint32_t>(arena_.size()));
      arena_ += bytes;
      ids_.push_back(id);
    }
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  }
  // The id of the token whose bytes are `piece`, or -1.
  int32_t find(std::string_view piece) const {
    const uint64_t hash = hf_piece_hash(piece);
    const size_t mask = slots_.size() - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
      const uint64_t slot = slots_[i];
      if (slot == 0) return -1;
      if ((slot >> 32) != (hash >> 32)) continue;
      const size_t entry = (slot & 0xFFFFFFFFu) - 1;
      const uint32_t begin = offsets_[entry];
      const uint32_t length = (entry + 1 < offsets_.size() ? offsets_[entry + 1]
                                                           : static_cast<uint32_t>(arena_.size())) -
                              begin;
      if (length == piece.size() && std::memcmp(arena_.data() + begin, piece.data(), length) == 0) {
        return ids_[entry];
      }
    }
  }

 private:
  std::vector<uint64_t> slots_;    // 0: empty; else (high 32 bits of hash << 32) | entry + 1
  std::vector<uint32_t> offsets_;  // entry -> start of its bytes in arena_
  std::vector<int32_t> ids_;
  std::string arena_;
};

// HfPieceMap behind a mutex, bounded: concurrent encode() calls share it.
class HfPieceCache {
 public:
  bool find(std::string_view piece, std::vector<int32_t>& out) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return map_.find(piece, out);
  }
  void insert(std::string_view piece, const int32_t* ids, size_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    // Bounds memory on text with endless distinct pieces (hex dumps, base64).
    if (map_.size() >= kMaxEntries) map_.clear();
    map_.insert(piece, ids, count);
  }

 private:
  static constexpr size_t kMaxEntries = size_t{1} << 20;
  mutable std::mutex mutex_;
  HfPieceMap map_;
};

}  // namespace shardtrain::detail
