#include "app.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "commands.h"
#include "shardtrain/threads.h"

namespace shardtrain::cli {

int run(std::vector<std::string> args, std::ostream& out, std::ostream& err) {
  // Everything after the first "--" is the program `launch` runs; CLI11 never sees it.
  std::vector<std::string> command;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {
      command.assign(args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      args.resize(i);
      break;
    }
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector

  CLI::App app{
      "shardtrain: distributed training for LibTorch (DDP, FSDP, ZeRO, tensor, pipeline, "
      "context and expert parallelism)",
      "shardtrain"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "shardtrain 0.1.0");
  int exit_code = 0;
  add_launch_command(app, command, exit_code);
  add_train_command(app);
  add_data_command(app);
  add_generate_command(app);
  add_bench_command(app, exit_code);
  add_plan_command(app);
  add_ckpt_command(app);
  add_trace_command(app);
  add_report_command(app);
  try {
    // bf16 products of every subcommand in fp32 where LibTorch's own are slow (threads.h).
    use_fp32_gemm_for_cpu_bf16();
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every usage error exits 2, as getopt tools do, with one line
    // as every other error has.
    if (e.get_exit_code() == 0) return app.exit(e, out, err);
    err << "shardtrain: error: " << e.what() << " (see --help)\n";
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A path the system refuses (too long, not a directory, no permission) is bad input too.
    err << "shardtrain: error: '" << e.path1().string() << "': " << e.code().message() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    // Bad input (a flag, a config key, a file, the environment): status 2, like a usage error.
    err << "shardtrain: error: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    // LibTorch's own checks: one line, with its C++ stack only when SHARDTRAIN_DEBUG is set.
    err << "shardtrain: error: "
        << (std::getenv("SHARDTRAIN_DEBUG") ? e.what() : e.what_without_backtrace()) << "\n";
    return exit_code ? exit_code : 1;
  } catch (const std::exception& e) {
    err << "shardtrain: error: " << e.what() << "\n";
    return exit_code ? exit_code : 1;
  }
  return exit_code;
}

}  // namespace shardtrain::cli
