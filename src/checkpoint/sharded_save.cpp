// The collective save of a sharded checkpoint. Ranks agree after each phase (staging directory
// created, rank files durable, index committed), exchanging a short JSON text each, so that an
// error on one rank is raised on all of them instead of leaving the others waiting.

#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <stdexcept>

#include "checkpoint/safetensors_detail.h"
#include "checkpoint/sharded_index.h"

namespace shardtrain {
namespace {

// New host memory for a copy of `data` (1-D, its dtype; pinned when `data` is on CUDA).
at::Tensor staging_buffer(const at::Tensor& data) {
  return at::empty({data.numel()},
                   at::TensorOptions().dtype(data.scalar_type()).pinned_memory(data.is_cuda()));
}

// Every rank's `text`, in rank order, through an all-gather of padded bytes.
std::vector<std::string> all_gather_text(ProcessGroup* group, const std::string& text) {
  if (!group || group->size() == 1) return {text};
  const int world = group->size();
  at::Tensor length = at::tensor({static_cast<int64_t>(text.size())}, at::kLong);
  at::Tensor lengths = at::empty({world}, at::kLong);
  group->all_gather(length, lengths)->wait();
  const int64_t longest = std::max<int64_t>(1, lengths.max().item<int64_t>());
  at::Tensor mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr(), text.data(), text.size());
  at::Tensor all = at::empty({longest * world}, at::kByte);
  group->all_gather(mine, all)->wait();
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) {
    const char* begin = static_cast<const char*>(all.data_ptr()) + r * longest;
    out.emplace_back(begin, static_cast<size_t>(lengths[r].item<int64_t>()));
  }
  return out;
}

// Outcome of one phase on this rank: the phase's result, or the error it threw.
nlohmann::json attempt(const std::function<nlohmann::json()>& phase) {
  try {
    return {{"ok", phase()}};
  } catch (const std::invalid_argument& e) {
    return {{"error", e.what()}, {"bad_input", true}};
  } catch (const std::exception& e) {
    return {{"error", e.what()}, {"bad_input", false}};
  }
}

// Exchanges the phase outcomes; throws the first rank's error on every rank. With `patience`,
// ranks first meet at a barrier that waits that long, so a phase that is slow on some ranks
// does not trip the group's collective timeout.
std::vector<nlohmann::json> agree(ProcessGroup* group, const nlohmann::json& outcome,
                                  std::chrono::milliseconds patience = {}) {
  if (group && group->size() > 1 && patience.count() > 0) {
    group->barrier_within(patience)->wait();
  }
  std::vector<nlohmann::json> results;
  const auto texts = all_gather_text(group, outcome.dump());
  for (size_t r = 0; r < texts.size(); ++r) {
    const auto result = nlohmann::json::parse(texts[r]);
    if (result.contains("error")) {
      const std::string message = (texts.size() > 1 ? "rank " + std::to_string(r) + ": " : "") +
                                  result.at("error").get<std::string>();
      if (result.at("bad_input").get<bool>()) throw std::invalid_argument(message);
      throw std::runtime_error(message);
    }
    results.push_back(result.at("ok"));
  }
  return results;
}

uint32_t specs_checksum(const std::vector<TensorSpec>& tensors) {
  nlohmann::json all = nlohmann::json::array();
  for (const auto& spec : tensors) all.push_back(detail::spec_to_json(spec));
  const std::string text = all.dump();
  return detail::crc32_of(text.data(), static_cast<int64_t>(text.size()));
}

// The rank files, then the index and the commit (rank 0's `writer`), each phase agreed on.
std::string write_and_commit(const std::string& root, const std::string& name,
                             const std::vector<TensorSpec>& tensors,
                             const std::vector<FlatSlice>& slices, ProcessGroup* group,
                             const ShardedSaveOptions& options, CheckpointWriter* writer);

}  // namespace

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string save_sharded_checkpoint(const std::string& root, const std::string& name,
                                    const std::vector<TensorSpec>& tensors,
                                    const std::vector<FlatSlice>& slices, ProcessGroup* group,
                                    const ShardedSaveOptions& options) {
  const int rank = group ? group->rank() : 0;
  const std::string staging = CheckpointWriter::staging_path(root, name);

  std::unique_ptr<CheckpointWriter> writer;
  agree(group, attempt([&] {
          if (rank == 0) writer = std::make_unique<CheckpointWriter>(root, name, options.keep_);
          return nlohmann::json();
        }));

  // From here a failure leaves a staging directory that will never be complete: once every rank
  // is past the phase that failed (agree() raises the error on all of them), rank 0 removes it,
  // so that a full disk is not left fuller.
  try {
    return write_and_commit(root, name, tensors, slices, group, options, writer.get());
  } catch (...) {
    if (rank == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(staging, ignored);
    }
    throw;
  }
}

std::future<std::string> save_sharded_checkpoint_async(const std::string& root,
                                                       const std::string& name,
                                                       const std::vector<TensorSpec>& tensors,
                                                       const std::vector<FlatSlice>& slices,
                                                       std::shared_ptr<ProcessGroup> group,
                                                       ShardedSaveOptions options) {
  // The copies, made here on the caller's thread: afterwards nothing of the caller's is read.
  std::vector<FlatSlice> copies;
  copies.reserve(slices.size());
  for (size_t i = 0; i < slices.size(); ++i) {
    const at::Tensor data = options.fetch_ ? options.fetch_(i) : slices[i].data;
    at::Tensor copy = options.staging_ ? options.staging_->take(i, data) : staging_buffer(data);
    copy.copy_(data.reshape({-1}));
    copies.push_back({slices[i].name, slices[i].offset, std::move(copy)});
  }
  options.fetch_ = nullptr;
  return std::async(
      std::launch::async, [root, name, tensors, copies = std::move(copies),
                           group = std::move(group), options = std::move(options)]() mutable {
        std::string dir;
        try {
          dir = save_sharded_checkpoint(root, name, tensors, copies, group.get(), options);
        } catch (...) {
          if (options.staging_) options.staging_->keep(std::move(copies));
          throw;
        }
        if (options.staging_) options.staging_->keep(std::move(copies));
        return dir;
      });
}

CheckpointStaging::~CheckpointStaging() {
  try {
    wait_for_prepare();
  } catch (const std::exception&) {
    // Memory that could not be had ahead: a save allocates its own.
  }
}

void CheckpointStaging::prepare(const std::vector<FlatSlice>& slices) {
  wait_for_prepare();
  std::vector<at::Tensor> like;
  like.reserve(slices.size());
  for (const auto& slice : slices) like.push_back(slice.data);
  preparing_ = std::async(std::launch::async, [like = std::move(like)] {
    std::vector<at::Tensor> buffers;
    buffers.reserve(like.size());
    for (const auto& data : like) {
      at::Tensor buffer = staging_buffer(data);
      // One write per page faults it in now rather than during a save's copy.
      auto* bytes = static_cast<volatile char*>(buffer.data_ptr());
      const int64_t size = buffer.numel() * static_cast<int64_t>(buffer.element_size());
      for (int64_t at = 0; at < size; at += 4096) bytes[at] = 0;
      buffers.push_back(std::move(buffer));
    }
    return buffers;
  });
}

void CheckpointStaging::wait_for_prepare() {
  if (!preparing_.valid()) return;
  std::vector<at::Tensor> prepared = preparing_.get();
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_ = std::move(prepared);
}

at::Tensor CheckpointStaging::take(size_t index, const at::Tensor& data) {
  wait_for_prepare();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (index < buffers_.size()) {
      at::Tensor kept = std::move(buffers_[index]);
      if (kept.defined() && kept.scalar_type() == data.scalar_type() &&
          kept.numel() == data.numel() && kept.is_pinned() == data.is_cuda()) {
        return kept;
      }
    }
  }
  return staging_buffer(data);
}

void CheckpointStaging::keep(std::vector<FlatSlice> copies) {
  std::lock_guard<std::mutex> lock(mutex_);
  buffers_.resize(copies.size());
  for (size_t i = 0; i < copies.size(); ++i) buffers_[i] = std::move(copies[i].data);
}

int64_t CheckpointStaging::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t total = 0;
  for (const auto& buffer : buffers_) {
    if (buffer.defined()) total += buffer.numel() * static_cast<int64_t>(buffer.element_size());
  }
  return total;
}

namespace {

std::string write_and_commit(const std::string& root, const std::string& name,
                             const std::vector<TensorSpec>& tensors,
                             const std::vector<FlatSlice>& slices, ProcessGroup* group,
                             const ShardedSaveOptions& options, CheckpointWriter* writer) {
  const int rank = group ? group->rank() : 0;
  const int world = group ? group->size() : 1;
  const std::string staging = CheckpointWriter::staging_path(root, name);
  const auto records =
      agree(group, attempt([&] {
              std::map<std::string, const TensorSpec*> by_name;
              for (const auto& spec : tensors) by_name[spec.name] = &spec;
              std::vector<detail::SliceRef> refs;
              for (const auto& slice : slices) {
                auto it = by_name.find(slice.name);
                if (it == by_name.end()) {
                  throw std::invalid_argument("slice of unknown tensor '" + slice.name + "'");
                }
                const TensorSpec& spec = *it->second;
                if (slice.data.scalar_type() != spec.dtype || slice.data.dim() != 1 ||
                    slice.offset < 0 || slice.offset + slice.data.numel() > spec.numel()) {
                  throw std::invalid_argument(
                      "slice of tensor '" + slice.name + "' at offset " +
                      std::to_string(slice.offset) + " with " + std::to_string(slice.data.numel()) +
                      " elements of " + c10::toString(slice.data.scalar_type()) +
                      " does not fit the tensor (" + std::to_string(spec.numel()) +
                      " elements of " + c10::toString(spec.dtype) + "; slices are 1-D)");
                }
                refs.push_back({slice.name, slice.offset, slice.data.numel(), spec.dtype});
              }
              nlohmann::json record = detail::write_rank_file(
                  staging, rank, refs,
                  [&](size_t i) { return options.fetch_ ? options.fetch_(i) : slices[i].data; },
                  options.rank_state_);
              record["specs_crc32"] = specs_checksum(tensors);
              return record;
            }),
            options.write_timeout_);

  const auto committed = agree(
      group, attempt([&]() -> nlohmann::json {
        if (rank != 0) return nullptr;
        std::vector<nlohmann::json> files;
        for (int r = 0; r < world; ++r) {
          nlohmann::json record = records[r];
          if (record.at("specs_crc32") != records[0].at("specs_crc32")) {
            throw std::invalid_argument("rank " + std::to_string(r) +
                                        " passed a different tensor list than rank 0");
          }
          record.erase("specs_crc32");
          files.push_back(record);
        }
        if (options.before_commit_) options.before_commit_();
        nlohmann::json metadata;
        try {
          metadata = nlohmann::json::parse(options.metadata_);
        } catch (const std::exception& e) {
          throw std::invalid_argument(std::string("checkpoint metadata is not JSON: ") + e.what());
        }
        detail::write_index(staging, tensors,
                            {{"strategy", options.strategy_}, {"world_size", world}}, metadata,
                            files);
        return writer->commit();
      }));
  return committed[0].get<std::string>();
}

}  // namespace
}  // namespace shardtrain
