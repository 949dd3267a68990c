#!/usr/bin/env python3
"""Time a failure costs a job that restarts from its latest checkpoint.

Runs `shardtrain launch --nproc NPROC --max-restarts 1` on the GPT-2 124M shape (micro-batch 1,
seq 128, DDP) with a checkpoint every INTERVAL steps; the last rank kills itself (SIGKILL) right
after step KILL (SHARDTRAIN_KILL_AFTER_STEP, first attempt only). Every progress line
(run.log_every = 1) is stamped with the wall clock as it arrives, from outside the job:
  step time   median gap between consecutive step lines of the first attempt;
  restart     from the last step line before the kill to the first step line after it, less
              the one step that line took (detection, stopping, starting the ranks again,
              rendezvous, loading the checkpoint);
  time lost   restart + the KILL - checkpoint steps trained again; per failure on average
              restart + (INTERVAL / 2) x step time (the failure falls anywhere in an interval).

Usage: python3 bench/restart_cost.py [NPROC] [INTERVAL] [KILL]   (from the repository root,
after a build). Prints one Markdown table row.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
binary = os.path.join(root, "build", "shardtrain")
nproc = int(sys.argv[1]) if len(sys.argv) > 1 else 2
interval = int(sys.argv[2]) if len(sys.argv) > 2 else 4
kill = int(sys.argv[3]) if len(sys.argv) > 3 else 7
steps = kill + 4

work = tempfile.mkdtemp()
settings = {"train.steps": steps, "train.final_checkpoint": "false",
            "train.checkpoint_every": interval, "parallel.strategy": "ddp", "run.log_every": 1,
            "run.dir": f'"{work}/run"'}

env = dict(os.environ, SHARDTRAIN_KILL_AFTER_STEP=str(kill))
command = [binary, "launch", "--nproc", str(nproc), "--max-restarts", "1", "--kill-timeout", "2",
           "--", binary, "train", "--config", os.path.join(root, "bench", "gpt2_124m.toml")]
for key, value in settings.items():
    command += ["--set", f"{key}={value}"]
lines = []  # (seconds since start, attempt, step)
start = time.monotonic()
attempt = 0
with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      env=env) as job:
    for line in job.stdout:
        now = time.monotonic() - start
        if "restarting (1 of 1)" in line:
            attempt = 1
        match = re.match(r"\[rank 0\] step\s+(\d+)/", line)
        if match:
            lines.append((now, attempt, int(match.group(1))))
    if job.wait() != 0:
        sys.exit("the job failed")

first = [(t, s) for t, a, s in lines if a == 0]
second = [(t, s) for t, a, s in lines if a == 1]
step_time = statistics.median(b[0] - a[0] for a, b in zip(first, first[1:]))
resumed_at = (kill // interval) * interval
redone = kill - resumed_at  # steps trained again after the restart
before = first[-1][0]  # the last step line before the kill
after = second[0][0]   # the first step line after the restart (step resumed_at + 1)
restart = (after - before) - step_time  # the first step after the restart took a step's time
lost = restart + redone * step_time
print(f"| {nproc} | {interval} | {kill} | {step_time:.2f} | {restart:.1f} | {redone} | {lost:.1f} "
      f"| {restart + interval / 2 * step_time:.1f} |")
