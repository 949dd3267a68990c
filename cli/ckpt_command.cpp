// shardtrain ckpt inspect|export|reshard: reads, converts and reshards sharded checkpoints.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "commands.h"
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

void inspect(const std::string& path, bool verify, bool json) {
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

  auto* inspect_cmd = ckpt->add_subcommand(
      "inspect",
      "Print a checkpoint's tensors, shapes, dtypes, sizes and the layout it was "
      "written with");
  auto dir = std::make_shared<std::string>();
  auto verify = std::make_shared<bool>(false);
  auto json = std::make_shared<bool>(false);
  inspect_cmd->add_option("DIR", *dir, "checkpoint directory (or a checkpoints root: its latest)")
      ->required();
  inspect_cmd->add_flag("--verify", *verify, "check the crc32 of every file in full");
  inspect_cmd->add_flag("--json", *json, "print index.json instead of the summary");
  inspect_cmd->callback([=] { inspect(*dir, *verify, *json); });

  auto* export_cmd = ckpt->add_subcommand(
      "export", "Write one consolidated model with Hugging Face names and its config.json");
  auto export_dir = std::make_shared<std::string>();
  auto format = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  export_cmd->add_option("DIR", *export_dir, "checkpoint directory")->required();
  export_cmd->add_option("OUT", *out, "output folder (model.safetensors, config.json)")->required();
  export_cmd->add_option("--format", *format, "output format")
      ->required()
      ->check(CLI::IsMember({"hf"}));
  export_cmd->callback([=] {
    export_hf_checkpoint(checkpoint_dir(*export_dir), *out);
    std::printf("wrote %s/model.safetensors and %s/config.json\n", out->c_str(), out->c_str());
  });

  auto* reshard_cmd = ckpt->add_subcommand(
      "reshard", "Rewrite a checkpoint as N rank files (offline; any strategy loads either)");
  auto reshard_dir = std::make_shared<std::string>();
  auto reshard_out = std::make_shared<std::string>();
  auto world = std::make_shared<int>(1);
  reshard_cmd->add_option("DIR", *reshard_dir, "checkpoint directory")->required();
  reshard_cmd->add_option("OUT", *reshard_out, "new checkpoint directory (must not exist)")
      ->required();
  reshard_cmd->add_option("--world-size", *world, "number of rank files to write")
      ->required()
      ->check(CLI::PositiveNumber);
  reshard_cmd->callback([=] {
    reshard_checkpoint(checkpoint_dir(*reshard_dir), *reshard_out, *world);
    std::printf("wrote %s with %d rank files\n", reshard_out->c_str(), *world);
  });
}

}  // namespace shardtrain::cli
