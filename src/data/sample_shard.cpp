// The sample shard: instruction samples' tokens with a loss flag each, and where each sample
// starts (samples.h has the layout).
#include <c10/util/Exception.h>

#include <cstring>
#include <stdexcept>

#include "data/shard_io.h"
#include "shardtrain/samples.h"

namespace shardtrain {
namespace {

constexpr char kSampleMagic[8] = {'S', 'T', 'S', 'A', 'M', 'P', 'L', 'E'};
constexpr size_t kHeaderBytes = 40;

}  // namespace

void write_sample_shard(const std::string& path, const std::vector<int32_t>& tokens,
                        const std::vector<uint8_t>& loss, const std::vector<int64_t>& offsets,
                        int64_t vocab_size) {
  if (vocab_size <= 0 || loss.size() != tokens.size() || offsets.empty() || offsets.front() != 0 ||
      offsets.back() != static_cast<int64_t>(tokens.size())) {
    throw std::invalid_argument("sample shard '" + path +
                                "': tokens, loss flags and offsets do not agree");
  }
  uint32_t token_bytes = 0;
  std::string header = detail::shard_header(kSampleMagic, tokens.size(), vocab_size, token_bytes);
  detail::put<uint64_t>(header, offsets.size() - 1);
  detail::write_atomically(path, "sample shard", [&](std::ofstream& out) {
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    detail::write_ids(out, tokens, token_bytes);
    out.write(reinterpret_cast<const char*>(loss.data()),
              static_cast<std::streamsize>(loss.size()));
    for (const int64_t offset : offsets) {
      const auto value = static_cast<uint64_t>(offset);
      out.write(reinterpret_cast<const char*>(&value), sizeof(value));
    }
  });
}

SampleShard::SampleShard(const std::string& path)
    : path_(path), file_(std::make_unique<detail::MappedFile>(path, "sample shard")) {
  const unsigned char* data = file_->data();
  const size_t bytes = file_->size();
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument("sample shard '" + path + "' " + what);
  };
  if (bytes < kHeaderBytes) {
    fail("is truncated: " + std::to_string(bytes) + " bytes, shorter than its header");
  }
  if (std::memcmp(data, kSampleMagic, sizeof(kSampleMagic)) != 0)
    fail("is not a sample shard (bad magic)");
  const auto version = detail::get<uint32_t>(data + 8);
  token_bytes_ = detail::get<uint32_t>(data + 12);
  const auto tokens = detail::get<uint64_t>(data + 16);
  vocab_size_ = detail::get<uint64_t>(data + 24);
  const auto samples = detail::get<uint64_t>(data + 32);
  if (version != 1) fail("has format version " + std::to_string(version) + ", expected 1");
  if (token_bytes_ != 2 && token_bytes_ != 4) {
    fail("declares " + std::to_string(token_bytes_) + " bytes per token (expected 2 or 4)");
  }
  // Checked in this order so that a huge count in a corrupt header cannot overflow the size.
  if (tokens > bytes || samples > bytes) fail("has a corrupt header");
  const size_t expected = kHeaderBytes + tokens * (token_bytes_ + 1) + (samples + 1) * 8;
  if (bytes != expected) {
    fail(std::string(bytes < expected ? "is truncated" : "has trailing bytes") + ": its header " +
         "announces " + std::to_string(tokens) + " tokens in " + std::to_string(samples) +
         " samples (" + std::to_string(expected) + " bytes) but the file has " +
         std::to_string(bytes) + " bytes");
  }
  num_tokens_ = static_cast<int64_t>(tokens);
  num_samples_ = static_cast<int64_t>(samples);
  tokens_ = data + kHeaderBytes;
  loss_ = tokens_ + tokens * token_bytes_;
  offsets_ = loss_ + tokens;
  uint64_t previous = 0;
  for (uint64_t i = 0; i <= samples; ++i) {
    const auto offset = detail::get<uint64_t>(offsets_ + 8 * i);
    if ((i == 0 && offset != 0) || offset < previous || offset > tokens ||
        (i == samples && offset != tokens)) {
      fail("has offset " + std::to_string(offset) + " for sample " + std::to_string(i) +
           ": offsets must rise from 0 to the number of tokens");
    }
    previous = offset;
  }
}

SampleShard::~SampleShard() = default;

int64_t SampleShard::length(int64_t sample) const {
  TORCH_CHECK(sample >= 0 && sample < num_samples_, "sample shard '", path_, "': sample ", sample,
              " outside its ", num_samples_, " samples");
  return static_cast<int64_t>(detail::get<uint64_t>(offsets_ + 8 * (sample + 1)) -
                              detail::get<uint64_t>(offsets_ + 8 * sample));
}

void SampleShard::read(int64_t sample, int64_t begin, int64_t count, int64_t* ids,
                       uint8_t* loss) const {
  TORCH_CHECK(begin >= 0 && count >= 0 && begin + count <= length(sample), "sample shard '", path_,
              "': tokens [", begin, ", ", begin + count, ") are outside sample ", sample);
  const auto first = static_cast<int64_t>(detail::get<uint64_t>(offsets_ + 8 * sample)) + begin;
  for (int64_t i = 0; i < count; ++i) {
    const unsigned char* at = tokens_ + (first + i) * token_bytes_;
    ids[i] = token_bytes_ == 2 ? detail::get<uint16_t>(at) : detail::get<int32_t>(at);
  }
  if (loss) std::memcpy(loss, loss_ + first, static_cast<size_t>(count));
}

int64_t SampleShard::loss_tokens(int64_t sample, int64_t begin, int64_t count) const {
  TORCH_CHECK(begin >= 0 && count >= 0 && begin + count <= length(sample), "sample shard '", path_,
              "': tokens [", begin, ", ", begin + count, ") are outside sample ", sample);
  const auto first = static_cast<int64_t>(detail::get<uint64_t>(offsets_ + 8 * sample)) + begin;
  int64_t n = 0;
  for (int64_t i = 0; i < count; ++i) n += loss_[first + i] != 0;
  return n;
}

}  // namespace shardtrain
