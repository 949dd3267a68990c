"""PyTorch eager on one CUDA GPU: GPT-2 124M (shardtrain's preset gpt2-124m: vocabulary 50257,
d_model 768, 12 blocks of 12 heads, FFN 3072, tied embeddings, biases, tanh GELU) trained at
sequence 1024 under bf16 autocast with fp32 parameters and fused AdamW, as shardtrain's
precision.autocast = "bf16" trains. The reference a CUDA shardtrain is to be compared with.

Prints one JSON line and one summary line: median step time, tokens/s, and model FLOP
utilization (MFU). Training FLOPs per token = 6·N + 12·L·T·d (PaLM, appendix B): N the
parameters that take part in a matrix product (all but the position embedding; the tied token
embedding counts once, as the head), L blocks, T the sequence length, d the model width; the
second term is attention's scores and weighted sum, forward and backward, counted without the
causal mask's saving. MFU = FLOPs per token x tokens/s over the GPU's dense bf16 peak (H100 and
H200 SXM: 989 TFLOP/s), and also over a bf16 matrix product measured here (the ceiling in fact).
Usage: python3 bench/gpu_torch.py [--batch 16] [--steps 20] [--warmup 5] [--peak-tflops 989]"""
import argparse
import json
import math
import statistics

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--batch", type=int, default=16, help="sequences per step")
parser.add_argument("--seq", type=int, default=1024)
parser.add_argument("--steps", type=int, default=20, help="timed steps")
parser.add_argument("--warmup", type=int, default=5)
parser.add_argument("--peak-tflops", type=float, default=None,
                    help="dense bf16 peak; default 989 for an H100 or H200, else required")
args = parser.parse_args()
assert torch.cuda.is_available(), "no CUDA device"
name = torch.cuda.get_device_name()
peak = args.peak_tflops or (989.0 if ("H100" in name or "H200" in name) else None)
assert peak, f"unknown peak for {name}: pass --peak-tflops"
V, T, D, L, H = 50257, args.seq, 768, 12, 12


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D, eps=1e-5), nn.LayerNorm(D, eps=1e-5)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.fc_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, D))
        return x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt2(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(D, eps=1e-5)
        for pname, p in self.named_parameters():  # GPT-2's: N(0, 0.02) matrices, zero biases
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)
            elif pname.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the head tied to the embedding


def cuda_time(fn, repeats):
    """Median milliseconds of fn() over `repeats` runs, each between two CUDA events."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# The ceiling in fact: an 8192^3 bf16 product on random data (zeros run faster than real data).
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
cuda_time(lambda: a @ b, 5)
matmul_tflops = 2 * 8192**3 / (cuda_time(lambda: a @ b, 20) * 1e-3) / 1e12
del a, b

torch.manual_seed(0)
model = Gpt2().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                              fused=True)
data = torch.randint(0, V, (args.batch, T + 1), device="cuda")  # the same batch every step
x, y = data[:, :-1], data[:, 1:]
losses = []


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
    loss = F.cross_entropy(logits.float().view(-1, V), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    losses.append(loss.detach())


cuda_time(step, args.warmup)
torch.cuda.reset_peak_memory_stats()
step_ms = cuda_time(step, args.steps)
final_loss = losses[-1].item()
assert math.isfinite(final_loss), "the loss is not finite"

n_params = sum(p.numel() for p in model.parameters())
n_matmul = n_params - model.wpe.weight.numel()
flops_per_token = 6 * n_matmul + 12 * L * T * D
tokens_per_s = args.batch * T / (step_ms * 1e-3)
achieved = flops_per_token * tokens_per_s / 1e12
result = {
    "impl": "pytorch-eager", "device": name, "torch": torch.__version__, "batch": args.batch,
    "seq": T, "params": n_params, "flops_per_token": flops_per_token,
    "median_step_s": step_ms / 1e3, "tokens_per_s": tokens_per_s, "tflops": achieved,
    "mfu": achieved / peak, "peak_tflops": peak, "matmul_tflops": matmul_tflops,
    "mfu_of_matmul": achieved / matmul_tflops, "loss_first": losses[0].item(),
    "loss_last": final_loss, "max_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
}
print(json.dumps(result))
print(f"{name}: GPT-2 124M ({n_params / 1e6:.1f}M) batch {args.batch}x{T} bf16 eager: "
      f"{step_ms:.1f} ms/step, {tokens_per_s:,.0f} tokens/s, {achieved:.0f} TFLOP/s, "
      f"MFU {100 * achieved / peak:.1f}% of {peak:.0f} ({100 * achieved / matmul_tflops:.1f}% of "
      f"the {matmul_tflops:.0f} TFLOP/s measured matmul)")
