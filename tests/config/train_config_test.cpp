#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>

#include "shardtrain/config.h"

namespace shardtrain {
namespace train_config_test {

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse_train_config(text, "test.toml", overrides);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigTest, ReadsSectionsAndOverrides) {
  const auto config =
      parse_train_config(R"(
[model]
preset = "tiny"
n_layers = 3
[data]
corpus = ["a.txt", "b"]
seq_len = 32
[train]
lr = 3e-4
min_lr = 0
steps = 50
[run]
dir = "runs/x"
)",
                         "test.toml", {"train.steps=7", "run.dir=runs/y", "model.dropout=0.1"});
  EXPECT_EQ(config.model.n_layers, 3);
  EXPECT_DOUBLE_EQ(config.model.dropout, 0.1);
  EXPECT_EQ(config.data.corpus, (std::vector<std::string>{"a.txt", "b"}));
  EXPECT_EQ(config.data.seq_len, 32);
  EXPECT_DOUBLE_EQ(config.train.lr, 3e-4);
  EXPECT_EQ(config.train.steps, 7);
  EXPECT_EQ(config.run.dir, "runs/y");
}

TEST(ConfigTest, PresetAppliesBeforeSizeOverrides) {
  // toml tables are unordered: context_length must win over the preset however they are listed.
  const auto config = parse_train_config("[model]\ncontext_length = 32\npreset = \"tiny\"\n",
                                         "test.toml", {"data.seq_len=16"});
  EXPECT_EQ(config.model.context_length, 32);
}

TEST(ConfigTest, UnknownKeyIsNamed) {
  EXPECT_NE(
      error_of("[train]\nlearning_rate = 1\n").find("unknown config key 'train.learning_rate'"),
      std::string::npos);
  EXPECT_NE(error_of("[trian]\nlr = 1\n").find("'trian.lr'"), std::string::npos);
  EXPECT_NE(error_of("lr = 1\n").find("unknown config key 'lr'"), std::string::npos);
  EXPECT_NE(error_of("", {"train.stepz=3"}).find("'train.stepz'"), std::string::npos);
  EXPECT_NE(error_of("", {"steps=3"}).find("section.key=value"), std::string::npos);
}

TEST(ConfigTest, WrongTypeIsNamed) {
  const std::string e = error_of("[train]\nsteps = \"many\"\n");
  EXPECT_NE(e.find("'train.steps': expected an integer, got a string"), std::string::npos) << e;
  EXPECT_NE(error_of("[train]\nlr = true\n").find("'train.lr': expected a number"),
            std::string::npos);
  EXPECT_NE(error_of("[data]\ncorpus = 3\n").find("'data.corpus'"), std::string::npos);
}

TEST(ConfigTest, SequenceLongerThanTheContextIsRefused) {
  const std::string e = error_of("[model]\npreset = \"tiny\"\n[data]\nseq_len = 65\n");
  EXPECT_NE(e.find("data.seq_len 65 exceeds the model's context length 64"), std::string::npos)
      << e;
}

TEST(ConfigTest, BadValuesAreNamed) {
  EXPECT_NE(error_of("[data]\ntokenizer = \"sentencepiece\"\n").find("data.tokenizer"),
            std::string::npos);
  EXPECT_NE(error_of("[train]\nschedule = \"step\"\n").find("train.schedule"), std::string::npos);
  EXPECT_NE(error_of("[train]\nwarmup_type = \"cubic\"\n").find("train.warmup_type"),
            std::string::npos);
  EXPECT_NE(error_of("[precision]\nhysteresis = 0\n").find("precision.hysteresis"),
            std::string::npos);
  // min_lr above lr is named with both values for a decaying schedule, and allowed for a
  // constant one, which never reaches it.
  EXPECT_NE(error_of("[train]\nlr = 1e-5\nmin_lr = 1e-4\n")
                .find("train.min_lr (0.0001) must be between 0 and train.lr (1e-05)"),
            std::string::npos);
  EXPECT_EQ(error_of("[train]\nlr = 1e-5\nmin_lr = 1e-4\nschedule = \"constant\"\n"), "");
  // Out-of-range values are named even where they would not be used.
  EXPECT_NE(error_of("[run]\nthreads = 100000\n").find("run.threads"), std::string::npos);
  EXPECT_NE(error_of("[run]\ndevice = \"gpu\"\n").find("run.device must be \"cpu\" or \"cuda\""),
            std::string::npos);
  // What the CUDA path does not run yet is refused by name, before any device is looked for.
  EXPECT_NE(error_of("[run]\ndevice = \"cuda\"\n[parallel]\nstrategy = \"ddp\"\n")
                .find("run.device = \"cuda\" trains with parallel.strategy \"none\""),
            std::string::npos);
  EXPECT_NE(error_of("[run]\ndevice = \"cuda\"\n[lora]\nrank = 4\nbase_dtype = \"nf4\"\n")
                .find("lora.base_dtype \"nf4\""),
            std::string::npos);
  EXPECT_EQ(error_of("[run]\ndevice = \"cuda\"\n"), "");
  EXPECT_NE(error_of("[train]\neps = 0\n").find("train.eps must be positive, got 0"),
            std::string::npos);
  EXPECT_EQ(error_of("[train]\neps = 0\n").find("weight_decay"), std::string::npos);
  EXPECT_NE(error_of("[run]\ndir = \"\"\n").find("run.dir must name a directory"),
            std::string::npos);
  EXPECT_NE(error_of("[lora]\nalpha = nan\n").find("lora.alpha"), std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"tiny\"\n[lora]\nrank = 100000\n")
                .find("lora.rank 100000 is larger than model.d_model (64)"),
            std::string::npos);
  EXPECT_NE(error_of("[lora]\ndropout = 2.0\n").find("lora.dropout"), std::string::npos);
  EXPECT_NE(error_of("[lora]\nbase_dtype = \"int8\"\n").find("lora.base_dtype"), std::string::npos);
  EXPECT_NE(error_of("[model]\nhf_config = \"/tmp\"\n").find("is a directory"), std::string::npos);
  EXPECT_NE(error_of("[precision]\nloss_scale = \"big\"\n").find("precision.loss_scale"),
            std::string::npos);
  EXPECT_NE(error_of("[model]\npreset = \"gpt5\"\n").find("gpt5"), std::string::npos);
  EXPECT_NE(error_of("[train\nlr = 1").find("test.toml:1"), std::string::npos);
  EXPECT_NE(error_of("", {"train.loss_chunk_tokens=-1"})
                .find("train.loss_chunk_tokens must be >= 0 (0: chunks of about 32 MiB of "
                      "logits), got -1"),
            std::string::npos);
  EXPECT_NE(error_of("", {"run.freed_memory=\"keep\""})
                .find("run.freed_memory must be \"auto\", \"cache\", \"return\" or \"malloc\", got "
                      "\"keep\""),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.attention=\"flash\""})
                .find("train.attention must be \"auto\", \"blockwise\", \"fused\" or "
                      "\"reference\", got \"flash\""),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.attention=\"blockwise\"", "model.dropout=0.1"})
                .find("train.attention = \"blockwise\" applies no attention dropout, but "
                      "model.dropout is 0.1"),
            std::string::npos);
}

}  // namespace train_config_test
}  // namespace shardtrain

namespace shardtrain {
namespace train_config_test {

TEST(ConfigTest, AMisspelledKeyGetsTheNearestOne) {
  EXPECT_NE(error_of("[train]\nlearning_rat = 1\n").find("unknown config key"), std::string::npos);
  const std::string typo = error_of("[train]\nmicro_bach = 4\n");
  EXPECT_NE(typo.find("did you mean 'train.micro_batch'?"), std::string::npos) << typo;
  const std::string set = error_of("", {"parallel.stratgy=ddp"});
  EXPECT_NE(set.find("did you mean 'parallel.strategy'?"), std::string::npos) << set;
}

TEST(ConfigTest, Gpt2HeadsCanBeChangedAlone) {
  const auto config = parse_train_config("[model]\npreset = \"tiny\"\nn_heads = 2\n", "t.toml");
  EXPECT_EQ(config.model.n_heads, 2);
  EXPECT_EQ(config.model.n_kv_heads, 2);
  // Given explicitly, a key/value head count GPT-2 cannot have is still refused.
  EXPECT_NE(
      error_of("[model]\npreset = \"tiny\"\nn_heads = 2\nn_kv_heads = 1\n").find("n_kv_heads"),
      std::string::npos);
}

TEST(ConfigTest, ANumberTooLargeIsNamedAsOne) {
  const std::string e = error_of("", {"train.steps=99999999999999999999"});
  EXPECT_NE(e.find("'99999999999999999999' is not a valid number"), std::string::npos) << e;
  EXPECT_EQ(e.find("a string"), std::string::npos) << e;
}

// Offload keys of a strategy the run does not use are refused, naming the strategy that reads
// them, rather than ignored.
TEST(ConfigTest, AnotherStrategysOffloadIsRefused) {
  const std::string zero_under_ddp =
      error_of("", {"parallel.strategy=\"ddp\"", "parallel.zero.offload_optimizer=\"cpu\""});
  EXPECT_NE(zero_under_ddp.find("parallel.zero.offload_optimizer / offload_param with "
                                "parallel.strategy = \"ddp\""),
            std::string::npos)
      << zero_under_ddp;
  EXPECT_NE(zero_under_ddp.find("parallel.fsdp.cpu_offload"), std::string::npos);
  EXPECT_NE(error_of("", {"parallel.strategy=\"fsdp\"", "parallel.zero.stage=3",
                          "parallel.zero.offload_param=\"cpu\""})
                .find("with parallel.strategy = \"fsdp\""),
            std::string::npos);
  const std::string fsdp_under_zero =
      error_of("", {"parallel.strategy=\"zero\"", "parallel.fsdp.cpu_offload=true"});
  EXPECT_NE(fsdp_under_zero.find("parallel.fsdp.cpu_offload = true with parallel.strategy = "
                                 "\"zero\""),
            std::string::npos)
      << fsdp_under_zero;
  // Each under its own strategy is taken.
  EXPECT_EQ(error_of("", {"parallel.strategy=\"zero\"", "parallel.zero.offload_optimizer=\"cpu\""}),
            "");
  EXPECT_EQ(error_of("", {"parallel.strategy=\"fsdp\"", "parallel.fsdp.cpu_offload=true"}), "");
}

// The strategies' names become enums once, in their sections; a name that is none of them is
// refused with its key and the names it may take.
TEST(ConfigTest, StrategyNamesBecomeEnumsInTheirSections) {
  const auto config = parse_train_config(R"(
[parallel]
strategy = "zero"
zero.stage = 3
zero.offload_param = "cpu"
fsdp.sharding = "hybrid_shard"
fsdp.prefetch = "backward_post"
fsdp.wrap = "size"
ddp.comm_hook = "bf16"
)",
                                         "t.toml");
  EXPECT_EQ(config.parallel.strategy, ParallelStrategy::kZero);
  EXPECT_EQ(config.parallel.zero.stage, 3);
  EXPECT_EQ(config.parallel.zero.offload_param, OffloadDevice::kCpu);
  EXPECT_EQ(config.parallel.zero.offload_optimizer, OffloadDevice::kNone);
  EXPECT_EQ(config.parallel.fsdp.sharding, ShardingStrategy::kHybridShard);
  EXPECT_EQ(config.parallel.fsdp.prefetch, BackwardPrefetch::kBackwardPost);
  EXPECT_EQ(config.parallel.fsdp.wrap, FsdpWrap::kSize);
  EXPECT_EQ(config.parallel.ddp.comm_hook, DDPCommHook::kBf16Compress);
  EXPECT_EQ(to_string(config.parallel.strategy), "zero");

  const std::string strategy = error_of("", {"parallel.strategy=fdsp"});
  EXPECT_NE(
      strategy.find(R"(parallel.strategy "fdsp" is not one of "none", "ddp", "fsdp", "zero")"),
      std::string::npos)
      << strategy;
  const std::string offload = error_of("", {"parallel.zero.offload_optimizer=disk"});
  EXPECT_NE(offload.find(R"(parallel.zero.offload_optimizer "disk" is not one of "none", "cpu")"),
            std::string::npos)
      << offload;
  const std::string typed = error_of("", {"parallel.fsdp.sharding=3"});
  EXPECT_NE(typed.find("config key 'parallel.fsdp.sharding': expected a string, got an integer"),
            std::string::npos)
      << typed;
}

// A bare word that starts with a digit is a word: --set parallel.pp_schedule=1f1b.
TEST(ConfigTest, ABareWordStartingWithADigitIsAString) {
  const auto config = parse_train_config("", "t.toml", {"parallel.pp_schedule=1f1b"});
  EXPECT_EQ(config.parallel.pp_schedule, PipelineScheduleKind::kOneFOneB);
  EXPECT_NE(error_of("", {"train.lr=1e-3x"}).find("expected a number, got a string"),
            std::string::npos)
      << error_of("", {"train.lr=1e-3x"});
}

TEST(ConfigTest, AConfigThatIsNoRegularFileIsRefusedBeforeItIsRead) {
  // A FIFO nobody writes would block the read for ever.
  const std::string fifo = ::testing::TempDir() + "config_fifo.toml";
  std::remove(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  try {
    load_train_config(fifo);
    ADD_FAILURE() << "a FIFO was read as a config";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
  }
  std::remove(fifo.c_str());
}

TEST(ConfigTest, ReplicaFaultToleranceNeedsReplicasThatHoldTheWholeState) {
  const std::string base = "[model]\npreset = \"tiny\"\n[run]\nfault_tolerance = \"replicas\"\n";
  EXPECT_NE(error_of(base, {"parallel.strategy=\"fsdp\""}).find("needs data-parallel replicas"),
            std::string::npos);
  EXPECT_NE(error_of(base, {"parallel.strategy=\"ddp\"", "parallel.tp=2"})
                .find("tensor, pipeline, context or expert parallelism"),
            std::string::npos);
  EXPECT_NE(error_of(base, {"parallel.strategy=\"ddp\"", "run.checkpoint_async=true"})
                .find("run.checkpoint_async"),
            std::string::npos);
  EXPECT_NE(error_of(base, {"run.fault_tolerance=\"nodes\""})
                .find("run.fault_tolerance must be \"none\" or \"replicas\""),
            std::string::npos);
  EXPECT_NE(
      error_of(base, {"parallel.strategy=\"fsdp\"", "parallel.fsdp.sharding=\"shard_grad_op\""})
          .find("with sharding \"shard_grad_op\""),
      std::string::npos);
  EXPECT_EQ(error_of(base, {"parallel.strategy=\"ddp\""}), "");
  // hybrid_shard's shard groups are replicas.
  EXPECT_EQ(
      error_of(base, {"parallel.strategy=\"fsdp\"", "parallel.fsdp.sharding=\"hybrid_shard\""}),
      "");
}

}  // namespace train_config_test
}  // namespace shardtrain
