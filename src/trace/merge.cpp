#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <stdexcept>

#include "common/file_error.h"
#include "shardtrain/trace.h"

namespace shardtrain {

int merge_traces(const std::string& run_dir, const std::string& out_path) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(run_dir) / "trace";
  if (!fs::is_directory(dir)) {
    throw std::invalid_argument("'" + run_dir +
                                "' has no trace/ directory: train with run.trace = true to "
                                "record one");
  }
  // Ranks in order, so the merged file lists them as the run numbered them.
  std::map<int, fs::path> files;
  const std::regex name(R"(rank_(\d{1,9})\.json)");
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch match;
    const std::string file = entry.path().filename().string();
    if (std::regex_match(file, match, name)) files[std::stoi(match[1])] = entry.path();
  }
  if (files.empty()) {
    throw std::invalid_argument("'" + dir.string() + "' holds no rank_N.json trace files");
  }
  nlohmann::json events = nlohmann::json::array();
  for (const auto& [rank, path] : files) {
    std::ifstream in(path);
    nlohmann::json trace;
    try {
      trace = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument("trace '" + path.string() + "' is not JSON: " + e.what());
    }
    if (!trace.is_object() || !trace.contains("traceEvents") || !trace["traceEvents"].is_array()) {
      throw std::invalid_argument("trace '" + path.string() + "' has no traceEvents array");
    }
    for (auto& event : trace["traceEvents"]) events.push_back(std::move(event));
  }
  const nlohmann::json merged = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  detail::replace_file(out_path, merged.dump() + "\n");
  return static_cast<int>(files.size());
}

}  // namespace shardtrain
