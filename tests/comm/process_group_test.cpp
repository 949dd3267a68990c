#include <gtest/gtest.h>

#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "shardtrain/dist.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace process_group_test {

ProcessGroupOptions test_options() {
  return ProcessGroupOptions().timeout(std::chrono::seconds(60));
}

// Small integers, different on every rank: sums of up to 4 ranks stay exact in bf16.
at::Tensor rank_values(int64_t numel, int rank, at::ScalarType dtype) {
  return (at::arange(numel, at::kFloat).remainder(5) * (rank + 1) + rank).to(dtype);
}

struct Case {
  int world;
  at::ScalarType dtype;
};
void PrintTo(const Case& c, std::ostream* out) { *out << "world " << c.world << " " << c.dtype; }

class CollectiveTest : public ::testing::TestWithParam<Case> {};

TEST(ShardRangeTest, CoversTheTensorInOrder) {
  for (int64_t numel : {0, 1, 7, 10, 12}) {
    for (int world = 1; world <= 5; ++world) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const ShardRange s = shard_range(numel, world, r);
        EXPECT_EQ(s.offset, std::min(next, numel));
        EXPECT_LE(s.numel, (numel + world - 1) / world);
        next = s.offset + s.numel;
      }
      EXPECT_EQ(next, numel) << numel << " over " << world;
    }
  }
  EXPECT_EQ(shard_range(10, 4, 3).numel, 1);  // 3 + 3 + 3 + 1
  EXPECT_EQ(shard_range(5, 4, 3).numel, 0);   // 2 + 2 + 1 + 0
}

TEST_P(CollectiveTest, AllReduceSumAvgMax) {
  const auto [world, dtype] = GetParam();
  const int64_t numel = 7 * world + 3;  // not divisible by the world size
  run_local_ranks(
      world,
      [&, world = world, dtype = dtype](ProcessGroup& group) {
        at::Tensor expected_sum = at::zeros({numel}, at::kFloat);
        at::Tensor expected_max = rank_values(numel, 0, at::kFloat);
        for (int r = 0; r < world; ++r) {
          expected_sum += rank_values(numel, r, at::kFloat);
          expected_max = at::maximum(expected_max, rank_values(numel, r, at::kFloat));
        }
        auto sum = rank_values(numel, group.rank(), dtype);
        group.all_reduce(sum, ReduceOp::kSum)->wait();
        EXPECT_TRUE(at::equal(sum.to(at::kFloat), expected_sum));

        auto max = rank_values(numel, group.rank(), dtype);
        group.all_reduce(max, ReduceOp::kMax)->wait();
        EXPECT_TRUE(at::equal(max.to(at::kFloat), expected_max));

        auto avg = rank_values(numel, group.rank(), dtype);
        group.all_reduce(avg, ReduceOp::kAvg)->wait();
        const double tolerance = dtype == at::kBFloat16 ? 1e-2 : 1e-6;
        EXPECT_TRUE(at::allclose(avg.to(at::kFloat), expected_sum / world, tolerance, tolerance));
      },
      test_options());
}

TEST_P(CollectiveTest, AllGatherIntoOneFlatTensor) {
  const auto [world, dtype] = GetParam();
  for (int64_t numel : {int64_t{1}, int64_t{10}, int64_t{4 * 3 + 1}}) {
    run_local_ranks(
        world,
        [&, world = world, dtype = dtype](ProcessGroup& group) {
          // Each rank owns its slice of the flat layout; the slice holds rank-specific values.
          at::Tensor expected = at::empty({numel}, dtype);
          for (int r = 0; r < world; ++r) {
            const ShardRange s = shard_range(numel, world, r);
            expected.narrow(0, s.offset, s.numel).copy_(rank_values(s.numel, r, dtype));
          }
          const ShardRange mine = shard_range(numel, world, group.rank());
          at::Tensor input = rank_values(mine.numel, group.rank(), dtype);
          at::Tensor output = at::full({numel}, -1, dtype);
          group.all_gather(input, output)->wait();
          EXPECT_TRUE(at::equal(output, expected)) << "numel " << numel;
        },
        test_options());
  }
}

TEST_P(CollectiveTest, ReduceScatterFromOneFlatTensor) {
  const auto [world, dtype] = GetParam();
  for (int64_t numel : {int64_t{1}, int64_t{10}, int64_t{4 * 3 + 1}}) {
    run_local_ranks(
        world,
        [&, world = world, dtype = dtype](ProcessGroup& group) {
          at::Tensor total = at::zeros({numel}, at::kFloat);
          for (int r = 0; r < world; ++r) total += rank_values(numel, r, at::kFloat);
          const ShardRange mine = shard_range(numel, world, group.rank());
          at::Tensor input = rank_values(numel, group.rank(), dtype);
          const at::Tensor input_before = input.clone();
          at::Tensor output = at::full({mine.numel}, -1, dtype);
          group.reduce_scatter(input, output)->wait();
          EXPECT_TRUE(at::equal(output.to(at::kFloat), total.narrow(0, mine.offset, mine.numel)))
              << "numel " << numel;
          EXPECT_TRUE(at::equal(input, input_before)) << "reduce_scatter must not modify its input";

          at::Tensor averaged = at::empty({mine.numel}, dtype);
          group.reduce_scatter(input, averaged, ReduceOp::kAvg)->wait();
          const double tolerance = dtype == at::kBFloat16 ? 1e-2 : 1e-6;
          EXPECT_TRUE(at::allclose(averaged.to(at::kFloat),
                                   total.narrow(0, mine.offset, mine.numel) / world, tolerance,
                                   tolerance));
        },
        test_options());
  }
}

// Rank r sends (r + d) % 3 rows to rank d (some none), each row [rank, destination, index,
// ...]: every rank receives, in rank order, exactly the rows addressed to it; then the counts
// of unknown splits, exchanged first, and equal splits.
TEST_P(CollectiveTest, AllToAllSendsEachRankItsRows) {
  const auto [world, dtype] = GetParam();
  run_local_ranks(
      world,
      [&, world = world, dtype = dtype](ProcessGroup& group) {
        const int me = group.rank();
        auto rows_to = [](int from, int to) { return static_cast<int64_t>((from + to) % 3); };
        auto block = [&](int from, int to) {
          const int64_t n = rows_to(from, to);
          at::Tensor rows = at::empty({n, 3}, at::kFloat);
          for (int64_t i = 0; i < n; ++i) {
            rows[i] = at::tensor({static_cast<float>(from), static_cast<float>(to),
                                  static_cast<float>(i)});
          }
          return rows;
        };
        std::vector<at::Tensor> sent, expected;
        std::vector<int64_t> in_splits, out_splits;
        for (int r = 0; r < world; ++r) {
          sent.push_back(block(me, r));
          expected.push_back(block(r, me));
          in_splits.push_back(rows_to(me, r));
          out_splits.push_back(rows_to(r, me));
        }
        const at::Tensor input = at::cat(sent).to(dtype);
        at::Tensor output = at::full({at::cat(expected).size(0), 3}, -1, dtype);
        group.all_to_all(input, output, in_splits, out_splits)->wait();
        EXPECT_TRUE(at::equal(output.to(at::kFloat), at::cat(expected)));

        // Counts nobody knows yet: one int64 per rank exchanged first.
        at::Tensor counts = at::tensor(in_splits, at::kLong);
        at::Tensor learned = at::empty({world}, at::kLong);
        group.all_to_all(counts, learned, {}, {})->wait();
        EXPECT_EQ(std::vector<int64_t>(learned.data_ptr<int64_t>(),
                                       learned.data_ptr<int64_t>() + world),
                  out_splits);
      },
      test_options());
}

TEST_P(CollectiveTest, BroadcastFromTheLastRank) {
  const auto [world, dtype] = GetParam();
  run_local_ranks(
      world,
      [&, world = world, dtype = dtype](ProcessGroup& group) {
        at::Tensor tensor = rank_values(11, group.rank(), dtype);
        group.broadcast(tensor, world - 1)->wait();
        EXPECT_TRUE(at::equal(tensor, rank_values(11, world - 1, dtype)));
      },
      test_options());
}

TEST_P(CollectiveTest, SendRecvAroundARingAndBarrier) {
  const auto [world, dtype] = GetParam();
  run_local_ranks(
      world,
      [&, world = world, dtype = dtype](ProcessGroup& group) {
        group.barrier()->wait();
        if (world == 1) return;  // point-to-point needs a peer
        const int right = (group.rank() + 1) % world;
        const int left = (group.rank() + world - 1) % world;
        at::Tensor outgoing = rank_values(9, group.rank(), dtype);
        at::Tensor incoming = at::zeros({9}, dtype);
        // Both directions posted before waiting: sends must not block the matching receives.
        auto sent = group.send(outgoing, right, 5);
        auto received = group.recv(incoming, left, 5);
        sent->wait();
        received->wait();
        EXPECT_TRUE(at::equal(incoming, rank_values(9, left, dtype)));
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(WorldsAndDtypes, CollectiveTest,
                         ::testing::Values(Case{1, at::kFloat}, Case{2, at::kFloat},
                                           Case{3, at::kFloat}, Case{4, at::kFloat},
                                           Case{1, at::kBFloat16}, Case{2, at::kBFloat16},
                                           Case{3, at::kBFloat16}, Case{4, at::kBFloat16}),
                         [](const auto& info) {
                           return "world" + std::to_string(info.param.world) + "_" +
                                  (info.param.dtype == at::kFloat ? "fp32" : "bf16");
                         });

TEST(CollectiveTest, ReduceScatterLargeTensorUsesManySegments) {
  // Chunks of 6 to 12 segments of 4 MiB and an uneven tail: more segments per ring step than the
  // receive window holds, and from 3 ranks steps that forward what they reduced while the next
  // step's segments arrive into the same buffer.
  const int64_t numel = (6 << 22) + 7;
  for (const int world : {2, 3, 4}) {
    run_local_ranks(
        world,
        [&](ProcessGroup& group) {
          const at::Tensor base = at::arange(numel, at::kFloat).remainder(1000);
          const at::Tensor input = base * (group.rank() + 1);
          const ShardRange mine = shard_range(numel, world, group.rank());
          at::Tensor output = at::empty({mine.numel});
          group.reduce_scatter(input, output)->wait();
          const double ranks_total = world * (world + 1) / 2.0;  // 1 + 2 + ... + world
          EXPECT_TRUE(at::equal(output, (base * ranks_total).narrow(0, mine.offset, mine.numel)))
              << world << " ranks";
          EXPECT_TRUE(at::equal(input, base * (group.rank() + 1))) << world << " ranks";
          // In place: the output is this rank's own slice of the input.
          at::Tensor both = base * (group.rank() + 1);
          at::Tensor slice = both.narrow(0, mine.offset, mine.numel);
          group.reduce_scatter(both, slice)->wait();
          EXPECT_TRUE(at::equal(slice, output)) << world << " ranks, in place";
        },
        test_options());
  }
}

TEST(CollectiveTest, AllReduceOfLargeAndTinyTensors) {
  // The all-reduce is a ring reduce-scatter into each rank's own slice, then an all-gather:
  // slices of several 4 MiB segments with an uneven tail, and fewer elements than ranks (empty
  // slices), on 2 and 3 ranks; the average is folded into the reduce-scatter's last step.
  for (const int world : {2, 3}) {
    for (const int64_t numel : {int64_t{(9 << 20) + 7}, int64_t{1}, int64_t{world + 1}}) {
      run_local_ranks(
          world,
          [&](ProcessGroup& group) {
            const at::Tensor base = at::arange(numel, at::kFloat).remainder(1000);
            at::Tensor sum = base * (group.rank() + 1);
            at::Tensor avg = base * (group.rank() + 1);
            group.all_reduce(sum, ReduceOp::kSum)->wait();
            group.all_reduce(avg, ReduceOp::kAvg)->wait();
            const double ranks_total = world * (world + 1) / 2.0;  // 1 + 2 + ... + world
            EXPECT_TRUE(at::equal(sum, base * ranks_total)) << world << " ranks, " << numel;
            EXPECT_TRUE(at::allclose(avg, base * (ranks_total / world), 1e-6, 1e-6))
                << world << " ranks, " << numel;
          },
          test_options());
    }
  }
}

TEST(CollectiveTest, ManyOperationsInFlightCompleteInOrder) {
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        std::vector<at::Tensor> tensors;
        std::vector<WorkHandle> handles;
        for (int i = 0; i < 16; ++i) {
          tensors.push_back(at::full({100}, i + group.rank(), at::kFloat));
          handles.push_back(group.all_reduce(tensors.back()));
        }
        for (auto& handle : handles) handle->wait();
        for (int i = 0; i < 16; ++i) EXPECT_EQ(tensors[i][0].item<float>(), 2 * i + 1);
      },
      test_options());
}

TEST(ProcessGroupErrorsTest, RankThatNeverJoinsIsNamed) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const auto options =
      ProcessGroupOptions().timeout(std::chrono::milliseconds(500)).hostname("127.0.0.1");
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {  // rank 2 of 3 never starts
    ranks.emplace_back([&, rank] {
      try {
        init_process_group(store, rank, 3, options);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& error : errors) {
    EXPECT_NE(error.find("rank 2 never joined"), std::string::npos) << error;
    EXPECT_NE(error.find("timed out"), std::string::npos) << error;
  }
}

TEST(ProcessGroupErrorsTest, PeerThatSkipsACollectiveTimesOut) {
  const auto options = ProcessGroupOptions().timeout(std::chrono::milliseconds(800));
  std::string error;
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        if (group.rank() == 1) return;  // never calls the all_reduce
        at::Tensor t = at::ones({4});
        try {
          group.all_reduce(t)->wait();
        } catch (const std::exception& e) {
          error = e.what();
        }
      },
      options);
  EXPECT_NE(error.find("all_reduce on group 'world'"), std::string::npos) << error;
  EXPECT_NE(error.find("failed"), std::string::npos) << error;
}

// A slow phase on one rank (a long checkpoint write) trips the group's short timeout at a plain
// barrier, but not at barrier_within with a longer limit, which the checkpoint save uses.
TEST(ProcessGroupErrorsTest, BarrierWithinOutlastsTheGroupTimeout) {
  const auto options = ProcessGroupOptions().timeout(std::chrono::milliseconds(500));
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        if (group.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        group.barrier_within(std::chrono::seconds(20))->wait();
        at::Tensor t = at::ones({4});
        group.all_reduce(t)->wait();  // the group works on afterwards
        EXPECT_EQ(t[0].item<float>(), 2.0f);
      },
      options);
  std::string error;
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        if (group.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        try {
          group.barrier()->wait();
        } catch (const std::exception& e) {
          if (group.rank() == 0) error = e.what();
        }
      },
      options);
  EXPECT_NE(error.find("barrier"), std::string::npos) << error;
}

TEST(ProcessGroupErrorsTest, BadArgumentsAreNamed) {
  run_local_ranks(
      2,
      [&](ProcessGroup& group) {
        at::Tensor full = at::zeros({10});
        at::Tensor wrong = at::zeros({4});  // rank 0 owns 5, rank 1 owns 5
        EXPECT_THROW(
            {
              try {
                group.reduce_scatter(full, wrong);
              } catch (const c10::Error& e) {
                EXPECT_NE(std::string(e.what()).find("owns 5"), std::string::npos) << e.what();
                throw;
              }
            },
            c10::Error);
        EXPECT_THROW(group.broadcast(full, 2), c10::Error);
        EXPECT_THROW(group.all_reduce(at::zeros({3, 4}).t()), c10::Error);
        EXPECT_THROW(group.all_reduce(at::zeros({3}, at::kInt), ReduceOp::kAvg), c10::Error);
        EXPECT_THROW(group.send(full, group.rank()), c10::Error);
        EXPECT_THROW(group.new_group({1 - group.rank()}), c10::Error);
        try {
          group.all_to_all(at::zeros({4, 2}), at::zeros({4, 2}), {1, 2}, {});
          ADD_FAILURE() << "all_to_all accepted splits of 3 rows for 4";
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("add up to 3 rows but the input has 4"),
                    std::string::npos)
              << e.what();
        }
      },
      test_options());
}

}  // namespace process_group_test
}  // namespace shardtrain
