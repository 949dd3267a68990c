// Two ranks in one process through the installed library: prints the all-reduced value.
#include <shardtrain/shardtrain.h>

#include <iostream>

int main() {
  float result = 0;
  shardtrain::run_local_ranks(2, [&](shardtrain::ProcessGroup& group) {
    at::Tensor t = at::full({4}, static_cast<float>(group.rank() + 1));
    group.all_reduce(t)->wait();
    if (group.rank() == 0) result = t[0].item<float>();
  });
  std::cout << "consumer all_reduce " << result << "\n";
  return result == 3.0f ? 0 : 1;
}
