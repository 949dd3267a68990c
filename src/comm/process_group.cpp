#include <net/if.h>

#include <sstream>
#include <thread>

#include "comm/gloo_group.h"
#include "comm/join.h"
#include "shardtrain/dist.h"
#ifdef SHARDTRAIN_WITH_NCCL
#include "comm/nccl_group.h"
#endif

namespace shardtrain {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

std::string to_string(Backend backend) { return backend == Backend::kGloo ? "gloo" : "nccl"; }

Backend backend_from_string(const std::string& name) {
  if (name == "gloo") return Backend::kGloo;
  if (name == "nccl") return Backend::kNccl;
  throw std::invalid_argument("unknown backend '" + name + "' (expected gloo or nccl)");
}

ShardRange shard_range(int64_t numel, int world_size, int rank) {
  TORCH_CHECK(world_size > 0 && rank >= 0 && rank < world_size, "shard_range: rank ", rank,
              " is outside a world of size ", world_size);
  const int64_t per_rank = (numel + world_size - 1) / world_size;
  const int64_t begin = std::min<int64_t>(numel, per_rank * rank);
  const int64_t end = std::min<int64_t>(numel, begin + per_rank);
  return ShardRange{begin, end - begin};
}

void ProcessGroup::check_tensor(const char* op, const at::Tensor& tensor) const {
  TORCH_CHECK(tensor.defined(), op, ": the tensor is undefined");
  TORCH_CHECK(tensor.is_contiguous(), op, ": the tensor must be contiguous");
  const bool cuda = tensor.is_cuda();
  TORCH_CHECK(cuda == (backend() == Backend::kNccl), op, ": a tensor on ", tensor.device(),
              " cannot go through the ", to_string(backend()), " backend of group '", name_, "'");
}

void ProcessGroup::check_peer(const char* op, int peer) const {
  TORCH_CHECK(peer >= 0 && peer < size(), op, ": rank ", peer, " is not in group '", name_,
              "' of size ", size());
}

int64_t ProcessGroup::check_splits(const at::Tensor& input, const at::Tensor& output,
                                   std::vector<int64_t>& input_splits,
                                   std::vector<int64_t>& output_splits) const {
  TORCH_CHECK(input.scalar_type() == output.scalar_type(), "all_to_all: input dtype ",
              input.scalar_type(), " differs from output dtype ", output.scalar_type());
  TORCH_CHECK(input.dim() >= 1 && output.dim() >= 1, "all_to_all: the tensors need rows (dim 0)");
  const int64_t row = c10::multiply_integers(input.sizes().slice(1));  // 1 for a 1-D tensor
  const int64_t out_row = c10::multiply_integers(output.sizes().slice(1));
  TORCH_CHECK(row == out_row, "all_to_all: a row of the input holds ", row,
              " elements but one of the output ", out_row);
  auto fill = [&](std::vector<int64_t>& splits, const at::Tensor& t, const char* which) {
    if (splits.empty()) {
      TORCH_CHECK(t.size(0) % size() == 0, "all_to_all: ", t.size(0), " ", which,
                  " rows do not split equally over ", size(), " ranks");
      splits.assign(size(), t.size(0) / size());
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == size(), "all_to_all: ", splits.size(), " ",
                which, " splits for a group of ", size());
    int64_t total = 0;
    for (int64_t rows : splits) {
      TORCH_CHECK(rows >= 0, "all_to_all: a negative ", which, " split ", rows);
      total += rows;
    }
    TORCH_CHECK(total == t.size(0), "all_to_all: the ", which, " splits add up to ", total,
                " rows but the ", which, " has ", t.size(0));
  };
  fill(input_splits, input, "input");
  fill(output_splits, output, "output");
  return row;
}

ProcessGroup::SubgroupPlan ProcessGroup::plan_subgroup(const std::vector<int>& ranks) {
  TORCH_CHECK(!ranks.empty(), "new_group: the rank list is empty");
  SubgroupPlan plan;
  for (size_t i = 0; i < ranks.size(); ++i) {
    check_peer("new_group", ranks[i]);
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK(ranks[j] != ranks[i], "new_group: rank ", ranks[i], " is listed twice");
    }
    plan.global_ranks.push_back(global_ranks_[ranks[i]]);
    if (ranks[i] == rank_) plan.rank = static_cast<int>(i);
  }
  TORCH_CHECK(plan.rank >= 0, "new_group: rank ", rank_, " of group '", name_,
              "' called it but is not in the list [", detail::join_ranks(ranks), "]");
  const std::string key = detail::join_ranks(plan.global_ranks);
  int generation;
  {
    std::lock_guard<std::mutex> lock(subgroups_mutex_);
    generation = subgroup_count_[key]++;
  }
  // Every member derives the same name: the parent, the members, and how many times this same
  // list was split off before, so a repeated split gets fresh store keys.
  plan.name = name_ + "/[" + key + "]#" + std::to_string(generation);
  return plan;
}

namespace detail {

void check_interface(const std::string& name) {
  if (name.empty() || if_nametoindex(name.c_str()) != 0) return;
  throw std::invalid_argument("network interface '" + name +
                              "' (--iface, GLOO_SOCKET_IFNAME) does not exist on this host (`ip "
                              "-brief link` lists those it has)");
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  return out.str();
}

void wait_for_members(c10d::Store& store, const std::string& group, int rank,
                      const std::vector<int>& members, std::chrono::milliseconds timeout) {
  const std::string prefix = "shardtrain/joined/" + group + "/";
  store.set(prefix + std::to_string(rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (size_t r = 0; r < members.size(); ++r) keys.push_back(prefix + std::to_string(r));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (!store.check(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      std::vector<int> missing;
      for (size_t r = 0; r < members.size(); ++r) {
        if (!store.check({keys[r]})) missing.push_back(members[r]);
      }
      std::ostringstream out;
      out << "rendezvous of group '" << group << "' timed out after " << timeout.count()
          << " ms: " << (missing.size() == 1 ? "rank " : "ranks ") << join_ranks(missing)
          << " never joined (" << members.size() - missing.size() << " of " << members.size()
          << " ranks arrived)";
      throw std::runtime_error(out.str());
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

}  // namespace detail

std::shared_ptr<ProcessGroup> init_process_group(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                 int world_size,
                                                 const ProcessGroupOptions& options) {
  TORCH_CHECK(world_size >= 1, "world size must be at least 1, got ", world_size);
  TORCH_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " is outside the world of size ",
              world_size);
  std::vector<int> ranks(world_size);
  for (int r = 0; r < world_size; ++r) ranks[r] = r;
  if (options.backend_ == Backend::kNccl) {
#ifdef SHARDTRAIN_WITH_NCCL
    return std::make_shared<detail::NcclProcessGroup>("world", std::move(store), rank,
                                                      std::move(ranks), options);
#else
    throw std::runtime_error(
        "backend nccl is not available: this shardtrain was built against a LibTorch without "
        "CUDA; use backend gloo");
#endif
  }
  return std::make_shared<detail::GlooProcessGroup>("world", std::move(store), rank,
                                                    std::move(ranks), options,
                                                    detail::make_gloo_device(options));
}

}  // namespace shardtrain
