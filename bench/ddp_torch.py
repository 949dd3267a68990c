"""PyTorch's DistributedDataParallel (gloo) on the MLP of bench/ddp_bench.cpp: same shape, batch,
optimizer and launch (shardtrain launch sets torchrun's variables). Rank 0 prints one JSON line
with the median step time."""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--layers", type=int, default=8)
parser.add_argument("--width", type=int, default=1024)
parser.add_argument("--batch", type=int, default=32)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
layers = []
for _ in range(args.layers):
    layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=args.bucket_cap_mb)
sgd = torch.optim.SGD(model.parameters(), lr=0.01)
torch.manual_seed(1 + dist.get_rank())
x = torch.randn(args.batch, args.width)
y = torch.randn(args.batch, args.width)
times, forward, backward = [], [], []
for s in range(args.warmup + args.steps):
    start = time.perf_counter()
    sgd.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    forward_end = time.perf_counter()
    loss.backward()  # returns once every bucket's all-reduce has completed
    backward_end = time.perf_counter()
    sgd.step()
    if s >= args.warmup:
        times.append(time.perf_counter() - start)
        forward.append(forward_end - start)
        backward.append(backward_end - forward_end)
if dist.get_rank() == 0:
    print(json.dumps({"impl": "pytorch", "ranks": dist.get_world_size(),
                      "median_step_s": round(statistics.median(times), 5),
                      "median_forward_s": round(statistics.median(forward), 5),
                      "median_backward_s": round(statistics.median(backward), 5)}))
dist.destroy_process_group()
