#!/usr/bin/env python3
"""torch_bert.py — the PyTorch peer of tessera's BERT masked-LM training,
on the CPU (tools/bench_bert.sh) and on one GPU (tools/bench_gpu.sh).

    tools/peer/torch_bert.py --config models/configs/bert-base.json \\
        --batch 8 --seq 128 --threads 2 [--steps 6] [--warmup 2]
    tools/peer/torch_bert.py --device cuda [--mode eager|compile] \\
        --config bert-base --batch 256 --seq 128 [--steps 20] [--warmup 5]

Trains Hugging Face transformers' BertForMaskedLM built from one of
tessera's config.json files (attn_implementation "sdpa", dropout 0 as the
config says) the way a PyTorch user would. Each step's batch is random ids
[CLS] ... [SEP] from a seeded generator with 15% of the text as targets
(the same rate as tessera's masking): speed does not depend on the text.
AdamW (betas (0.9, 0.95), weight decay 0.1), clip_grad_norm_(1.0).

--device cpu (default): fp32, torch.set_num_threads(--threads), lr 1e-4;
each later step timed with time.perf_counter; step_s is the median,
tokens_per_s = B T / step_s (tessera's figure is its median over the same
kind of window). Output: one JSON object on stdout,
    {"impl": "torch-cpu", "model": ..., "tokens_per_s": ..., "step_s": ...,
     "threads": ..., "torch_version": ..., "transformers_version": ...}

--device cuda: fp32 parameters, forward under torch.autocast(bfloat16),
AdamW(fused=True, lr 3e-4); --mode compile wraps the model in
torch.compile (compiled during the warm-up steps). Every batch is drawn up
front on the host and moved to the GPU; CUDA events between the timed
steps (no host synchronisation inside the loop) give each step's time,
step_ms is their median. MFU = tokens_per_s x flops_per_token / peak with
flops_per_token counted as tessera counts it (flops_per_token below mirrors
bert_flops in models/bert.c) and peak 989e12, the H100 SXM's dense bf16
rate (--peak-flops). Output: one JSON object on stdout with the keys of
tools/peer/torch_llama.py's (impl "torch-eager"/"torch-compile",
tokens_per_s, sequences_per_s, step_ms, mfu, peak_bytes =
torch.cuda.max_memory_allocated(), gpu_name, ...).

Progress goes to stderr. Without torch or transformers (or, for cuda, a
CUDA device) it prints one line on stderr and exits 1; bad flags exit 2.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

from torch_llama import timed_cuda_steps  # beside this file

H100_SXM_BF16_DENSE = 989e12  # FLOP/s, NVIDIA H100 SXM datasheet (dense, no sparsity)
PROG = "torch_bert.py"


def fail(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def flops_per_token(cfg, T):
    """Model FLOPs per token of one training step at sequence length T: the
    PaLM count (Chowdhery et al. 2022, App. B). Mirrors bert_flops in
    models/bert.c term by term — keep the two equal: 6 x matmul parameters
    (Q, K, V, O and the two MLP matrices per layer, the MLM head's transform
    and its decoder; embedding lookups excluded) + 12 L C T for attention."""
    C, I = cfg["hidden_size"], cfg["intermediate_size"]
    L, V = cfg["num_hidden_layers"], cfg["vocab_size"]
    matmul = L * (4 * C * C + 2 * I * C) + C * C + V * C
    return 6.0 * matmul + 12.0 * L * C * T


def resolve_config(name):
    """A config.json path, or a preset name: $TESSERA_HOME/models/configs/NAME.json,
    else beside this script's repository (as tools/peer/torch_llama.py)."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    for home in (os.environ.get("TESSERA_HOME"),
                 os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")):
        if home:
            path = os.path.normpath(os.path.join(home, "models", "configs", name + ".json"))
            if os.path.isfile(path):
                return path
    fail(f"--config {name}: not a file, and no preset of that name in $TESSERA_HOME/models/configs/")


def parse_args(argv):
    ap = argparse.ArgumentParser(prog=PROG)
    ap.add_argument("--config", required=True, help="a BERT config.json or a preset name")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager",
                    help="cuda: the model as built, or torch.compile(model)")
    ap.add_argument("--threads", type=int, help="cpu: torch.set_num_threads (required there)")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps on the cpu (default 6); steps in all, warm-up "
                         "included, on cuda (default 20)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed first steps (cpu 2, cuda 5)")
    ap.add_argument("--peak-flops", type=float, default=H100_SXM_BF16_DENSE)
    ap.add_argument("--name", help="the model's name in the JSON (default: the config's stem)")
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    a.steps = a.steps if a.steps is not None else (20 if cuda else 6)
    a.warmup = a.warmup if a.warmup is not None else (5 if cuda else 2)
    if not cuda and a.threads is None:
        ap.error("--device cpu needs --threads")
    if not cuda and a.mode != "eager":
        ap.error("--mode compile is for --device cuda")
    if a.batch < 1 or a.seq < 3:
        ap.error(f"--batch {a.batch} --seq {a.seq}: expected B >= 1 and T >= 3")
    if a.warmup < 0 or a.steps < 1 or (cuda and a.steps <= a.warmup):
        ap.error(f"--steps {a.steps} --warmup {a.warmup}: no step would be timed")
    return a


def build(a):
    try:
        import torch
        import transformers
        from transformers import BertConfig, BertForMaskedLM
    except ImportError as e:
        fail(f"needs torch and transformers: {e}")
    path = resolve_config(a.config)
    with open(path) as f:
        cfg = json.load(f)
    if a.seq > cfg.get("max_position_embeddings", a.seq):
        fail(f"{path}: --seq {a.seq} exceeds field \"max_position_embeddings\" = "
             f"{cfg['max_position_embeddings']}")
    config = BertConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    config._attn_implementation = "sdpa"
    name = a.name or os.path.splitext(os.path.basename(path))[0]
    return torch, transformers, BertForMaskedLM, config, cfg, name


def masked_batch(torch, g, B, T, V):
    """(ids, labels) (B, T): [CLS]=2 ... [SEP]=3, 15% of the text -> [MASK]=4."""
    ids = torch.randint(5, V, (B, T), generator=g)
    ids[:, 0], ids[:, -1] = 2, 3
    labels = torch.full((B, T), -100)
    sel = torch.rand((B, T), generator=g) < 0.15
    sel[:, 0] = sel[:, -1] = False
    labels[sel] = ids[sel]
    ids[sel] = 4
    return ids, labels


def run_cpu(a):
    torch, transformers, BertForMaskedLM, config, cfg, _ = build(a)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = BertForMaskedLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    B, T, V = a.batch, a.seq, config.vocab_size
    times = []
    for step in range(a.warmup + a.steps):
        ids, labels = masked_batch(torch, g, B, T, V)
        t0 = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=(ids != 0).long(), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        log(f"step {step + 1}: loss {loss.item():.4f}, {dt:.2f} s")
        if step >= a.warmup:
            times.append(dt)
    step_s = statistics.median(times)
    return {"impl": "torch-cpu", "model": cfg.get("name", a.config), "batch": B,
            "seq": T, "threads": a.threads, "step_s": step_s,
            "tokens_per_s": B * T / step_s, "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}


def run_cuda(a):
    torch, transformers, BertForMaskedLM, config, cfg, name = build(a)
    if not torch.cuda.is_available():
        fail(f"no CUDA device visible to torch {torch.__version__} "
             f"(built for CUDA {torch.version.cuda or 'none'})")
    dev = torch.device("cuda")
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    with dev:
        model = BertForMaskedLM(config)
    model.to(device=dev, dtype=torch.float32).train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model
    B, T, V = a.batch, a.seq, config.vocab_size
    g = torch.Generator().manual_seed(1)
    batches = [masked_batch(torch, g, B, T, V) for _ in range(a.steps)]
    batches = [(i.to(dev), (i != 0).long().to(dev), l.to(dev)) for i, l in batches]

    def step(k):
        ids, mask, labels = batches[k]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = fwd(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.detach()

    gpu = torch.cuda.get_device_name()
    log(f"{name}: {n_params / 1e6:.2f}M parameters, torch-{a.mode}, B {B} x T {T}, bf16 autocast, "
        f"{gpu}, torch {torch.__version__}, transformers {transformers.__version__}")
    losses, per_step, wall = timed_cuda_steps(torch, step, a.warmup, a.steps)
    if not all(math.isfinite(l) for l in losses):
        fail(f"{name}: loss is not finite: {losses}")
    n = a.steps - a.warmup
    med = statistics.median(per_step)
    fpt = flops_per_token(cfg, T)
    tok_s = B * T / med
    row = {
        "impl": f"torch-{a.mode}", "model": name, "batch": B, "seq": T, "steps": a.steps,
        "warmup": a.warmup, "timed_steps": n, "params": n_params,
        "tokens_per_s": tok_s, "sequences_per_s": B / med, "step_ms": med * 1e3,
        "tokens_per_s_mean": B * T * n / wall, "step_ms_mean": wall / n * 1e3,
        "flops_per_token": fpt, "mfu": tok_s * fpt / a.peak_flops, "peak_flops": a.peak_flops,
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "reserved_bytes": torch.cuda.max_memory_reserved(),
        "loss_first": losses[0], "loss_last": losses[-1],
        "device": "cuda", "gpu_name": gpu, "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    log(f"{name} torch-{a.mode}: {tok_s:,.0f} tok/s ({B / med:,.0f} sequences/s), "
        f"{row['step_ms']:.1f} ms/step median, MFU {row['mfu']:.1%}, peak "
        f"{row['peak_bytes'] / 2**30:.2f} GiB allocated, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return row


def main(argv):
    a = parse_args(argv)
    try:
        row = run_cpu(a) if a.device == "cpu" else run_cuda(a)
    except Exception as e:  # torch.cuda.OutOfMemoryError, without importing torch here
        if type(e).__name__ != "OutOfMemoryError":
            raise
        fail(f"out of memory ({a.device} {a.mode}, --batch {a.batch} --seq {a.seq}): "
             f"{str(e).splitlines()[0]}")
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
