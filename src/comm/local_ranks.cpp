#include <exception>
#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "shardtrain/rendezvous.h"

namespace shardtrain {

void run_local_ranks(int world_size, const std::function<void(ProcessGroup&)>& fn,
                     ProcessGroupOptions options) {
  TORCH_CHECK(world_size >= 1, "run_local_ranks: world size must be at least 1, got ", world_size);
  if (options.hostname_.empty() && options.interface_.empty()) options.hostname("127.0.0.1");
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto group = init_process_group(store, rank, world_size, options);
        fn(*group);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < world_size; ++rank) {
    if (!errors[rank].empty()) {
      throw std::runtime_error("rank " + std::to_string(rank) + ": " + errors[rank]);
    }
  }
}

}  // namespace shardtrain
