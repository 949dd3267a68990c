#!/usr/bin/env bash
# How long a checkpoint save stops training, synchronous (run.checkpoint_async = false) against
# asynchronous (true), on the GPT-2 124M shape (bench/gpt2_124m.toml: micro-batch 1, seq 128;
# 1.49 GB of fp32 parameters and AdamW moments per checkpoint). Each run trains 13 steps with a
# save after steps 4, 8 and 12 and no final save: the interval (about 10 s here) is longer than a
# save's write, so a save does not wait for the previous one. Times are read from outside the
# trainer, from the wall-clock times at which metrics.jsonl's lines are written (elapsed_s): the
# gap between step k's line and step k+1's holds step k+1 and, after a save step, what the save
# blocked. Blocked = that gap minus the same gap of a run that saves nothing ("none"), for the
# run's first save (step 4) and for the later ones (steps 8 and 12, median). The asynchronous run
# allocates and faults in its copies' host memory behind steps 2 to 4 (reported: the time from
# step 1's line to step 4's); a synchronous save's write allocates nothing of the kind. Also: the gap after the step after a save (steps 5
# and 9, median: what a write behind training costs the step it overlaps) and the run's wall time
# (/usr/bin/time; the asynchronous run waits for its last save before it exits). Medians over
# ROUNDS rounds whose order rotates.
# Usage: bash bench/async_checkpoint.sh [ROUNDS]  (from the repository root, after a build; one
# process).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="$root/build/shardtrain"
rounds="${1:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (Debian package: time)"; exit 1; }

run() {  # mode round: appends "first_gap later_gap gap_after_other wall" to $work/mode.rows
  local mode="$1" dir="$work/runs/$1_$2" flags=()
  case "$mode" in
    none) flags=(--set train.checkpoint_every=0) ;;
    sync) flags=(--set train.checkpoint_every=4 --set run.checkpoint_async=false) ;;
    async) flags=(--set train.checkpoint_every=4 --set run.checkpoint_async=true) ;;
  esac
  /usr/bin/time -f "%e" -o "$dir.time" "$bin" train --config "$root/bench/gpt2_124m.toml" \
    --set train.steps=13 --set train.final_checkpoint=false --set run.log_every=1000 "${flags[@]}" \
    --set "run.dir=\"$dir\"" >"$dir.log" 2>&1 ||
    { echo "run $mode failed:"; tail -5 "$dir.log"; exit 1; }
  python3 - "$dir/metrics.jsonl" "$dir.time" >>"$work/$mode.rows" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
at = {}
for r in rows:  # the slowest rank's time for each step
    at[r["step"]] = max(at.get(r["step"], 0.0), r["elapsed_s"])
first = at[5] - at[4]  # the run's first save
later = statistics.median([at[9] - at[8], at[13] - at[12]])
after_other = statistics.median([at[6] - at[5], at[10] - at[9]])  # steps a write overlaps
before = at[4] - at[1]  # steps 2 to 4: the asynchronous run prepares its copy's memory behind them
print(first, later, after_other, open(sys.argv[2]).read().split()[-1], before)
PY
}

modes=(none sync async)
mkdir -p "$work/runs"
for round in $(seq 1 "$rounds"); do
  for k in 0 1 2; do run "${modes[$(((round + k) % 3))]}" "$round"; done
done

python3 - "$work" <<'PY'
import statistics, sys
work = sys.argv[1]
def rows(mode):
    return [tuple(map(float, line.split())) for line in open(f"{work}/{mode}.rows")]
none, sync, asyn = rows("none"), rows("sync"), rows("async")
print(f"GPT-2 124M shape, 1 rank(s), {len(none)} round(s)")
print("| mode | steps 2 to 4, s | first save: gap, s | blocked, s | later saves: gap, s "
      "| blocked, s | gap after the step after a save, s | run wall time, s |")
print("|---|---|---|---|---|---|---|---|")
base_first = statistics.median(r[0] for r in none)
base_later = statistics.median(r[1] for r in none)
blocked = {}
for name, rs in (("none", none), ("sync", sync), ("async", asyn)):
    first = statistics.median(r[0] for r in rs)
    later = statistics.median(r[1] for r in rs)
    blocked[name] = (first - base_first, later - base_later)
    other = statistics.median(r[2] for r in rs)
    wall = statistics.median(r[3] for r in rs)
    before = statistics.median(r[4] for r in rs)
    print(f"| {name} | {before:.2f} | {first:.2f} | {blocked[name][0]:.2f} | {later:.2f} | {blocked[name][1]:.2f} "
          f"| {other:.2f} | {wall:.1f} |")
print(f"async blocked / sync blocked: first save {blocked['async'][0] / blocked['sync'][0]:.3f}, "
      f"later saves {blocked['async'][1] / blocked['sync'][1]:.3f}")
PY
