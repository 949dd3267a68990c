// Reading a sharded checkpoint: index.json is validated once; every read then fetches only the
// byte ranges of the slices it overlaps and checks their checksums.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "checkpoint/safetensors_detail.h"
#include "checkpoint/sharded_index.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

// Reads exactly `size` bytes at `offset` of `path` into `out`.
void read_range(const std::string& path, int64_t offset, int64_t size, void* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::invalid_argument("checkpoint file '" + path +
                                "' cannot be opened: " + std::strerror(errno));
  }
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = pread(fd, p, static_cast<size_t>(std::min<int64_t>(size, 1 << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      throw std::invalid_argument("checkpoint file '" + path + "' is truncated or unreadable");
    }
    p += n;
    offset += n;
    size -= n;
  }
  close(fd);
}

struct ByteRange {
  int64_t begin = 0;
  int64_t end = 0;
  std::string what;
  bool operator<(const ByteRange& other) const { return begin < other.begin; }
};

// The begin of the [begin, end) range `json` records for `what` in `file`, after checking that
// it holds `bytes` bytes and lies inside the file past the safetensors length field; adds it to
// `ranges`.
int64_t checked_range(const nlohmann::json& json, int64_t bytes, const std::string& index_path,
                      const ShardedCheckpointReader::FileInfo& file, const std::string& what,
                      std::vector<ByteRange>& ranges) {
  const auto range = detail::json_int64s(json, index_path + ": byte_range of the " + what);
  if (range.size() != 2 || range[0] < 8 || range[1] - range[0] != bytes || range[1] > file.bytes) {
    throw std::invalid_argument("checkpoint file '" + index_path + "' gives the " + what + " in '" +
                                file.name + "' an invalid byte range (want " +
                                std::to_string(bytes) + " bytes inside the file's " +
                                std::to_string(file.bytes) + ")");
  }
  ranges.push_back({range[0], range[1], what});
  return range[0];
}

// The index of the file rank `rank` wrote (one that has rank state, so it exists).
int file_of_rank(const std::vector<ShardedCheckpointReader::FileInfo>& files, int rank) {
  int file = 0;
  while (files[file].rank != rank) ++file;
  return file;
}

}  // namespace

ShardedCheckpointReader::ShardedCheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const std::string index_path = (fs::path(dir_) / "index.json").string();
  std::ifstream in(index_path);
  if (!in) {
    std::error_code error;
    throw std::invalid_argument("checkpoint '" + dir_ + "' " +
                                (fs::exists(dir_, error) ? "has no index.json (not a sharded "
                                                           "checkpoint)"
                                                         : "does not exist"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  index_text_ = text.str();
  auto bad = [&](const std::string& what) {
    return std::invalid_argument("checkpoint file '" + index_path + "' " + what);
  };
  try {
    const auto index = nlohmann::json::parse(index_text_);
    if (index.value("format", "") != detail::kShardedFormatName) {
      throw bad("is not a shardtrain sharded checkpoint index");
    }
    auto integer = [&](const nlohmann::json& json, const std::string& what, int64_t lo,
                       int64_t hi) {
      const int64_t value = detail::json_int64(json, index_path + ": " + what);
      if (value < lo || value > hi) {
        throw bad("gives " + what + " " + std::to_string(value) + ", outside [" +
                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
      }
      return value;
    };
    constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
    constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
    constexpr int64_t kMaxCrc = std::numeric_limits<uint32_t>::max();
    version_ = static_cast<int>(integer(index.at("version"), "version", 0, kMaxInt));
    if (version_ > detail::kShardedFormatVersion) {
      throw bad("has format version " + std::to_string(version_) + "; this build reads up to " +
                std::to_string(detail::kShardedFormatVersion));
    }
    strategy_ = index.at("layout").at("strategy").get<std::string>();
    world_size_ =
        static_cast<int>(integer(index.at("layout").at("world_size"), "world_size", 1, kMaxInt));
    metadata_ = index.at("metadata").dump();
    auto spec_from_json = [&](const nlohmann::json& json) {
      try {
        return detail::spec_from_json(json);
      } catch (const std::invalid_argument& e) {
        throw bad(std::string("is corrupt: ") + e.what());
      }
    };
    for (const auto& t : index.at("tensors")) {
      tensors_.push_back(spec_from_json(t));
      tensor_index_[tensors_.back().name] = tensors_.size() - 1;
      pieces_[tensors_.back().name];
    }
    for (const auto& f : index.at("files")) {
      FileInfo info;
      info.name = f.at("name").get<std::string>();
      if (info.name.find('/') != std::string::npos) throw bad("names a file outside its folder");
      info.rank = static_cast<int>(integer(f.at("rank"), "rank", 0, kMaxInt));
      info.bytes = integer(f.at("bytes"), "bytes", 0, kMaxInt64);
      const int file = static_cast<int>(files_.size());
      const std::string path = (fs::path(dir_) / info.name).string();
      std::error_code ec;
      const auto size = fs::file_size(path, ec);
      if (ec) throw std::invalid_argument("checkpoint file '" + path + "' is missing");
      if (static_cast<int64_t>(size) != info.bytes) {
        throw std::invalid_argument("checkpoint file '" + path + "' has " + std::to_string(size) +
                                    " bytes, index.json records " + std::to_string(info.bytes) +
                                    " (truncated or overwritten)");
      }
      // Every byte range of the file, to check that no two records share bytes.
      std::vector<ByteRange> ranges;
      for (const auto& s : f.at("slices")) {
        const std::string name = s.at("tensor").get<std::string>();
        auto it = tensor_index_.find(name);
        if (it == tensor_index_.end()) throw bad("has a slice of unlisted tensor '" + name + "'");
        const TensorSpec& spec = tensors_[it->second];
        Piece piece;
        piece.file = file;
        piece.offset = detail::json_int64(s.at("offset"), index_path + ": offset");
        piece.numel = detail::json_int64(s.at("numel"), index_path + ": numel");
        piece.crc32 = static_cast<uint32_t>(integer(s.at("crc32"), "crc32", 0, kMaxCrc));
        if (piece.offset < 0 || piece.numel < 0 || piece.numel > spec.numel() - piece.offset) {
          throw bad("gives slice of '" + name + "' in '" + info.name + "' elements [" +
                    std::to_string(piece.offset) + ", +" + std::to_string(piece.numel) +
                    ") outside its " + std::to_string(spec.numel()) + " elements");
        }
        const std::string what =
            "slice of '" + name + "' at element " + std::to_string(piece.offset);
        piece.begin =
            checked_range(s.at("byte_range"), piece.numel * detail::dtype_bytes(spec.dtype),
                          index_path, info, what, ranges);
        pieces_[name].push_back(piece);
        ++info.slices;
      }
      for (const auto& s : f.value("rank_state", nlohmann::json::array())) {
        StateEntry entry;
        entry.name = s.at("name").get<std::string>();
        entry.spec = spec_from_json(s);
        entry.crc32 = static_cast<uint32_t>(integer(s.at("crc32"), "crc32", 0, kMaxCrc));
        entry.begin =
            checked_range(s.at("byte_range"),
                          detail::checked_bytes(entry.spec.shape, entry.spec.dtype, entry.name),
                          index_path, info, "rank state '" + entry.name + "'", ranges);
        rank_states_[info.rank].push_back(entry);
      }
      std::sort(ranges.begin(), ranges.end());
      for (size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].begin < ranges[i - 1].end) {
          throw bad("gives the " + ranges[i].what + " and the " + ranges[i - 1].what + " in '" +
                    info.name + "' overlapping byte ranges");
        }
      }
      file_crc_.push_back(static_cast<uint32_t>(integer(f.at("crc32"), "crc32", 0, kMaxCrc)));
      files_.push_back(info);
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("is corrupt: ") + e.what());
  }
  for (auto& [name, pieces] : pieces_) {
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
    int64_t next = 0;
    for (const auto& p : pieces) {
      if (p.numel == 0) continue;
      if (p.offset < next) {
        throw bad("has slices of tensor '" + name + "' that overlap at element " +
                  std::to_string(p.offset));
      }
      if (p.offset > next) break;
      next += p.numel;
    }
    if (next != tensors_[tensor_index_.at(name)].numel()) {
      throw bad("does not cover tensor '" + name + "' exactly once with its slices");
    }
  }
}

const TensorSpec* ShardedCheckpointReader::find(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const std::vector<ShardedCheckpointReader::Piece>& ShardedCheckpointReader::pieces_of(
    const std::string& name) const {
  auto it = pieces_.find(name);
  if (it == pieces_.end()) {
    throw std::invalid_argument("checkpoint '" + dir_ + "' has no tensor '" + name + "'");
  }
  return it->second;
}

std::string ShardedCheckpointReader::file_path(int file) const {
  return (fs::path(dir_) / files_[file].name).string();
}

at::Tensor ShardedCheckpointReader::read(const std::string& name) const {
  pieces_of(name);  // throws naming a missing tensor
  const TensorSpec& spec = *find(name);
  at::Tensor out = at::empty(spec.shape, spec.dtype);
  read_flat_into(name, 0, out.view({-1}));
  return out;
}

at::Tensor ShardedCheckpointReader::read_flat(const std::string& name, int64_t offset,
                                              int64_t numel) const {
  pieces_of(name);
  at::Tensor out = at::empty({numel}, find(name)->dtype);
  read_flat_into(name, offset, out);
  return out;
}

void ShardedCheckpointReader::read_flat_into(const std::string& name, int64_t offset,
                                             at::Tensor out) const {
  const auto& pieces = pieces_of(name);
  const TensorSpec& spec = *find(name);
  const int64_t numel = out.numel();
  TORCH_CHECK(out.is_contiguous() && out.device().is_cpu() && out.scalar_type() == spec.dtype,
              "read_flat_into('", name, "'): the output must be a contiguous CPU tensor of ",
              spec.dtype);
  if (offset < 0 || offset + numel > spec.numel()) {
    throw std::invalid_argument("checkpoint '" + dir_ + "': elements [" + std::to_string(offset) +
                                ", " + std::to_string(offset + numel) + ") are outside tensor '" +
                                name + "' of " + std::to_string(spec.numel()) + " elements");
  }
  const int64_t element = detail::dtype_bytes(spec.dtype);
  char* target = static_cast<char*>(out.data_ptr());
  for (const auto& p : pieces) {
    const int64_t lo = std::max(offset, p.offset);
    const int64_t hi = std::min(offset + numel, p.offset + p.numel);
    if (lo >= hi) continue;
    // A slice's checksum covers all of it: a slice only partly needed is read whole, then cut.
    const bool whole = lo == p.offset && hi == p.offset + p.numel;
    std::vector<char> buffer;
    char* dest = target + (lo - offset) * element;
    if (!whole) {
      buffer.resize(static_cast<size_t>(p.numel * element));
      dest = buffer.data();
    }
    read_range(file_path(p.file), p.begin, p.numel * element, dest);
    if (detail::crc32_of(dest, p.numel * element) != p.crc32) {
      throw std::invalid_argument("checkpoint file '" + file_path(p.file) + "': the slice of '" +
                                  name + "' at element " + std::to_string(p.offset) +
                                  " fails its crc32 check (the file is corrupt)");
    }
    if (!whole) {
      std::memcpy(target + (lo - offset) * element, buffer.data() + (lo - p.offset) * element,
                  static_cast<size_t>((hi - lo) * element));
    }
  }
}

std::map<std::string, at::Tensor> ShardedCheckpointReader::rank_state(int rank) const {
  std::map<std::string, at::Tensor> out;
  auto it = rank_states_.find(rank);
  if (it == rank_states_.end()) return out;
  const int file = file_of_rank(files_, rank);
  for (const auto& entry : it->second) {
    at::Tensor tensor = at::empty(entry.spec.shape, entry.spec.dtype);
    const int64_t bytes = static_cast<int64_t>(tensor.nbytes());
    read_range(file_path(file), entry.begin, bytes, tensor.data_ptr());
    if (detail::crc32_of(tensor.data_ptr(), bytes) != entry.crc32) {
      throw std::invalid_argument("checkpoint file '" + file_path(file) + "': rank state '" +
                                  entry.name + "' fails its crc32 check (the file is corrupt)");
    }
    out.emplace(entry.name, tensor);
  }
  return out;
}

void ShardedCheckpointReader::verify() const {
  // Each file's own safetensors header must be valid and hold every range the index records.
  std::vector<std::set<std::pair<int64_t, int64_t>>> recorded(files_.size());
  for (const auto& [name, pieces] : pieces_) {
    const int64_t element = detail::dtype_bytes(find(name)->dtype);
    for (const auto& p : pieces) recorded[p.file].insert({p.begin, p.begin + p.numel * element});
  }
  for (const auto& [rank, entries] : rank_states_) {
    const int file = file_of_rank(files_, rank);
    for (const auto& e : entries) {
      const int64_t bytes = e.spec.numel() * detail::dtype_bytes(e.spec.dtype);
      recorded[file].insert({e.begin, e.begin + bytes});
    }
  }
  for (size_t f = 0; f < files_.size(); ++f) {
    const auto header = detail::read_safetensors_header(file_path(static_cast<int>(f)));
    std::set<std::pair<int64_t, int64_t>> held;
    for (const auto& e : header.entries) {
      held.insert({header.data_start + e.begin, header.data_start + e.end});
    }
    for (const auto& range : recorded[f]) {
      if (range.first != range.second && !held.count(range)) {
        throw std::invalid_argument(
            "checkpoint file '" + file_path(static_cast<int>(f)) + "' holds no tensor at bytes [" +
            std::to_string(range.first) + ", " + std::to_string(range.second) +
            "), where index.json records one (the file and the index disagree)");
      }
    }
  }
  std::vector<char> buffer(8 << 20);
  for (size_t f = 0; f < files_.size(); ++f) {
    uint32_t crc = 0;
    for (int64_t at = 0; at < files_[f].bytes;) {
      const int64_t n =
          std::min<int64_t>(static_cast<int64_t>(buffer.size()), files_[f].bytes - at);
      read_range(file_path(static_cast<int>(f)), at, n, buffer.data());
      crc = detail::crc32_of(buffer.data(), n, crc);
      at += n;
    }
    if (crc != file_crc_[f]) {
      throw std::invalid_argument("checkpoint file '" + file_path(static_cast<int>(f)) +
                                  "' fails its crc32 check (the file is corrupt)");
    }
  }
}

}  // namespace shardtrain
