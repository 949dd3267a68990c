// Expert parallelism's parts on in-process ranks over Gloo: the dispatch and combine deliver
// every row to its expert's rank and back, with no rows for some experts and none at all from a
// rank; a mixture-of-experts block split over 2 ranks computes what the whole block computes,
// forward and every gradient (the experts' averaged over the ranks, as data parallelism
// averages); an expert that receives no token gets a zero gradient; the checkpoint specs list
// every expert on every rank; the mesh's ep groups and expert mesh are the ranks they should be.
#include "parallel/expert/expert_parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>

#include "model/layers.h"
#include "shardtrain/mesh.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace expert_parallel_test {

std::shared_ptr<ProcessGroup> borrowed(ProcessGroup& group) {
  return std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
}

double relative(const at::Tensor& got, const at::Tensor& want) {
  const double scale = std::max(want.norm().item<double>(), 1e-30);
  return (got - want).norm().item<double>() / scale;
}

TEST(ExpertDispatch, RowsReachTheirExpertsAndComeBack) {
  // 4 experts over 2 ranks. Rank 0 sends 3 rows to expert 0, none to experts 1 and 2, 2 to
  // expert 3; rank 1 sends nothing at all. Each "expert" multiplies its rows by its index + 1.
  run_local_ranks(2, [](ProcessGroup& group) {
    const auto split = detail::make_expert_split(borrowed(group), 4);
    const std::vector<int64_t> counts =
        group.rank() == 0 ? std::vector<int64_t>{3, 0, 0, 2} : std::vector<int64_t>{0, 0, 0, 0};
    const int64_t n = counts[0] + counts[3];
    torch::manual_seed(7);
    const at::Tensor rows = at::randn({n, 5}).requires_grad_();
    const auto received = split->dispatch(rows, counts);
    const std::vector<int64_t> want_counts =
        group.rank() == 0 ? std::vector<int64_t>{3, 0} : std::vector<int64_t>{0, 2};
    EXPECT_EQ(received.counts, want_counts);
    std::vector<at::Tensor> outputs;
    int64_t at = 0;
    for (int64_t l = 0; l < 2; ++l) {
      const double factor = static_cast<double>(group.rank() * 2 + l + 1);
      outputs.push_back(received.rows.narrow(0, at, received.counts[l]) * factor);
      at += received.counts[l];
    }
    const at::Tensor back = split->combine(at::cat(outputs), received);
    ASSERT_EQ(back.sizes(), rows.sizes());
    at::Tensor factors = at::ones({n, 1});
    if (n > 0) factors.narrow(0, 3, 2).fill_(4.0);
    EXPECT_TRUE(at::allclose(back, rows * factors));
    back.sum().backward();
    if (n > 0) {
      EXPECT_TRUE(at::allclose(rows.grad(), factors.expand({n, 5})));
    }
  });
}

ModelConfig block_config() {
  ModelConfig c = model_preset("tiny-moe");
  c.d_model = 16;
  c.ffn_hidden = 24;
  c.router_aux_loss_coef = 0.1;
  c.validate();
  return c;
}

// Copies `whole`'s values into `part`'s parameters of the same names.
void copy_values(detail::Moe& part, detail::Moe& whole) {
  torch::NoGradGuard no_grad;
  auto source = whole->named_parameters();
  for (auto& item : part->named_parameters()) item.value().copy_(source[item.key()]);
}

struct BlockGrads {
  at::Tensor out, x_grad;
  std::map<std::string, at::Tensor> params;
};

// Forward and backward of `block` on x with the output gradient `dout`.
BlockGrads run_block(detail::Moe& block, detail::MoeState& state, const at::Tensor& input,
                     const at::Tensor& dout) {
  block->zero_grad();
  const at::Tensor x = input.clone().requires_grad_();
  BlockGrads g;
  g.out = block->forward(x, &state);
  (g.out * dout).sum().backward();
  g.x_grad = x.grad();
  for (const auto& item : block->named_parameters()) {
    g.params[item.key()] = item.value().grad().clone();  // zero_grad() zeroes it in place
  }
  return g;
}

// Each rank's tokens x_r and output gradients dout_r; the whole block's gradients from both.
void expect_split_block_matches(const ModelConfig& c,
                                const std::function<void(detail::Moe&)>& prepare) {
  torch::manual_seed(11);
  detail::Moe whole(c, 0, false);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : whole->parameters()) p.copy_(at::randn_like(p) * 0.3);
  }
  prepare(whole);
  whole->train();
  std::vector<at::Tensor> xs, douts;
  for (int r = 0; r < 2; ++r) {
    xs.push_back(at::rand({2, 5, c.d_model}) + 0.1);
    douts.push_back(at::randn({2, 5, c.d_model}));
  }
  detail::MoeState reference_state;
  reference_state.tokens = at::zeros({1, c.n_experts}, at::kLong);
  std::vector<BlockGrads> want;
  for (int r = 0; r < 2; ++r) want.push_back(run_block(whole, reference_state, xs[r], douts[r]));

  std::mutex mutex;
  run_local_ranks(2, [&](ProcessGroup& group) {
    const int r = group.rank();
    detail::Moe part(c, 0, false, /*first_expert=*/2 * r, /*count=*/2);
    copy_values(part, whole);
    part->train();
    detail::MoeState state;
    state.tokens = at::zeros({1, c.n_experts}, at::kLong);
    state.split = detail::make_expert_split(borrowed(group), c.n_experts);
    const BlockGrads got =
        run_block(part, state, xs[static_cast<size_t>(r)], douts[static_cast<size_t>(r)]);
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_LT(relative(got.out, want[static_cast<size_t>(r)].out), 1e-6) << "rank " << r;
    EXPECT_LT(relative(got.x_grad, want[static_cast<size_t>(r)].x_grad), 1e-6) << "rank " << r;
    for (const auto& [name, grad] : got.params) {
      ASSERT_TRUE(grad.defined()) << name;
      // The router is this rank's own; an expert's gradient is the mean over both ranks'
      // tokens, as data parallelism would average it.
      const bool expert = detail::is_expert_tensor("blocks.0.moe." + name);
      const at::Tensor expected = expert ? (want[0].params.at(name) + want[1].params.at(name)) / 2.0
                                         : want[static_cast<size_t>(r)].params.at(name);
      if (expected.abs().max().item<double>() == 0.0) {
        EXPECT_EQ(grad.abs().max().item<double>(), 0.0) << name;
      } else {
        EXPECT_LT(relative(grad, expected), 1e-6) << "rank " << r << " " << name;
      }
    }
    EXPECT_EQ(state.tokens.sum().item<int64_t>(), 2 * 5 * c.experts_per_token);
  });
}

TEST(ExpertParallelBlock, TwoRanksComputeAsTheWholeBlock) {
  expect_split_block_matches(block_config(), [](detail::Moe&) {});
}

TEST(ExpertParallelBlock, AnExpertThatReceivesNoTokenGetsAZeroGradient) {
  // Every token prefers experts 0 and 1 (rank 0's): positive inputs, positive router rows for
  // them, zeros for experts 2 and 3, whose rank receives nothing.
  expect_split_block_matches(block_config(), [](detail::Moe& whole) {
    torch::NoGradGuard no_grad;
    whole->router->weight.zero_();
    whole->router->weight[0].fill_(1.0);
    whole->router->weight[1].fill_(0.5);
  });
}

TEST(ExpertParallel, EveryRankListsEveryExpert) {
  const std::vector<TensorSpec> rank1 = {{"blocks.0.moe.router.weight", {4, 8}},
                                         {"blocks.0.moe.experts.2.gate.weight", {6, 8}},
                                         {"blocks.0.moe.experts.2.down.weight", {8, 6}},
                                         {"blocks.0.moe.experts.3.gate.weight", {6, 8}},
                                         {"blocks.0.moe.experts.3.down.weight", {8, 6}},
                                         {"norm.weight", {8}}};
  std::vector<TensorSpec> rank0 = rank1;
  for (auto& spec : rank0) {
    const size_t at = spec.name.find("experts.");
    if (at != std::string::npos) spec.name[at + 8] = spec.name[at + 8] == '2' ? '0' : '1';
  }
  const auto a = detail::with_every_expert(rank0, 4), b = detail::with_every_expert(rank1, 4);
  ASSERT_EQ(a.size(), 1u + 8u + 1u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].shape, b[i].shape);
  }
  EXPECT_EQ(a[1].name, "blocks.0.moe.experts.0.gate.weight");
  EXPECT_EQ(a[4].name, "blocks.0.moe.experts.3.gate.weight");
  EXPECT_EQ(a[5].name, "blocks.0.moe.experts.0.down.weight");
}

TEST(ExpertParallel, TheMeshCarvesEpOutOfDpShard) {
  // 8 ranks: tp = 2 innermost, dp_shard = 4 with ep = 2 inside it.
  std::mutex mutex;
  run_local_ranks(8, [&](ProcessGroup& world) {
    const DeviceMesh mesh(borrowed(world), MeshShape().tp(2).ep(2));
    const int rank = world.rank();
    const int shard = mesh.coordinate(MeshAxis::kDpShard);
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(mesh.ep_size(), 2);
    EXPECT_EQ(mesh.ep_rank(), shard % 2) << rank;
    // rank = dp_shard x 2 + tp. The ep group: this rank and its dp_shard neighbour of the same
    // tp coordinate; the ranks holding the same experts: every other dp_shard coordinate.
    const int tp = rank % 2, pair = shard / 2 * 2;
    EXPECT_EQ(mesh.ep_ptr()->global_ranks(), (std::vector<int>{pair * 2 + tp, (pair + 1) * 2 + tp}))
        << rank;
    const DeviceMesh& experts = mesh.expert_mesh();
    EXPECT_EQ(experts.size(MeshAxis::kDpShard), 2) << rank;
    EXPECT_EQ(experts.size(MeshAxis::kTp), 2) << rank;
    const int inner = shard % 2;
    EXPECT_EQ(experts.dp().global_ranks(), (std::vector<int>{inner * 2 + tp, (inner + 2) * 2 + tp}))
        << rank;
    EXPECT_EQ(experts.world().size(), 4) << rank;
    EXPECT_EQ(experts.group(MeshAxis::kTp).global_ranks(),
              (std::vector<int>{rank - tp, rank - tp + 1}))
        << rank;
  });
  run_local_ranks(2, [](ProcessGroup& world) {
    try {
      const DeviceMesh mesh(borrowed(world), MeshShape().ep(4));
      ADD_FAILURE() << "ep=4 accepted over 2 ranks";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("ep=4 does not divide dp_shard = 2"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace expert_parallel_test
}  // namespace shardtrain
