// shardtrain <subcommand>: parses arguments into option structs and calls the library.
#include <malloc.h>

#include <cstdlib>
#include <iostream>

#include "commands.h"

int main(int argc, char** argv) {
  // Training allocates and frees the same large blocks (logits, activations) every step. glibc
  // serves blocks over 32 MiB with fresh mmaps and unmaps them on free, so each step would fault
  // hundreds of MB back in: keeping them in the heap halves the demo's step time. A user's own
  // MALLOC_* settings win.
  if (!std::getenv("MALLOC_MMAP_MAX_") && !std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    mallopt(M_MMAP_MAX, 0);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  // Everything after the first "--" is the program `launch` runs; CLI11 never sees it.
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> command;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      command.assign(args.begin() + i + 1, args.end());
      args.resize(i);
      break;
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector

  CLI::App app{"shardtrain: distributed training for LibTorch (DDP, FSDP, ZeRO, TP, PP)",
               "shardtrain"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardtrain 0.1.0");
  int exit_code = 0;
  shardtrain::cli::add_launch_command(app, command, exit_code);
  shardtrain::cli::add_train_command(app);
  shardtrain::cli::add_data_command(app);
  shardtrain::cli::add_bench_command(app, exit_code);
  shardtrain::cli::add_plan_command(app);
  shardtrain::cli::add_ckpt_command(app);
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error exits 2, as getopt tools do.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::invalid_argument& e) {
    // Bad input (a flag, a config key, a file, the environment): status 2, like a usage error.
    std::cerr << "shardtrain: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "shardtrain: error: " << e.what() << "\n";
    return exit_code ? exit_code : 1;
  }
  return exit_code;
}
