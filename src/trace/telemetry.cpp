#include "trace/telemetry.h"

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <utility>

#include "common/file_error.h"

namespace shardtrain::detail {
namespace {

double wall_offset_us() {
  const auto wall = std::chrono::system_clock::now().time_since_epoch();
  const auto steady = Telemetry::Clock::now().time_since_epoch();
  return std::chrono::duration<double, std::micro>(wall).count() -
         std::chrono::duration<double, std::micro>(steady).count();
}

int64_t nanoseconds(double seconds) { return static_cast<int64_t>(seconds * 1e9); }

thread_local std::shared_ptr<Telemetry> current;

}  // namespace

Telemetry::Telemetry(int rank) : rank_(rank), wall_offset_us_(wall_offset_us()) {
  std::lock_guard<std::mutex> lock(mutex_);
  name_thread_locked("train");
}

double Telemetry::microseconds(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count() + wall_offset_us_;
}

int Telemetry::row_named_locked(const std::string& name) {
  auto [it, added] = named_rows_.emplace(name, static_cast<int>(row_names_.size()) + 1);
  if (added) row_names_.push_back(name);
  return it->second;
}

void Telemetry::name_thread_locked(const std::string& name) {
  thread_rows_[std::this_thread::get_id()] = row_named_locked(name);
}

int Telemetry::row_of_thread_locked() {
  const auto found = thread_rows_.find(std::this_thread::get_id());
  if (found != thread_rows_.end()) return found->second;
  const int row = row_named_locked("thread " + std::to_string(thread_rows_.size()));
  thread_rows_[std::this_thread::get_id()] = row;
  return row;
}

void Telemetry::name_thread(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  name_thread_locked(name);
}

void Telemetry::add_span(const char* name, const char* category, Clock::time_point start,
                         Clock::time_point end, nlohmann::json args) {
  if (!tracing()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  add_event_locked(row_of_thread_locked(), name, category, start, end, std::move(args));
}

void Telemetry::add_span_on(const std::string& row, const std::string& name, const char* category,
                            Clock::time_point start, Clock::time_point end, nlohmann::json args) {
  if (!tracing()) return;
  std::lock_guard<std::mutex> lock(mutex_);
  add_event_locked(row_named_locked(row), name, category, start, end, std::move(args));
}

void Telemetry::add_event_locked(int row, const std::string& name, const char* category,
                                 Clock::time_point start, Clock::time_point end,
                                 nlohmann::json args) {
  nlohmann::json event = {{"ph", "X"},
                          {"name", name},
                          {"cat", category},
                          {"pid", rank_},
                          {"tid", row},
                          {"ts", microseconds(start)},
                          {"dur", std::chrono::duration<double, std::micro>(end - start).count()}};
  if (!args.is_null()) event["args"] = std::move(args);
  events_.push_back(std::move(event));
}

void Telemetry::add_communication(double seconds, int64_t bytes) {
  comm_ns_.fetch_add(nanoseconds(seconds), std::memory_order_relaxed);
  comm_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void Telemetry::add_wait(double seconds) {
  wait_ns_.fetch_add(nanoseconds(seconds), std::memory_order_relaxed);
}

void Telemetry::add_tensor_parallel(double seconds, int64_t bytes) {
  tp_ns_.fetch_add(nanoseconds(seconds), std::memory_order_relaxed);
  tp_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

Telemetry::Totals Telemetry::interval() {
  const int64_t comm = comm_ns_.load(), wait = wait_ns_.load(), bytes = comm_bytes_.load();
  const int64_t tp = tp_ns_.load(), tp_bytes = tp_bytes_.load();
  Totals added;
  added.comm_seconds = static_cast<double>(comm - std::exchange(interval_comm_ns_, comm)) * 1e-9;
  added.wait_seconds = static_cast<double>(wait - std::exchange(interval_wait_ns_, wait)) * 1e-9;
  added.comm_bytes = bytes - std::exchange(interval_comm_bytes_, bytes);
  added.tp_seconds = static_cast<double>(tp - std::exchange(interval_tp_ns_, tp)) * 1e-9;
  added.tp_bytes = tp_bytes - std::exchange(interval_tp_bytes_, tp_bytes);
  return added;
}

nlohmann::json Telemetry::trace() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  events.push_back({{"ph", "M"},
                    {"name", "process_sort_index"},
                    {"pid", rank_},
                    {"args", {{"sort_index", rank_}}}});
  for (size_t i = 0; i < row_names_.size(); ++i) {
    const int tid = static_cast<int>(i) + 1;
    events.push_back({{"ph", "M"},
                      {"name", "thread_name"},
                      {"pid", rank_},
                      {"tid", tid},
                      {"args", {{"name", row_names_[i]}}}});
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", rank_},
                      {"tid", tid},
                      {"args", {{"sort_index", tid}}}});
  }
  for (const auto& event : events_) events.push_back(event);
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

void Telemetry::write_trace(const std::string& path) const {
  const std::string text = trace().dump();
  const std::filesystem::path target(path);
  std::filesystem::create_directories(target.parent_path());
  replace_file(path, text + "\n");
}

const std::shared_ptr<Telemetry>& current_telemetry() { return current; }

TelemetryScope::TelemetryScope(std::shared_ptr<Telemetry> telemetry)
    : previous_(std::exchange(current, std::move(telemetry))) {}

TelemetryScope::~TelemetryScope() { current = std::move(previous_); }

TraceSpan::TraceSpan(const char* name, const char* category, nlohmann::json args)
    : name_(name), category_(category) {
  Telemetry* telemetry = current.get();
  if (!telemetry || !telemetry->tracing()) return;
  telemetry_ = telemetry;
  args_ = std::move(args);
  start_ = Telemetry::Clock::now();
}

TraceSpan::TraceSpan(std::string name, const char* category, nlohmann::json args)
    : TraceSpan("", category, std::move(args)) {
  owned_name_ = std::move(name);
}

TraceSpan::~TraceSpan() {
  if (!telemetry_) return;
  const auto end = Telemetry::Clock::now();
  try {
    telemetry_->add_span(owned_name_.empty() ? name_ : owned_name_.c_str(), category_, start_, end,
                         std::move(args_));
  } catch (const std::exception&) {
    // No memory for one more span: the trace misses it; the work it timed is unaffected.
  }
}

bool tracing_now() { return current && current->tracing(); }

std::shared_ptr<BackwardSpans> BackwardSpans::create(std::vector<std::string> names) {
  auto spans = std::make_shared<BackwardSpans>();
  spans->telemetry_ = current;
  spans->names_ = std::move(names);
  return spans;
}

void BackwardSpans::mark(const std::shared_ptr<BackwardSpans>& spans, const at::Tensor& boundary,
                         size_t index) {
  if (!boundary.requires_grad()) return;
  boundary.register_hook([spans, index](const at::Tensor&) { spans->reached(index); });
}

void BackwardSpans::reached(size_t index) {
  // Backward meets the boundaries from the last block's output down to the first one's input.
  const auto now = Telemetry::Clock::now();
  if (open_ == index && index < names_.size()) {
    telemetry_->add_span(names_[index].c_str(), "backward", start_, now);
  }
  open_ = index > 0 ? index - 1 : SIZE_MAX;
  start_ = now;
}

void record_comm_wait(const char* what, Telemetry::Clock::time_point start,
                      Telemetry::Clock::time_point end) {
  Telemetry* telemetry = current.get();
  if (!telemetry) return;
  telemetry->add_wait(std::chrono::duration<double>(end - start).count());
  telemetry->add_span(what, "wait", start, end);
}

}  // namespace shardtrain::detail
