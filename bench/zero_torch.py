"""PyTorch's ZeroRedundancyOptimizer (gloo) on the model of bench/zero_bench.cpp: the same
GPT-2-family Transformer, batch, optimizer and launch (shardtrain launch sets torchrun's
variables). The model mirrors shardtrain's module for module, so the parameter counts printed
by both sides must be equal. --stage 0 runs plain DistributedDataParallel with AdamW instead.
Rank 0 prints one JSON line with the median step time and the median of each phase."""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel

parser = argparse.ArgumentParser()
parser.add_argument("--d-model", type=int, default=128)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--heads", type=int, default=4)
parser.add_argument("--ffn", type=int, default=512)
parser.add_argument("--vocab", type=int, default=50257)
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--batch", type=int, default=4, help="sequences per rank")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--stage", type=int, default=1, choices=[0, 1])
args = parser.parse_args()


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (p.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for p in self.qkv(x).chunk(3, -1))
        # 1.13's private name of the fused kernel: (q, k, v, attn_mask, dropout_p,
        # need_attn_weights, is_causal) -> (output, weights)
        out = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]
        return self.proj(out.transpose(1, 2).contiguous().view(b, t, d))


class Mlp(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.fc = nn.Linear(d, ffn)
        self.proj = nn.Linear(ffn, d)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.attn = Attention(d, heads)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.mlp = Mlp(d, ffn)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class Transformer(nn.Module):
    """Token and position embeddings, pre-norm blocks, final LayerNorm, head tied to the token
    embedding; GPT-2's initialization, as shardtrain's."""

    def __init__(self, vocab, seq, d, layers, heads, ffn):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, ffn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        residual_std = 0.02 / math.sqrt(2 * layers)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1 and name.endswith(".bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(1.0)
                else:
                    residual = name.endswith("attn.proj.weight") or name.endswith("mlp.proj.weight")
                    p.normal_(0.0, residual_std if residual else 0.02)

    def forward(self, tokens):
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok_emb.weight)


torch.set_num_threads(1)
dist.init_process_group("gloo")
torch.manual_seed(0)
net = Transformer(args.vocab, args.seq, args.d_model, args.layers, args.heads, args.ffn)
params = sum(p.numel() for p in net.parameters())  # the tied head counts once
model = DistributedDataParallel(net)
if args.stage == 1:
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                        lr=1e-3, weight_decay=0.1)
else:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

# One fixed batch per rank: [batch, seq + 1] tokens, inputs and next-token targets.
torch.manual_seed(1 + dist.get_rank())
tokens = torch.randint(args.vocab, (args.batch, args.seq + 1))
inputs = tokens[:, :-1]
targets = tokens[:, 1:].reshape(-1)

# ZeroRedundancyOptimizer.step broadcasts the updated parameters and waits for them, so that
# communication is counted in "optimizer".
phases = {name: [] for name in ("zero_grad", "forward", "backward", "optimizer", "after_step")}
total = []
for s in range(args.warmup + args.steps):
    marks = [time.perf_counter()]
    optimizer.zero_grad()
    marks.append(time.perf_counter())
    loss = F.cross_entropy(model(inputs).reshape(-1, args.vocab), targets)
    marks.append(time.perf_counter())
    loss.backward()
    marks.append(time.perf_counter())
    optimizer.step()
    marks.append(time.perf_counter())
    marks.append(marks[-1])  # nothing after the step
    if s >= args.warmup:
        for name, start, end in zip(phases, marks, marks[1:]):
            phases[name].append(end - start)
        total.append(marks[-1] - marks[0])
if dist.get_rank() == 0:
    print(json.dumps({"impl": "pytorch", "ranks": dist.get_world_size(), "stage": args.stage,
                      "params": params, "median_step_s": round(statistics.median(total), 5),
                      "median_phase_s": {name: round(statistics.median(v), 5)
                                         for name, v in phases.items()}}))
# No rank leaves while another still communicates. Then exit without the interpreter's shutdown:
# under Python 3.11 it can abort the process after the results are printed, when one of PyTorch
# 1.13's Gloo worker threads releases a tensor while the interpreter finalizes (the thread is
# unwound by pthread_exit through a noexcept frame: "terminate called without an active
# exception").
dist.barrier()
sys.stdout.flush()
os._exit(0)
