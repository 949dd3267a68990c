// The sharded checkpoint: one format for every strategy and world size. Each rank writes the
// flat slices it owns into its own safetensors file, in parallel; rank 0 writes index.json, which
// names every tensor (global shape, dtype) and which byte range of which file holds each slice.
// A reader reassembles any range of any tensor from whichever files hold it, so a checkpoint
// saved by one layout loads into any other. The format is described in docs/checkpoints.md.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "shardtrain/checkpoint.h"
#include "shardtrain/dist.h"

namespace shardtrain {

// A logical tensor of the checkpoint: what it is, independently of how it was sharded.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  int64_t numel() const;
};

// A contiguous range [offset, offset + data.numel()) of the row-major flattening of tensor
// `name`. `data` is 1-D with the tensor's dtype (any device; it is copied to CPU when written).
// An FSDP or ZeRO shard of a flat parameter is one such slice per tensor it touches.
struct FlatSlice {
  std::string name;
  int64_t offset = 0;
  at::Tensor data;
};

// Host buffers that asynchronous saves copy a rank's slices into, kept from one save to the next
// (ShardedSaveOptions::staging). Writing fresh memory faults its pages in, which for a large model
// costs seconds of the step; with staging only a buffer's first use pays, and prepare() pays for
// it ahead, on a thread of its own, while training goes on. prepare() and take() are called by
// the thread that saves, keep() by any.
class CheckpointStaging {
 public:
  CheckpointStaging() = default;
  CheckpointStaging(const CheckpointStaging&) = delete;
  CheckpointStaging& operator=(const CheckpointStaging&) = delete;
  ~CheckpointStaging();  // waits for prepare()

  // Allocates and touches one buffer per slice (its dtype and element count: the slices' data
  // only describe them; pinned host memory for slices on CUDA) in the background.
  void prepare(const std::vector<FlatSlice>& slices);
  // A 1-D buffer for slice `index` with the dtype and element count of `data`: the kept one when
  // it matches, else new memory. Waits for prepare().
  at::Tensor take(size_t index, const at::Tensor& data);
  // The copies of a finished save (slice i's in copies[i]), kept for the next one.
  void keep(std::vector<FlatSlice> copies);
  // Bytes of the buffers kept now.
  int64_t bytes() const;

 private:
  void wait_for_prepare();

  mutable std::mutex mutex_;
  std::vector<at::Tensor> buffers_;
  std::future<std::vector<at::Tensor>> preparing_;
};

struct ShardedSaveOptions {
  // How the slices were cut ("none", "ddp", "fsdp", ...): recorded for inspection only; loading
  // never depends on it.
  ShardedSaveOptions& strategy(std::string value) {
    strategy_ = std::move(value);
    return *this;
  }
  // Complete checkpoints kept under the root (the newest ones), as CheckpointWriter.
  ShardedSaveOptions& keep(int value) {
    keep_ = value;
    return *this;
  }
  // A JSON object stored as "metadata" in index.json (training state, model description). Only
  // rank 0's is written.
  ShardedSaveOptions& metadata(std::string json_object) {
    metadata_ = std::move(json_object);
    return *this;
  }
  // This rank's own state (RNG states, ...), stored in its file and read back per rank.
  ShardedSaveOptions& rank_state(NamedTensors value) {
    rank_state_ = std::move(value);
    return *this;
  }
  // Runs on rank 0 once every rank's file is on disk, before index.json is written and the
  // directory is committed (fault-injection tests kill the process here).
  ShardedSaveOptions& before_commit(std::function<void()> hook) {
    before_commit_ = std::move(hook);
    return *this;
  }

  // How long ranks that finished writing wait for the slowest one, whatever the group's own
  // collective timeout (a save may take far longer than a training collective).
  ShardedSaveOptions& write_timeout(std::chrono::milliseconds value) {
    write_timeout_ = value;
    return *this;
  }

  // Values of slice i fetched as it is written, slice after slice in order: the slices' data
  // then only describe them (numel and dtype; they may have no memory), so a rank whose state
  // is in files never holds all of its slices at once.
  ShardedSaveOptions& fetch(std::function<at::Tensor(size_t index)> value) {
    fetch_ = std::move(value);
    return *this;
  }

  // save_sharded_checkpoint_async only: the host buffers the copies are made into, given back
  // when the save ends (null: new memory for every save, freed when it ends).
  ShardedSaveOptions& staging(std::shared_ptr<CheckpointStaging> value) {
    staging_ = std::move(value);
    return *this;
  }

  std::string strategy_ = "none";
  int keep_ = 2;
  std::chrono::milliseconds write_timeout_{std::chrono::hours(2)};
  std::string metadata_ = "{}";
  NamedTensors rank_state_;
  std::function<void()> before_commit_;
  std::function<at::Tensor(size_t)> fetch_;
  std::shared_ptr<CheckpointStaging> staging_;
};

// Writes ROOT/NAME atomically (see CheckpointWriter) and returns its path. Collective over
// `group` (null: a single process): every rank calls it with the same `tensors` (identical
// lists, same order) and the slices it owns; together the slices of all ranks must cover every
// tensor exactly once, else std::invalid_argument names the tensor and the gap or overlap. Each
// rank writes ROOT/.NAME.partial/rank_RRRRR.safetensors and fsyncs it; once every rank's file is
// durable, rank 0 writes index.json and commits. Blocks until the checkpoint is complete (or has
// failed) on every rank; an error on any rank is rethrown on all of them and nothing is
// committed, so ROOT/latest and older checkpoints are untouched.
std::string save_sharded_checkpoint(const std::string& root, const std::string& name,
                                    const std::vector<TensorSpec>& tensors,
                                    const std::vector<FlatSlice>& slices, ProcessGroup* group,
                                    const ShardedSaveOptions& options = {});

// save_sharded_checkpoint behind the caller: copies every slice's values (each fetched first
// where options.fetch is set) into new host memory, pinned when they are on CUDA, starts the
// save of the copies on a thread of its own and returns once the copies are made, so the caller
// may change the originals at once. The future holds the checkpoint's directory, or the save's
// error; its destructor waits for the save. `group` must be one no other thread uses until the
// save is done (a ProcessGroup::new_group of the training group): collectives of one group are
// matched across ranks by the order they are issued in. The host memory the copies take is the
// rank's share of the checkpoint, freed when the save ends, or kept in options.staging for the
// next save.
std::future<std::string> save_sharded_checkpoint_async(const std::string& root,
                                                       const std::string& name,
                                                       const std::vector<TensorSpec>& tensors,
                                                       const std::vector<FlatSlice>& slices,
                                                       std::shared_ptr<ProcessGroup> group,
                                                       ShardedSaveOptions options = {});

// Reads a sharded checkpoint directory. The constructor validates index.json and the presence
// and size of every file it lists; reads fetch only the byte ranges they need (pread) and check
// the crc32 of every slice they touch. Errors about the checkpoint's contents are
// std::invalid_argument naming the file (and the tensor). Reads are const and thread-safe.
class ShardedCheckpointReader {
 public:
  struct FileInfo {
    std::string name;  // relative to the checkpoint directory
    int rank = 0;
    int64_t bytes = 0;
    int64_t slices = 0;
  };

  explicit ShardedCheckpointReader(std::string dir);

  const std::string& dir() const { return dir_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // The tensor called `name`, or null when the checkpoint has none.
  const TensorSpec* find(const std::string& name) const;
  const std::vector<FileInfo>& files() const { return files_; }
  // The layout the checkpoint was written with (informational).
  const std::string& strategy() const { return strategy_; }
  int world_size() const { return world_size_; }
  int version() const { return version_; }
  // The "metadata" object of index.json, as JSON text.
  const std::string& metadata() const { return metadata_; }
  // index.json as written.
  const std::string& index_json() const { return index_text_; }

  // The whole tensor, shaped; a new CPU tensor owned by the caller.
  at::Tensor read(const std::string& name) const;
  // Elements [offset, offset + numel) of the tensor's flattening, as a new 1-D CPU tensor.
  at::Tensor read_flat(const std::string& name, int64_t offset, int64_t numel) const;
  // The same into `out` (1-D, contiguous, CPU, the tensor's dtype; its numel is the length).
  void read_flat_into(const std::string& name, int64_t offset, at::Tensor out) const;
  // The rank_state tensors written by rank `rank`; empty when that rank wrote none (or the
  // checkpoint had fewer ranks).
  std::map<std::string, at::Tensor> rank_state(int rank) const;
  // Checks every file's own safetensors header (the format's rules, and a tensor at every byte
  // range index.json records), then recomputes the crc32 of every file in full; throws naming
  // the first file that differs.
  void verify() const;

 private:
  struct Piece {
    int file = 0;
    int64_t offset = 0;  // in the tensor's flattening
    int64_t numel = 0;
    int64_t begin = 0;  // byte range in the file
    uint32_t crc32 = 0;
  };
  struct StateEntry {
    std::string name;
    TensorSpec spec;
    int64_t begin = 0;
    uint32_t crc32 = 0;
  };
  const std::vector<Piece>& pieces_of(const std::string& name) const;
  std::string file_path(int file) const;

  std::string dir_;
  std::string strategy_;
  int world_size_ = 1;
  int version_ = 0;
  std::string metadata_;
  std::string index_text_;
  std::vector<TensorSpec> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::vector<FileInfo> files_;
  std::vector<uint32_t> file_crc_;
  std::map<std::string, std::vector<Piece>> pieces_;    // by tensor, sorted by offset
  std::map<int, std::vector<StateEntry>> rank_states_;  // by rank
};

// The tensors of a plain safetensors file (names, shapes, dtypes) in the order its header lists
// them, after checking the header against the format's rules; reads no tensor data. Throws
// std::invalid_argument naming the file and the tensor.
std::vector<TensorSpec> read_safetensors_specs(const std::string& path);

// Rewrites checkpoint `dir` as a checkpoint of `world_size` rank files (rank r holding
// shard_range(numel, world_size, r) of every tensor) in the new directory `out`, which must not
// exist; it appears only when complete. Streams one slice at a time, so memory stays near the
// largest slice. Rank r keeps the rank state of old rank r (ranks beyond the old world size have
// none). Metadata is kept. `progress`, when given, is called before each file and each slice with
// the bytes written so far and in all; it may throw to stop the reshard (an interrupt). Whatever
// ends it early, what it wrote is removed and the exception passes on. Throws std::invalid_argument
// for a bad source or an existing `out`.
using ReshardProgress = std::function<void(int64_t bytes_done, int64_t bytes_total)>;
void reshard_checkpoint(const std::string& dir, const std::string& out, int world_size,
                        const ReshardProgress& progress = nullptr);

}  // namespace shardtrain
