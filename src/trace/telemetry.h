// What one rank's work cost, as it happens: communication time and bytes for metrics.jsonl, and,
// while a trace is being recorded, spans in Chrome's trace-event format (trace/rank_N.json).
//
// A Telemetry belongs to one rank (one Trainer). Ranks may be threads of one process, so it is
// found through the calling thread: TelemetryScope makes it current on a thread, and work
// handed to another thread (a collective on a group's worker, a file transfer on an I/O thread)
// carries the pointer it was issued under. Code with no current Telemetry records nothing.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

namespace shardtrain::detail {

class Telemetry {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Telemetry(int rank);

  int rank() const { return rank_; }

  // Spans are kept only between start_tracing() and stop_tracing(); counters always run.
  void start_tracing() { tracing_.store(true, std::memory_order_relaxed); }
  void stop_tracing() { tracing_.store(false, std::memory_order_relaxed); }
  bool tracing() const { return tracing_.load(std::memory_order_relaxed); }

  // One complete span ("ph": "X") on the calling thread's row.
  void add_span(const char* name, const char* category, Clock::time_point start,
                Clock::time_point end, nlohmann::json args = nullptr);
  // The same on a named row (a group's collectives run on its own row, whichever thread runs
  // them); the row is created on first use.
  void add_span_on(const std::string& row, const std::string& name, const char* category,
                   Clock::time_point start, Clock::time_point end, nlohmann::json args = nullptr);
  // Names the calling thread's row (the training thread is "train"; unnamed threads "thread N").
  void name_thread(const std::string& name);

  // A collective that ran for `seconds` and moved `bytes` of its tensors.
  void add_communication(double seconds, int64_t bytes);
  // A thread that needed a result waited `seconds` for communication or file transfers.
  void add_wait(double seconds);

  // A tensor-parallel collective the calling thread ran and waited for (tensor_parallel.h):
  // counted apart, as all of it is exposed.
  void add_tensor_parallel(double seconds, int64_t bytes);

  struct Totals {
    double comm_seconds = 0;
    double wait_seconds = 0;
    int64_t comm_bytes = 0;
    double tp_seconds = 0;
    int64_t tp_bytes = 0;
  };
  // What was added since the previous call (or since construction), and starts the next
  // interval. Consecutive intervals lose nothing: an operation is in the one it finished in.
  // Called by one thread (the one that trains).
  Totals interval();

  // Every span recorded so far, with a row-name event per row, as one Chrome trace object.
  nlohmann::json trace() const;
  // Writes trace() to `path` (through a temporary file and a rename).
  void write_trace(const std::string& path) const;

 private:
  int row_of_thread_locked();
  int row_named_locked(const std::string& name);
  void name_thread_locked(const std::string& name);
  void add_event_locked(int row, const std::string& name, const char* category,
                        Clock::time_point start, Clock::time_point end, nlohmann::json args);
  double microseconds(Clock::time_point t) const;

  const int rank_;
  // Chrome traces want one time base across processes: steady time shifted to the wall clock.
  const double wall_offset_us_;
  std::atomic<bool> tracing_{false};
  std::atomic<int64_t> comm_ns_{0}, wait_ns_{0}, comm_bytes_{0}, tp_ns_{0}, tp_bytes_{0};
  int64_t interval_comm_ns_ = 0, interval_wait_ns_ = 0, interval_comm_bytes_ = 0;
  int64_t interval_tp_ns_ = 0, interval_tp_bytes_ = 0;

  mutable std::mutex mutex_;
  std::vector<nlohmann::json> events_;
  std::map<std::thread::id, int> thread_rows_;
  std::map<std::string, int> named_rows_;
  std::vector<std::string> row_names_;  // index + 1 is the row's tid
};

// The calling thread's current Telemetry, or null.
const std::shared_ptr<Telemetry>& current_telemetry();

// Makes `telemetry` current on this thread for the scope's lifetime (null: none), restoring the
// previous one after.
class TelemetryScope {
 public:
  explicit TelemetryScope(std::shared_ptr<Telemetry> telemetry);
  ~TelemetryScope();
  TelemetryScope(const TelemetryScope&) = delete;
  TelemetryScope& operator=(const TelemetryScope&) = delete;

 private:
  std::shared_ptr<Telemetry> previous_;
};

// A span from construction to destruction on this thread's row of the current Telemetry, when
// it is tracing; otherwise nothing is read but one thread-local pointer. Lives on the stack
// inside the TelemetryScope that made the Telemetry current (it keeps a plain pointer).
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category, nlohmann::json args = nullptr);
  TraceSpan(std::string name, const char* category, nlohmann::json args = nullptr);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  Telemetry* telemetry_ = nullptr;
  const char* name_;
  std::string owned_name_;
  const char* category_;
  nlohmann::json args_;
  Telemetry::Clock::time_point start_;
};

// True when the calling thread's current Telemetry is tracing.
bool tracing_now();

// Spans for the backward pass of a sequence of blocks, whose boundaries are the gradients of the
// tensors between them: block i's backward begins when the gradient of its output arrives and
// ends when the gradient of its input does (the output of block i - 1, or the first block's
// input). Create it in forward while tracing and pass each boundary tensor to mark(); hooks on
// those tensors record the spans on the thread that runs backward.
class BackwardSpans {
 public:
  // `names[i]` names block i's span.
  static std::shared_ptr<BackwardSpans> create(std::vector<std::string> names);
  // `boundary` is the input of block `index` (index 0: the first block's input) or, with
  // index == names.size(), the last block's output. Tensors without a gradient are skipped.
  static void mark(const std::shared_ptr<BackwardSpans>& spans, const at::Tensor& boundary,
                   size_t index);

 private:
  void reached(size_t index);

  std::shared_ptr<Telemetry> telemetry_;
  std::vector<std::string> names_;
  size_t open_ = SIZE_MAX;  // the block whose span is open
  Telemetry::Clock::time_point start_;
};

// The calling thread waited from `start` to `end` for the collective `what` (a string literal):
// counted as exposed communication of its current Telemetry and, while tracing, a "wait" span.
void record_comm_wait(const char* what, Telemetry::Clock::time_point start,
                      Telemetry::Clock::time_point end);

}  // namespace shardtrain::detail
