// shardtrain ckpt inspect|export|reshard: reads, converts and reshards sharded checkpoints.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "commands.h"
#include "shardtrain/checkpoint.h"
#include "shardtrain/hf.h"
#include "shardtrain/sharded_checkpoint.h"

namespace fs = std::filesystem;

namespace shardtrain::cli {
namespace {

// A checkpoint directory, or a checkpoints root whose `latest` names one.
std::string checkpoint_dir(const std::string& path) {
  if (!fs::exists(fs::path(path) / "index.json") && fs::exists(fs::path(path) / "latest")) {
    return resolve_checkpoint(path, "latest");
  }
  return path;
}

// SIGINT and SIGTERM during a reshard are remembered, so that it stops before its next slice
// and removes what it wrote (their default action would leave a partial directory behind).
volatile std::sig_atomic_t g_signal = 0;
extern "C" void remember_signal(int signal) { g_signal = signal; }

class StopOnSignal {
 public:
  StopOnSignal() {
    struct sigaction remember {};
    remember.sa_handler = remember_signal;
    sigemptyset(&remember.sa_mask);
    sigaction(SIGINT, &remember, &old_int_);
    sigaction(SIGTERM, &remember, &old_term_);
  }
  ~StopOnSignal() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

std::string human_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.2f %s", value, units[unit]);
  return text;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// A plain safetensors file, or a Hugging Face folder (model.safetensors or its index), rather
// than a sharded checkpoint.
bool is_plain_safetensors(const std::string& path) {
  const fs::path p(path);
  if (fs::is_regular_file(p)) return true;
  return fs::is_directory(p) && !fs::exists(p / "index.json") && !fs::exists(p / "latest") &&
         (fs::exists(p / "model.safetensors") || fs::exists(p / "model.safetensors.index.json"));
}

void inspect_safetensors(const std::string& path, bool verify) {
  for (const auto& file : hf_weight_files(path)) {
    const auto specs = read_safetensors_specs(file);
    int64_t bytes = 0;
    for (const auto& t : specs)
      bytes += t.numel() * static_cast<int64_t>(c10::elementSize(t.dtype));
    std::printf("safetensors file %s: %zu tensors, %s\n", file.c_str(), specs.size(),
                human_bytes(bytes).c_str());
    for (const auto& t : specs) {
      std::printf("  %-40s %-16s %-5s %s\n", t.name.c_str(), shape_text(t.shape).c_str(),
                  c10::toString(t.dtype),
                  human_bytes(t.numel() * static_cast<int64_t>(c10::elementSize(t.dtype))).c_str());
    }
    if (verify) load_safetensors(file);  // reads every tensor's bytes
  }
  if (verify) std::printf("verified: every tensor could be read\n");
}

void inspect(const std::string& path, bool verify, bool json) {
  if (!json && is_plain_safetensors(path)) {
    inspect_safetensors(path, verify);
    return;
  }
  const ShardedCheckpointReader reader(checkpoint_dir(path));
  if (verify) reader.verify();
  if (json) {
    std::cout << reader.index_json();
    return;
  }
  int64_t file_bytes = 0;
  for (const auto& f : reader.files()) file_bytes += f.bytes;
  int64_t tensor_bytes = 0;
  for (const auto& t : reader.tensors()) {
    tensor_bytes += t.numel() * static_cast<int64_t>(c10::elementSize(t.dtype));
  }
  std::printf("checkpoint %s (format version %d)\n", reader.dir().c_str(), reader.version());
  std::printf("layout: written by strategy \"%s\" on %d rank%s\n", reader.strategy().c_str(),
              reader.world_size(), reader.world_size() == 1 ? "" : "s");
  std::printf("metadata: %s\n", reader.metadata().c_str());
  std::printf("files: %zu, %s\n", reader.files().size(), human_bytes(file_bytes).c_str());
  for (const auto& f : reader.files()) {
    std::printf("  %-24s rank %-4d %6lld slices  %s\n", f.name.c_str(), f.rank,
                static_cast<long long>(f.slices), human_bytes(f.bytes).c_str());
  }
  std::printf("tensors: %zu, %s\n", reader.tensors().size(), human_bytes(tensor_bytes).c_str());
  for (const auto& t : reader.tensors()) {
    std::printf("  %-40s %-16s %-5s %s\n", t.name.c_str(), shape_text(t.shape).c_str(),
                c10::toString(t.dtype),
                human_bytes(t.numel() * static_cast<int64_t>(c10::elementSize(t.dtype))).c_str());
  }
  if (verify) std::printf("verified: every file matches its crc32\n");
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  auto* ckpt = app.add_subcommand(
      "ckpt", "Inspect, export and reshard sharded checkpoints (see docs/checkpoints.md)");
  ckpt->require_subcommand(1);

  // Each subcommand's option values live in one struct that its callback owns, so every
  // variable an option writes into is alive when CLI11 parses, whether or not the callback
  // reads it.
  auto* inspect_cmd = ckpt->add_subcommand(
      "inspect",
      "Print a checkpoint's tensors, shapes, dtypes, sizes and the layout it was "
      "written with (or the tensors of a plain safetensors file or Hugging Face folder)");
  struct InspectArgs {
    std::string dir;
    bool verify = false;
    bool json = false;
  };
  auto inspect_args = std::make_shared<InspectArgs>();
  inspect_cmd
      ->add_option("DIR", inspect_args->dir,
                   "checkpoint directory (or a checkpoints root: its latest; or a .safetensors "
                   "file or Hugging Face folder)")
      ->required();
  inspect_cmd->add_flag("--verify", inspect_args->verify, "check the crc32 of every file in full");
  inspect_cmd->add_flag("--json", inspect_args->json, "print index.json instead of the summary");
  inspect_cmd->callback([a = inspect_args] { inspect(a->dir, a->verify, a->json); });

  auto* export_cmd = ckpt->add_subcommand(
      "export", "Write one consolidated model with Hugging Face names and its config.json");
  struct ExportArgs {
    std::string dir;
    std::string out;
    std::string format;
    std::string lora;
    std::string base;
    bool force = false;
  };
  auto export_args = std::make_shared<ExportArgs>();
  export_cmd->add_option("DIR", export_args->dir, "checkpoint directory")->required();
  export_cmd->add_option("OUT", export_args->out, "output folder (model.safetensors, config.json)")
      ->required();
  export_cmd->add_option("--format", export_args->format, "output format")
      ->required()
      ->check(CLI::IsMember({"hf"}));
  export_cmd->add_flag("--force", export_args->force,
                       "replace the files it writes in a non-empty OUT");
  export_cmd
      ->add_option("--lora", export_args->lora,
                   "for a LoRA run's checkpoint: \"adapters\" (PEFT's adapter_model.safetensors "
                   "and adapter_config.json) or \"merged\" (the base model with the adapters "
                   "merged in)")
      ->check(CLI::IsMember({"adapters", "merged"}));
  export_cmd->add_option("--base", export_args->base,
                         "with --lora merged: the base model's Hugging Face weights (default: "
                         "the run's model.init_from, or its seed's initialization)");
  export_cmd->callback([a = export_args] {
    if (!a->base.empty() && a->lora != "merged") {
      throw std::invalid_argument("ckpt export: --base is the base model of --lora merged");
    }
    if (a->lora.empty()) {
      export_hf_checkpoint(checkpoint_dir(a->dir), a->out, a->force);
      std::printf("wrote %s/model.safetensors and %s/config.json\n", a->out.c_str(),
                  a->out.c_str());
      return;
    }
    const bool merged = a->lora == "merged";
    export_lora_checkpoint(checkpoint_dir(a->dir), a->out,
                           merged ? LoraExport::kMerged : LoraExport::kAdapters, a->base, a->force);
    std::printf("wrote %s/%s and %s/%s\n", a->out.c_str(),
                merged ? "model.safetensors" : "adapter_model.safetensors", a->out.c_str(),
                merged ? "config.json" : "adapter_config.json");
  });

  auto* reshard_cmd = ckpt->add_subcommand(
      "reshard", "Rewrite a checkpoint as N rank files (offline; any strategy loads either)");
  struct ReshardArgs {
    std::string dir;
    std::string out;
    int world_size = 1;
  };
  auto reshard_args = std::make_shared<ReshardArgs>();
  reshard_cmd->add_option("DIR", reshard_args->dir, "checkpoint directory")->required();
  reshard_cmd->add_option("OUT", reshard_args->out, "new checkpoint directory (must not exist)")
      ->required();
  reshard_cmd->add_option("--world-size", reshard_args->world_size, "number of rank files to write")
      ->required()
      ->check(CLI::Range(1, 1 << 20));
  reshard_cmd->callback([a = reshard_args] {
    // A line at every tenth of the bytes, or every 10 s, so a long reshard is not silent.
    const StopOnSignal stop;
    auto last = std::chrono::steady_clock::now();
    int64_t reported = -1;
    reshard_checkpoint(
        checkpoint_dir(a->dir), a->out, a->world_size, [&](int64_t done, int64_t total) {
          if (g_signal != 0) {
            throw std::runtime_error(std::string("reshard interrupted (") +
                                     (g_signal == SIGINT ? "SIGINT" : "SIGTERM") +
                                     "): nothing of '" + a->out + "' was kept");
          }
          const auto now = std::chrono::steady_clock::now();
          const int64_t tenth = total > 0 ? done * 10 / total : 10;
          if (tenth > reported || now - last > std::chrono::seconds(10)) {
            std::printf("reshard: %s of %s written (%lld%%)\n", human_bytes(done).c_str(),
                        human_bytes(total).c_str(),
                        static_cast<long long>(total > 0 ? done * 100 / total : 100));
            std::fflush(stdout);
            reported = tenth;
            last = now;
          }
        });
    std::printf("wrote %s with %d rank files\n", a->out.c_str(), a->world_size);
  });
}

}  // namespace shardtrain::cli
