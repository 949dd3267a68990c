// add_lora on a user's module of torch::nn::Linear layers, trained under DDP and fully_shard:
// the same losses and adapters as one process, and the frozen weights untouched.
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "shardtrain/ddp.h"
#include "shardtrain/fully_shard.h"
#include "shardtrain/lora.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace lora_modules_test {

constexpr int64_t kBatch = 8;

// A user's block: its linear layer is called through shardtrain::call, so an adapter applies.
struct LayerImpl : torch::nn::Module {
  explicit LayerImpl(int64_t width) { fc = register_module("fc", torch::nn::Linear(width, width)); }
  at::Tensor forward(const at::Tensor& x) { return at::tanh(call(fc, x)) + x; }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Layer);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    input = register_module("input", torch::nn::Linear(6, 8));
    l1 = register_module("l1", Layer(8));
    l2 = register_module("l2", Layer(8));
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    return call(head, call(l2, call(l1, call(input, x))));
  }
  torch::nn::Linear input{nullptr}, head{nullptr};
  Layer l1{nullptr}, l2{nullptr};
};
TORCH_MODULE(Net);

// The same net on every rank: adapters on the blocks' layers, every value set by formula (B
// not zero, so that every adapter weight has a gradient from the first step).
Net make_net() {
  Net net;
  add_lora(*net, LoraOptions().rank(2).alpha(4).target_modules({"fc"}));
  torch::NoGradGuard no_grad;
  double k = 0;
  for (auto& p : net->parameters()) {
    p.copy_(at::sin(at::arange(p.numel(), at::kDouble) * 0.41 + (k += 1.0)).view_as(p) * 0.3);
  }
  return net;
}

at::Tensor inputs() { return at::cos(at::arange(kBatch * 6, at::kFloat) * 0.13).view({kBatch, 6}); }
at::Tensor targets() { return at::sin(at::arange(kBatch * 3, at::kFloat) * 0.29).view({kBatch, 3}); }

std::vector<at::Tensor> trainable(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) {
    if (p.requires_grad()) out.push_back(p);
  }
  return out;
}

struct Losses {
  std::vector<double> losses;
};

// `wrap` applies the strategy and returns what the optimizer steps (null: one process).
Losses train(ProcessGroup* group,
          const std::function<std::vector<at::Tensor>(Net&, ProcessGroup&)>& wrap) {
  Net net = make_net();
  std::vector<at::Tensor> params = trainable(group ? wrap(net, *group) : net->parameters());
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(0.05));
  const int world = group ? group->size() : 1, rank = group ? group->rank() : 0;
  const int64_t per_rank = kBatch / world;
  Losses run;
  for (int s = 0; s < 5; ++s) {
    adamw.zero_grad();
    const at::Tensor loss = (call(net, inputs().narrow(0, rank * per_rank, per_rank)) -
                             targets().narrow(0, rank * per_rank, per_rank))
                                .pow(2)
                                .mean();
    loss.backward();
    adamw.step();
    at::Tensor global = at::tensor(loss.item<double>(), at::kDouble);
    if (group) group->all_reduce(global, ReduceOp::kAvg)->wait();
    run.losses.push_back(global.item<double>());
  }
  return run;
}

void expect_same(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * want[i]) << i;
}

TEST(LoraModules, DdpAndFullyShardTrainTheAdaptersAsOneProcess) {
  const Losses want = train(nullptr, nullptr);
  EXPECT_LT(want.losses.back(), want.losses.front());

  std::vector<double> ddp_losses;
  run_local_ranks(2, [&](ProcessGroup& group) {
    std::unique_ptr<DistributedDataParallel> ddp;
    const Losses got = train(&group, [&ddp](Net& net, ProcessGroup& g) {
      ddp = std::make_unique<DistributedDataParallel>(
          net.ptr(), std::shared_ptr<ProcessGroup>(&g, [](ProcessGroup*) {}));
      return net->parameters();
    });
    if (group.rank() == 0) ddp_losses = got.losses;
  });
  expect_same(ddp_losses, want.losses);

  std::vector<double> fsdp_losses;
  run_local_ranks(2, [&](ProcessGroup& group) {
    std::vector<std::shared_ptr<FSDPModule>> sharded;
    const Losses got = train(&group, [&sharded](Net& net, ProcessGroup& g) {
      auto world = std::shared_ptr<ProcessGroup>(&g, [](ProcessGroup*) {});
      DeviceMesh mesh(world, resolve_mesh(MeshShape(), g.size()));
      sharded.push_back(fully_shard(net->l1.ptr(), mesh));
      sharded.push_back(fully_shard(net->l2.ptr(), mesh));
      sharded.push_back(fully_shard(net.ptr(), mesh));
      return sharded.back()->parameters();
    });
    if (group.rank() == 0) fsdp_losses = got.losses;
  });
  expect_same(fsdp_losses, want.losses);
}

TEST(LoraModules, TheFrozenWeightsNeverChange) {
  Net net = make_net();
  const at::Tensor before = net->l1->fc->weight.clone();
  torch::optim::AdamW adamw(trainable(net->parameters()), torch::optim::AdamWOptions(0.05));
  for (int s = 0; s < 3; ++s) {
    adamw.zero_grad();
    (call(net, inputs()) - targets()).pow(2).mean().backward();
    adamw.step();
  }
  EXPECT_TRUE(at::equal(net->l1->fc->weight, before));
  EXPECT_FALSE(at::equal(net->named_parameters()["l1.fc.lora_B.weight"],
                         make_net()->named_parameters()["l1.fc.lora_B.weight"]));
}

}  // namespace lora_modules_test
}  // namespace shardtrain
