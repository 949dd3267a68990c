"""One row of a memory table from a run's metrics.jsonl: the largest rank's peak RSS at the last
step, the largest model state per rank, the planner's estimate and its error, and the median
step time (the first step left out as warm-up when there are more).
Usage: python3 bench/peak_row.py METRICS ESTIMATE_BYTES LABEL...  (LABELs are the first columns)
Also writes METRICS.peak with the peak in bytes, for scripts that compare runs."""
import json
import statistics
import sys

path, estimate, labels = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
rows = [json.loads(line) for line in open(path)]
last = max(r["step"] for r in rows)
peak = max(r["mem"]["peak_rss"] for r in rows if r["step"] == last)
state = max(r["mem"]["params"] + r["mem"]["grads"] + r["mem"]["optim"] for r in rows)
steps = sorted({r["step"] for r in rows})[1:] or [last]
median = statistics.median(max(r["step_time_s"] for r in rows if r["step"] == s) for s in steps)
mib = 1 << 20
print("| " + " | ".join(labels) + f" | {peak / mib:,.0f} | {state / mib:,.0f} | {estimate / mib:,.0f} | "
      f"{100 * (estimate - peak) / peak:+.1f}% | {median:.2f} |")
with open(path + ".peak", "w") as out:
    out.write(str(peak))
