// The whole command line as one call, so that the `shardtrain` program and tests run the same
// parsing and subcommands.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace shardtrain::cli {

// Parses `args` (the words after the program name) and runs the chosen subcommand. Returns the
// exit status: 0 on success (and for --help, --version), 2 for a usage error or bad input
// (one line on `err`; a path the file system refuses counts as bad input), the failed rank's status for `launch`, 1 for other failures. Usage and
// error text go to `out`/`err`; subcommands print their results to standard output.
int run(std::vector<std::string> args, std::ostream& out, std::ostream& err);

}  // namespace shardtrain::cli
