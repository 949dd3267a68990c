// Training on in-process ranks for the trainer's layout tests: every rank runs `steps` steps of
// the same config, and rank 0's losses (evaluation, checkpoint) come back.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"

namespace shardtrain::testing {

// `world` ranks (1: one process without a group). With `saved`, the checkpoint written after
// the last step; with `eval`, an evaluation after it.
inline std::vector<double> train_on_ranks(int world, const TrainConfig& cfg, int steps,
                                          std::string* saved = nullptr, double* eval = nullptr) {
  std::vector<double> losses;
  auto body = [&](const std::shared_ptr<ProcessGroup>& group) {
    Trainer trainer(cfg, group);
    std::vector<double> mine;
    for (int i = 0; i < steps; ++i) mine.push_back(trainer.train_step().loss);
    std::string dir;
    if (saved) dir = trainer.save_checkpoint();
    const double evaluated = eval ? trainer.evaluate() : 0.0;
    if (!group || group->rank() == 0) {
      losses = mine;
      if (saved) *saved = dir;
      if (eval) *eval = evaluated;
    }
  };
  if (world == 1) {
    body(nullptr);
  } else {
    run_local_ranks(world, [&](ProcessGroup& group) {
      body(std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {}));
    });
  }
  return losses;
}

// Training the config `make` builds on `world` ranks is refused (by the config's checks or the
// trainer's) with a message containing `words`.
inline void expect_refused(int world, const std::function<TrainConfig()>& make,
                           const std::string& words) {
  try {
    train_on_ranks(world, make(), 1);
    ADD_FAILURE() << "accepted; expected an error containing: " << words;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

// The checkpoint in `got_dir` holds every model tensor of the one in `want_dir` (optimizer state
// aside), of the same shape and within 1e-5 relative.
inline void expect_same_parameters(const std::string& got_dir, const std::string& want_dir) {
  const ShardedCheckpointReader got(got_dir), want(want_dir);
  for (const auto& spec : want.tensors()) {
    if (spec.name.rfind("optim.", 0) == 0) continue;
    ASSERT_NE(got.find(spec.name), nullptr) << spec.name;
    const at::Tensor a = got.read(spec.name), b = want.read(spec.name);
    ASSERT_EQ(a.sizes(), b.sizes()) << spec.name;
    EXPECT_LE((a - b).norm().item<double>() / b.norm().item<double>(), 1e-5) << spec.name;
  }
}

// The value of the integer setting `key` ("parallel.tp") among `keys` ("parallel.tp=2"), or
// `otherwise`.
inline int setting_in(const std::vector<std::string>& keys, const std::string& key, int otherwise) {
  for (const auto& entry : keys) {
    if (entry.rfind(key + "=", 0) == 0) return std::stoi(entry.substr(key.size() + 1));
  }
  return otherwise;
}

}  // namespace shardtrain::testing
