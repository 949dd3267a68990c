// An MLP defined here, not in shardtrain, trained with FSDP on every rank the launcher started:
// each block is sharded, then the whole model, and the optimizer steps the shards.
//   shardtrain launch --nproc 2 -- ./fully_shard_mlp
// Prints the loss of each step (the mean over all ranks), the same at any number of ranks.
#include <shardtrain/shardtrain.h>
#include <torch/torch.h>

#include <cstdio>

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t width)
      : fc(register_module("fc", torch::nn::Linear(width, width))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})))) {}
  torch::Tensor forward(const torch::Tensor& x) { return x + torch::gelu(fc(norm(x))); }
  torch::nn::Linear fc;
  torch::nn::LayerNorm norm;
};
TORCH_MODULE(Block);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t in, int64_t width, int64_t out, int depth)
      : input(register_module("input", torch::nn::Linear(in, width))),
        output(register_module("output", torch::nn::Linear(width, out))) {
    for (int i = 0; i < depth; ++i) {
      blocks.push_back(register_module("blocks_" + std::to_string(i), Block(width)));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = input(x);
    // Sharded children are called through shardtrain::call: it gathers their parameters
    // before they compute and frees them after (LibTorch C++ has no forward hooks).
    for (auto& block : blocks) x = shardtrain::call(block, x);
    return output(x);
  }
  torch::nn::Linear input, output;
  std::vector<Block> blocks;
};
TORCH_MODULE(Mlp);

int main() {
  torch::set_num_threads(1);
  auto world = shardtrain::init_from_environment();
  shardtrain::DeviceMesh mesh(world, shardtrain::resolve_mesh(shardtrain::MeshShape(), world->size()));

  torch::manual_seed(0);  // the same initial values everywhere (fully_shard also syncs rank 0's)
  Mlp model(16, 30, 4, 3);
  for (auto& block : model->blocks) shardtrain::fully_shard(block.ptr(), mesh);
  auto root = shardtrain::fully_shard(model.ptr(), mesh);
  torch::optim::AdamW optimizer(root->parameters(), torch::optim::AdamWOptions(1e-2));

  // A global batch of 24 rows; each rank takes its slice.
  torch::Tensor inputs = torch::sin(torch::arange(24 * 16, torch::kFloat) * 0.1).view({24, 16});
  torch::Tensor targets = torch::cos(torch::arange(24 * 4, torch::kFloat) * 0.3).view({24, 4});
  const int64_t rows = 24 / world->size();
  inputs = inputs.narrow(0, world->rank() * rows, rows);
  targets = targets.narrow(0, world->rank() * rows, rows);

  for (int step = 1; step <= 10; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(shardtrain::call(model, inputs), targets);
    loss.backward();
    root->clip_grad_norm(1.0);
    optimizer.step();
    torch::Tensor mean = loss.detach().clone();
    world->all_reduce(mean, shardtrain::ReduceOp::kAvg)->wait();
    if (world->rank() == 0) std::printf("step %d loss %.7f\n", step, mean.item<double>());
  }
  return 0;
}
