#!/usr/bin/env python3
"""Time a failure costs a job whose replicas train on and heal the failed one.

The same run as bench/restart_cost.py (the GPT-2 124M shape, micro-batch 1, seq 128, DDP on
NPROC ranks, the last rank SIGKILLed right after step KILL through SHARDTRAIN_KILL_AFTER_STEP),
under `shardtrain launch --fault-tolerance --max-restarts 1` with run.fault_tolerance =
"replicas" and no checkpoints. From rank 0's lines of metrics.jsonl (written as each step ends)
and the wall clock of the progress lines:
  step time     median step time of the steps before the kill;
  failed step   the extra time of the step the replica was lost in (its collective failing,
                the new membership, the step taken again);
  degraded      the steps taken without the replica, and the work they left undone: their time
                x (NPROC - replicas) / NPROC (the lost replica's share of each global batch,
                which a full-speed job would need that long to train);
  healing       the extra time of the step that took the replica in again (the training state
                sent to it over the group);
  time lost     failed step + undone work + healing. Nothing else stops: the replicas that
                remain never restart or read a checkpoint.

With REPLICATE the job is FSDP hybrid_shard instead: REPLICATE replicas of NPROC / REPLICATE
ranks each (parallel.fsdp.replicate), the killed rank's whole replica restarted and healed shard
by shard; the undone work is then each degraded step's time x the missing replicas' share.

Usage: python3 bench/replica_cost.py [NPROC] [KILL] [AFTER] [REPLICATE]   (from the repository
root, after a build; AFTER: steps after the kill, enough for the restarted replica to rejoin).
Prints one Markdown table row.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
binary = os.path.join(root, "build", "shardtrain")
nproc = int(sys.argv[1]) if len(sys.argv) > 1 else 2
kill = int(sys.argv[2]) if len(sys.argv) > 2 else 7
after = int(sys.argv[3]) if len(sys.argv) > 3 else 12
steps = kill + after
replicate = int(sys.argv[4]) if len(sys.argv) > 4 else 0
replicas = replicate or nproc

work = tempfile.mkdtemp()
settings = {"train.steps": steps, "train.final_checkpoint": "false",
            "train.checkpoint_every": 0, "parallel.strategy": "ddp", "run.log_every": 1,
            "run.fault_tolerance": '"replicas"', "run.dir": f'"{work}/run"'}
if replicate:
    settings.update({"parallel.strategy": "fsdp", "parallel.fsdp.sharding": "hybrid_shard",
                     "parallel.fsdp.replicate": replicate})
env = dict(os.environ, SHARDTRAIN_KILL_AFTER_STEP=str(kill))
command = [binary, "launch", "--fault-tolerance", "--nproc", str(nproc), "--max-restarts", "1",
           "--kill-timeout", "2", "--", binary, "train", "--config",
           os.path.join(root, "bench", "gpt2_124m.toml")]
for key, value in settings.items():
    command += ["--set", f"{key}={value}"]
job = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                     env=env)
if job.returncode != 0:
    sys.exit("the job failed:\n" + job.stdout[-3000:])

lines = {}
with open(os.path.join(work, "run", "metrics.jsonl")) as metrics:
    for text in metrics:
        line = json.loads(text)
        if line["rank"] == 0:
            lines[line["step"]] = line
step_time = statistics.median(lines[s]["step_time_s"] for s in range(2, kill + 1))
degraded = [s for s in range(1, steps + 1) if lines[s]["replicas"] < replicas]
if not degraded or degraded[-1] == steps:
    sys.exit(f"the replica did not rejoin within {after} steps: raise AFTER")
failed = lines[kill + 1]["step_time_s"] - step_time
undone = sum(lines[s]["step_time_s"] * (replicas - lines[s]["replicas"]) / replicas
             for s in degraded)
healed = degraded[-1] + 1
healing = lines[healed]["step_time_s"] - step_time
lost = failed + undone + healing
layout = f"{nproc} (hybrid_shard {replicate} x {nproc // replicate})" if replicate else f"{nproc}"
print(f"| {layout} | {kill} | {step_time:.2f} | {failed:.2f} | {len(degraded)} | {undone:.1f} "
      f"| {healing:.2f} | {lost:.1f} |")
