#!/usr/bin/env python3
"""torch_cpu.py — the PyTorch peer of tessera's CPU training speed
(tools/bench_cpu.sh): Hugging Face transformers' LlamaForCausalLM or
BertForMaskedLM, built from one of tessera's config.json files, trained on
the CPU the way a PyTorch user would.

    tools/peer/torch_cpu.py --config llama-small --batch 16 --seq 128 \\
        --threads 2 --dtype bf16 [--mode eager|compile] [--steps 8] [--warmup 2]

The config's "model_type" picks the model ("llama" or "bert").
torch.set_num_threads(--threads); attn_implementation "sdpa"; fp32
parameters. --dtype fp32 runs the model as it is; --dtype bf16 runs the
forward under torch.autocast("cpu", torch.bfloat16) (PyTorch's CPU mixed
precision: the products in bf16 through oneDNN, the rest in fp32) and the
loss on fp32 logits. --mode compile wraps the model in torch.compile
(compiled during the warm-up steps). AdamW (betas (0.9, 0.95), weight
decay 0.1, lr 1e-4), clip_grad_norm_(1.0), as tessera's step.

Batches: llama, random ids B x (T+1) from a seeded generator, the loss over
every position's next token; bert, tools/peer/torch_bert.py's masked
batches ([CLS] ... [SEP], 15% of the text as targets). Speed does not
depend on the text.

Timing: each step after the first --warmup with time.perf_counter (the CPU
runs synchronously); step_s is the median, tokens_per_s = B T / step_s,
the same statistic tools/bench_cpu.sh takes of tessera's steps.

--breakdown K: after the timed steps, K more steps under torch.profiler
(CPU activities); "breakdown" in the output gives their wall time and the
seconds of the profiled ops by kind, each op's self time (a call on the
calling thread, its intra-op threads included, as tessera's op times count):
products (aten::mm, addmm, bmm, baddbmm, linear's mkldnn kernels),
attention (the fused scaled-dot-product ops), the optimizer (the
Optimizer.step range, all its ops), and elementwise (every other aten op).

Output: one JSON object on stdout
    {"impl": "torch-eager", "dtype": "bf16", "model": ..., "tokens_per_s": ...,
     "step_s": ..., "threads": ..., "torch_version": ..., ...}
and progress on stderr. Without torch or transformers it prints one line on
stderr and exits 1; bad flags exit 2.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import log, resolve_config  # noqa: E402  (tessera's preset lookup)

PROG = "torch_cpu.py"


def fail(msg):
    """One line on stderr, exit 1."""
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="a config.json or a preset name")
    p.add_argument("--batch", type=int, required=True, metavar="B")
    p.add_argument("--seq", type=int, required=True, metavar="T")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--mode", choices=("eager", "compile"), default="eager")
    p.add_argument("--steps", type=int, default=8, help="timed steps (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed first steps (default 2)")
    p.add_argument("--breakdown", type=int, default=0, metavar="K",
                   help="after the timed steps, K more under torch.profiler: where their time "
                        "went (default 0: none)")
    a = p.parse_args(argv)
    if a.batch < 1 or a.seq < 3 or a.threads < 1:
        p.error(f"--batch {a.batch} --seq {a.seq} --threads {a.threads}: expected B >= 1, "
                f"T >= 3, threads >= 1")
    if a.steps < 1 or a.warmup < 0:
        p.error(f"--steps {a.steps} --warmup {a.warmup}: expected steps >= 1, warmup >= 0")
    return a


def main(argv):
    a = parse_args(argv)
    path = resolve_config(a.config)
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read config.json: {e}")
    kind = cfg.get("model_type")
    if kind not in ("llama", "bert"):
        fail(f"{path}: field \"model_type\" = {kind!r}: expected \"llama\" or \"bert\"")
    if a.seq > cfg.get("max_position_embeddings", a.seq):
        fail(f"{path}: --seq {a.seq} exceeds field \"max_position_embeddings\" = "
             f"{cfg['max_position_embeddings']}")
    try:
        import torch
        import torch.nn.functional as F
        import transformers
    except ImportError as e:
        fail(f"needs torch and transformers: {e}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    fields = {k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    if kind == "llama":
        config = transformers.LlamaConfig(**fields)
        config.use_cache = False
        model = transformers.LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    else:
        config = transformers.BertConfig(**fields)
        model = transformers.BertForMaskedLM._from_config(config, attn_implementation="sdpa")
    model.to(torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    fwd = torch.compile(model) if a.mode == "compile" else model
    B, T, V = a.batch, a.seq, config.vocab_size
    g = torch.Generator().manual_seed(1)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    from torch_bert import masked_batch

    def batch():
        if kind == "llama":
            ids = torch.randint(0, V, (B, T + 1), generator=g)
            return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
        return masked_batch(torch, g, B, T, V)

    def loss_of(x, y):
        with autocast:
            if kind == "llama":
                logits = fwd(input_ids=x, use_cache=False).logits
            else:
                logits = fwd(input_ids=x, attention_mask=(x != 0).long()).logits
        return F.cross_entropy(logits.float().view(-1, V), y.reshape(-1), ignore_index=-100)

    def train_step(x, y):
        loss = loss_of(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times, losses = [], []
    for step in range(a.warmup + a.steps):
        x, y = batch()
        t0 = time.perf_counter()
        loss = train_step(x, y)
        dt = time.perf_counter() - t0
        losses.append(loss.item())
        log(f"step {step + 1}: loss {losses[-1]:.4f}, {dt:.2f} s")
        if step >= a.warmup:
            times.append(dt)
    if not all(math.isfinite(l) for l in losses):
        fail(f"loss is not finite: {losses}")
    breakdown = None
    if a.breakdown:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for _ in range(a.breakdown):
                train_step(*batch())
            wall = time.perf_counter() - t0
        breakdown = {"wall_s": wall, "products": 0.0, "attention": 0.0, "optimizer": 0.0,
                     "elementwise": 0.0}
        products = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkldnn",
                    "mkldnn::", "aten::mkldnn")
        ranges = [e for e in prof.events() if e.name.startswith("Optimizer.step")]
        in_opt = lambda e: any(r.time_range.start <= e.time_range.start and
                               e.time_range.end <= r.time_range.end and e.thread == r.thread
                               for r in ranges)
        for e in prof.events():
            if not e.name.startswith("aten::") and not e.name.startswith("mkldnn::"):
                continue
            s = e.self_cpu_time_total / 1e6
            if in_opt(e):
                kind = "optimizer"
            elif e.name.startswith(products):
                kind = "products"
            elif "scaled_dot_product" in e.name or "flash_attention" in e.name:
                kind = "attention"
            else:
                kind = "elementwise"
            breakdown[kind] += s
    step_s = statistics.median(times)
    name = os.path.splitext(os.path.basename(path))[0]
    print(json.dumps({
        "impl": f"torch-{a.mode}", "dtype": a.dtype, "model": name, "batch": B, "seq": T,
        "threads": a.threads, "steps": a.steps, "warmup": a.warmup, "step_s": step_s,
        "tokens_per_s": B * T / step_s, "loss_first": losses[0], "loss_last": losses[-1],
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "mkldnn_bf16": bool(getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "breakdown": breakdown,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
