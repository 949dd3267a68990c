// The trainer with [lora]: the base model's first loss, a base left bit-identical, the same
// losses under DDP and FSDP as on one process, checkpoints of the adapters alone, and resume.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/nf4.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/hf.h"
#include "shardtrain/rendezvous.h"
#include "shardtrain/sharded_checkpoint.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace lora_trainer_test {

namespace fs = std::filesystem;

class LoraTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_lora_trainer");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "the quick brown fox " << i % 7 << " jumps over the lazy dog " << i % 11 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::vector<std::string>& overrides = {},
                     const std::string& run = "run") const {
    std::vector<std::string> all = {"train.micro_batch=8", "train.steps=4", "train.lr=0.01",
                                    "lora.rank=4", "lora.alpha=8"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / run, all);
  }

  std::vector<double> losses(const std::vector<std::string>& overrides, int world,
                             const std::string& run) {
    std::vector<double> got;
    if (world == 1) {
      Trainer trainer(config(overrides, run));
      for (int i = 0; i < 4; ++i) got.push_back(trainer.train_step().loss);
      return got;
    }
    run_local_ranks(
        world,
        [&](ProcessGroup& group) {
          auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
          Trainer trainer(config(overrides, run), shared);
          std::vector<double> mine;
          for (int i = 0; i < 4; ++i) mine.push_back(trainer.train_step().loss);
          if (group.rank() == 0) got = mine;
        },
        ProcessGroupOptions().timeout(std::chrono::seconds(120)));
    return got;
  }

  fs::path dir_;
};

TEST_F(LoraTrainerTest, FirstLossIsTheBaseModelsAndTheBaseNeverChanges) {
  Trainer full(config({"lora.rank=0"}, "full"));
  const double base_loss = full.train_step().loss;
  Trainer lora(config({"train.steps=6"}));
  std::vector<std::pair<std::string, at::Tensor>> before;
  for (const auto& item : lora.model()->named_parameters()) {
    before.emplace_back(item.key(), item.value().detach().clone());
  }
  const double first = lora.train_step().loss;
  EXPECT_EQ(first, base_loss);  // B = 0: the adapted model computes the base model exactly
  double last = first;
  for (int i = 0; i < 5; ++i) last = lora.train_step().loss;
  EXPECT_LT(last, first);
  int changed = 0;
  for (const auto& [name, value] : before) {
    const at::Tensor now = lora.model()->named_parameters()[name];
    if (name.find(".lora_") == std::string::npos) {
      EXPECT_TRUE(at::equal(now, value)) << name << " is frozen but changed";
    } else {
      changed += at::equal(now, value) ? 0 : 1;
    }
  }
  EXPECT_GT(changed, 0);
}

TEST_F(LoraTrainerTest, DdpAndFsdpGiveTheLossesOfOneProcess) {
  const std::vector<double> want = losses({}, 1, "single");
  testing::expect_same_losses(
      losses({"parallel.strategy=\"ddp\"", "train.micro_batch=4"}, 2, "ddp"), want, 1e-5);
  testing::expect_same_losses(
      losses({"parallel.strategy=\"fsdp\"", "train.micro_batch=4"}, 2, "fsdp2"), want, 1e-5);
  for (const std::string sharding : {"full_shard", "shard_grad_op", "hybrid_shard"}) {
    SCOPED_TRACE(sharding);
    testing::expect_same_losses(
        losses({"parallel.strategy=\"fsdp\"", "train.micro_batch=2",
                "parallel.fsdp.sharding=\"" + sharding + "\"", "parallel.fsdp.replicate=2"},
               4, "fsdp4_" + sharding),
        want, 1e-5);
  }
}

TEST_F(LoraTrainerTest, AccumulationAndActivationCheckpointingKeepTheLosses) {
  const std::vector<double> want =
      losses({"lora.target_modules=[\"attn.qkv\", \"mlp.fc\"]"}, 1, "single");
  testing::expect_same_losses(
      losses({"lora.target_modules=[\"attn.qkv\", \"mlp.fc\"]", "parallel.strategy=\"fsdp\"",
              "train.micro_batch=2", "train.grad_accum=2", "train.activation_checkpointing=true"},
             2, "fsdp"),
      want, 1e-5);
  testing::expect_same_losses(
      losses({"lora.target_modules=[\"attn.qkv\", \"mlp.fc\"]", "parallel.strategy=\"ddp\"",
              "train.micro_batch=2", "train.grad_accum=2", "train.activation_checkpointing=true"},
             2, "ddp"),
      want, 1e-5);
}

TEST_F(LoraTrainerTest, ABf16BaseIsStoredSoAndTrainsAlikeEverywhere) {
  Trainer fp32(config({}, "fp32"));
  const double fp32_first = fp32.train_step().loss;
  Trainer bf16(config({"lora.base_dtype=\"bf16\""}, "bf16"));
  auto params = bf16.model()->named_parameters();
  EXPECT_EQ(params["blocks.0.attn.qkv.weight"].scalar_type(), at::kBFloat16);
  EXPECT_EQ(params["blocks.0.attn.qkv.lora_A.weight"].scalar_type(), at::kFloat);
  EXPECT_EQ(params["tok_emb.weight"].scalar_type(), at::kFloat);
  // The base rounded to bf16 computes nearly, not exactly, the fp32 base's loss.
  EXPECT_NEAR(bf16.train_step().loss, fp32_first, 1e-2 * fp32_first);

  const std::vector<double> want = losses({"lora.base_dtype=\"bf16\""}, 1, "single");
  testing::expect_same_losses(
      losses({"lora.base_dtype=\"bf16\"", "parallel.strategy=\"ddp\"", "train.micro_batch=4"}, 2,
             "ddp"),
      want, 1e-5);
  testing::expect_same_losses(
      losses({"lora.base_dtype=\"bf16\"", "parallel.strategy=\"fsdp\"", "train.micro_batch=2",
              "parallel.fsdp.sharding=\"full_shard\"", "train.activation_checkpointing=true"},
             4, "fsdp"),
      want, 1e-5);
}

TEST_F(LoraTrainerTest, QLoraStoresTheBaseInNf4AndTrainsAlikeEverywhere) {
  Trainer fp32(config({}, "fp32"));
  const double fp32_first = fp32.train_step().loss;
  Trainer nf4(config({"lora.base_dtype=\"nf4\""}, "nf4"));
  auto params = nf4.model()->named_parameters();
  const at::Tensor packed = params["blocks.0.mlp.fc.weight"];
  EXPECT_EQ(packed.scalar_type(), at::kByte);
  const int64_t d = nf4.config().model.d_model, f = nf4.config().model.ffn_hidden;
  EXPECT_LE(static_cast<double>(packed.numel()) / static_cast<double>(d * f), 0.6);
  EXPECT_EQ(params["tok_emb.weight"].scalar_type(), at::kFloat);
  // The 4-bit base computes close to, not exactly, the fp32 base's loss.
  EXPECT_NEAR(nf4.train_step().loss, fp32_first, 0.05 * fp32_first);

  const std::vector<double> want = losses({"lora.base_dtype=\"nf4\""}, 1, "single");
  testing::expect_same_losses(
      losses({"lora.base_dtype=\"nf4\"", "parallel.strategy=\"ddp\"", "train.micro_batch=4"}, 2,
             "ddp"),
      want, 1e-5);
  testing::expect_same_losses(losses({"lora.base_dtype=\"nf4\"", "parallel.strategy=\"fsdp\"",
                                      "train.micro_batch=4", "train.activation_checkpointing=true"},
                                     2, "fsdp2"),
                              want, 1e-5);
  testing::expect_same_losses(
      losses({"lora.base_dtype=\"nf4\"", "parallel.strategy=\"fsdp\"", "train.micro_batch=2",
              "parallel.fsdp.sharding=\"shard_grad_op\""},
             4, "fsdp4"),
      want, 1e-5);
}

TEST_F(LoraTrainerTest, QLoraQuantizesHuggingFaceWeightsAsTheyAreRead) {
  Trainer full(config({"lora.rank=0", "train.steps=2"}, "full"));
  full.fit();
  export_hf_checkpoint((dir_ / "full" / "checkpoints" / "step_000002").string(),
                       (dir_ / "hf").string());
  const auto want = full.model()->named_parameters();
  run_local_ranks(2, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    // Each rank reads the weights one at a time and keeps only their packed NF4 bytes.
    Trainer qlora(
        config({"lora.base_dtype=\"nf4\"", "parallel.strategy=\"ddp\"", "train.micro_batch=4",
                "model.init_from=\"" + (dir_ / "hf").string() + "\""},
               "qlora"),
        shared);
    const auto got = qlora.model()->named_parameters();
    for (const std::string name : {"blocks.0.attn.qkv.weight", "blocks.1.mlp.proj.weight"}) {
      EXPECT_TRUE(at::equal(got[name], detail::nf4_pack(detail::nf4_quantize(want[name])))) << name;
    }
    EXPECT_TRUE(at::equal(got["tok_emb.weight"], want["tok_emb.weight"]));
  });
}

TEST_F(LoraTrainerTest, QLoraLossFallsOnTheDemoCorpus) {
  const fs::path fortunes = "/usr/share/games/fortunes/fortunes";
  if (!fs::exists(fortunes)) GTEST_SKIP() << fortunes << " is missing (Debian's fortunes package)";
  Trainer trainer(testing::tiny_run_config(
      fortunes, dir_ / "fortunes",
      {"train.micro_batch=8", "train.steps=30", "train.lr=0.02", "train.warmup=3", "lora.rank=8",
       "lora.alpha=16", "lora.base_dtype=\"nf4\""}));
  double first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    const double loss = trainer.train_step().loss;
    if (i < 5) first += loss / 5;
    if (i >= 25) last += loss / 5;
  }
  EXPECT_LT(last, first - 0.1) << "mean loss of the first 5 steps " << first << ", last 5 " << last;
}

TEST_F(LoraTrainerTest, CheckpointsHoldTheAdaptersAndResumeExactly) {
  Trainer straight(config({"train.steps=6"}, "straight"));
  std::vector<double> want;
  for (int i = 0; i < 6; ++i) want.push_back(straight.train_step().loss);

  std::vector<double> got;
  run_local_ranks(2, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    Trainer first(config({"train.steps=6", "parallel.strategy=\"fsdp\"", "train.micro_batch=4"}),
                  shared);
    first.train_step();
    first.train_step();
    first.train_step();
    first.save_checkpoint();
  });
  const ShardedCheckpointReader reader((dir_ / "run" / "checkpoints" / "step_000003").string());
  for (const auto& spec : reader.tensors()) {
    EXPECT_NE(spec.name.find(".lora_"), std::string::npos) << spec.name << " is not an adapter";
  }
  const auto metadata = nlohmann::json::parse(reader.metadata());
  EXPECT_EQ(metadata.at("lora").at("rank").get<int64_t>(), 4);

  // Resumed on one process: the frozen base comes from the seed again.
  Trainer resumed(config({"train.steps=6", "run.resume=\"latest\""}));
  ASSERT_EQ(resumed.step(), 3);
  for (int i = 3; i < 6; ++i) got.push_back(resumed.train_step().loss);
  testing::expect_same_losses(got, std::vector<double>(want.begin() + 3, want.end()), 1e-5);
}

TEST_F(LoraTrainerTest, ExportsTheAdaptersAsPeftAndTheMergedModelComputesTheSame) {
  Trainer trainer(config({"train.steps=6", "lora.target_modules=[\"attn.qkv\", \"mlp.proj\"]"}));
  trainer.fit();
  const fs::path checkpoint = dir_ / "run" / "checkpoints" / "step_000006";

  export_lora_checkpoint(checkpoint.string(), (dir_ / "adapters").string(), LoraExport::kAdapters);
  const auto adapters =
      load_safetensors((dir_ / "adapters" / "adapter_model.safetensors").string());
  const auto& blocks = trainer.model()->named_parameters();
  const int64_t layers = trainer.config().model.n_layers;
  EXPECT_EQ(adapters.size(), static_cast<size_t>(4 * layers));
  const at::Tensor a = adapters.at("base_model.model.transformer.h.1.attn.c_attn.lora_A.weight");
  EXPECT_TRUE(at::equal(a, blocks["blocks.1.attn.qkv.lora_A.weight"]));
  EXPECT_TRUE(at::equal(adapters.at("base_model.model.transformer.h.0.mlp.c_proj.lora_B.weight"),
                        blocks["blocks.0.mlp.proj.lora_B.weight"]));
  std::ifstream config_file(dir_ / "adapters" / "adapter_config.json");
  const auto adapter_config = nlohmann::json::parse(config_file);
  EXPECT_EQ(adapter_config.at("peft_type"), "LORA");
  EXPECT_EQ(adapter_config.at("r").get<int64_t>(), 4);
  EXPECT_EQ(adapter_config.at("lora_alpha").get<double>(), 8.0);
  EXPECT_EQ(adapter_config.at("target_modules"), nlohmann::json({"c_attn", "c_proj"}));
  EXPECT_TRUE(adapter_config.at("fan_in_fan_out").get<bool>());  // GPT-2's Conv1D

  export_lora_checkpoint(checkpoint.string(), (dir_ / "merged").string(), LoraExport::kMerged);
  Transformer merged(model_config_from_hf_json((dir_ / "merged" / "config.json").string()),
                     ModelInit().seed(1));
  load_hf_weights(merged, (dir_ / "merged").string());
  const at::Tensor tokens = at::randint(0, 200, {2, 24}, at::kLong);
  torch::NoGradGuard no_grad;
  trainer.model()->eval();
  merged->eval();
  const at::Tensor want = trainer.model()->forward(tokens);
  const at::Tensor base_logits =
      Transformer(trainer.config().model, ModelInit().seed(trainer.config().train.seed))
          ->forward(tokens);
  EXPECT_GT((want - base_logits).abs().max().item<double>(), 1e-4);  // the adapters trained
  EXPECT_LE((merged->forward(tokens) - want).abs().max().item<double>(), 1e-5);

  // A LoRA checkpoint is not a whole model, and a whole model has no adapters: both named.
  auto refused = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(refused([&] {
              export_hf_checkpoint(checkpoint.string(), (dir_ / "plain").string());
            }).find("--lora"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "plain" / "model.safetensors"));
}

TEST_F(LoraTrainerTest, AMergedBf16OrNf4BaseComputesWhatTheRunDid) {
  for (const std::string base : {"bf16", "nf4"}) {
    SCOPED_TRACE(base);
    Trainer trainer(config({"train.steps=4", "lora.base_dtype=\"" + base + "\""}, base));
    trainer.fit();
    export_lora_checkpoint((dir_ / base / "checkpoints" / "step_000004").string(),
                           (dir_ / ("merged_" + base)).string(), LoraExport::kMerged);
    Transformer merged(
        model_config_from_hf_json((dir_ / ("merged_" + base) / "config.json").string()),
        ModelInit().seed(1));
    load_hf_weights(merged, (dir_ / ("merged_" + base)).string());
    const at::Tensor tokens = at::randint(0, 200, {2, 24}, at::kLong);
    torch::NoGradGuard no_grad;
    trainer.model()->eval();
    merged->eval();
    const at::Tensor want = trainer.model()->forward(tokens);
    EXPECT_LE((merged->forward(tokens) - want).abs().max().item<double>(), 1e-5);
  }
}

TEST_F(LoraTrainerTest, AResumeOnAnotherBaseIsRefused) {
  // Two bases exported as Hugging Face weights: the same model drawn with two seeds.
  for (const auto& [name, seed] : {std::pair<std::string, int>{"one", 1}, {"two", 2}}) {
    Trainer(config({"lora.rank=0", "train.steps=1", "train.seed=" + std::to_string(seed)},
                   "full_" + name))
        .fit();
    export_hf_checkpoint((dir_ / ("full_" + name) / "checkpoints" / "step_000001").string(),
                         (dir_ / ("hf_" + name)).string());
  }
  const std::string one = (dir_ / "hf_one").string(), two = (dir_ / "hf_two").string();
  auto init_from = [](const std::string& path) { return "model.init_from=\"" + path + "\""; };
  Trainer(config({"train.steps=1", init_from(one)}, "adapted")).fit();
  auto resume = [&](std::vector<std::string> settings) -> std::string {
    settings.push_back("run.resume=\"latest\"");
    settings.push_back("train.steps=2");
    try {
      Trainer trainer(config(settings, "adapted"));
      EXPECT_EQ(trainer.step(), 1);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  const std::string random = resume({});
  EXPECT_NE(random.find("adapters trained on the base '" + one +
                        "', but model.init_from is not set (the base would be random)"),
            std::string::npos)
      << random;
  const std::string other = resume({init_from(two)});
  EXPECT_NE(other.find("the weights in model.init_from '" + two + "' are other ones"),
            std::string::npos)
      << other;
  EXPECT_EQ(resume({init_from(one)}), "");

  // A random base is the seed's: another seed is another base.
  Trainer(config({"train.steps=1", "train.seed=5"}, "random")).fit();
  try {
    Trainer trainer(config({"train.seed=6", "run.resume=\"latest\""}, "random"));
    ADD_FAILURE() << "resumed on another random base";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("drawn with train.seed 5, but train.seed is 6"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(LoraTrainerTest, BadSettingsAreRefusedByName) {
  auto refused = [&](const std::vector<std::string>& overrides) -> std::string {
    try {
      Trainer trainer(config(overrides, "bad"));
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "";
  };
  const std::string unmatched = refused({"lora.target_modules=[\"attn.q\"]"});
  EXPECT_NE(unmatched.find("attn.q"), std::string::npos) << unmatched;
  EXPECT_NE(unmatched.find("blocks.0.attn.qkv"), std::string::npos) << unmatched;
  EXPECT_NE(refused({"lora.rank=-1"}).find("lora.rank"), std::string::npos);
  const std::string zero = refused({"parallel.strategy=\"zero\""});
  EXPECT_NE(zero.find("ZeRO"), std::string::npos) << zero;
  EXPECT_FALSE(fs::exists(dir_ / "bad" / "metrics.jsonl"));

  // A full-model checkpoint is not an adapter checkpoint: refused, naming a tensor.
  {
    Trainer full(config({"lora.rank=0", "train.steps=1"}, "full"));
    full.fit();
  }
  const std::string mixed =
      refused({"run.resume=\"" + (dir_ / "full" / "checkpoints" / "step_000001").string() + "\""});
  EXPECT_NE(mixed.find("checkpoint"), std::string::npos) << mixed;

  // Adapters of rank 4 onto a model with rank-8 adapters: refused, naming the shapes.
  {
    Trainer small(config({"train.steps=1"}, "small"));
    small.fit();
  }
  const std::string shape =
      refused({"lora.rank=8",
               "run.resume=\"" + (dir_ / "small" / "checkpoints" / "step_000001").string() + "\""});
  EXPECT_NE(shape.find("lora_"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[4, "), std::string::npos) << shape;
}

}  // namespace lora_trainer_test
}  // namespace shardtrain
