#!/usr/bin/env python3
"""torch_llama.py — the PyTorch peer tessera's GPU speed is measured against.

Trains Hugging Face transformers' LlamaForCausalLM, built from one of
tessera's config.json files, the way a PyTorch user would on one GPU, and
prints what tools/bench_gpu.sh tabulates beside tessera:

    tools/peer/torch_llama.py --config models/configs/llama-124m.json \\
        --batch 32 --seq 1024 [--steps 20] [--warmup 5] [--mode eager|compile]
    tools/peer/torch_llama.py --mode gemm [--gemm-size 8192] [--gemm-runs 20]

Training (--mode eager|compile): fp32 parameters on cuda,
attn_implementation="sdpa", forward under torch.autocast(bfloat16), the
cross-entropy of every position's next token on the logits cast to fp32,
clip_grad_norm_(1.0), torch.optim.AdamW(fused=True, lr 3e-4, betas
(0.9, 0.95), weight decay 0.1 on every parameter). The batch is random
tokens, B x (T+1) drawn from a seeded generator, a fresh one every step:
speed does not depend on the text. --mode compile wraps the model in
torch.compile(model); its compilation happens in the warm-up steps.

Timing: the first --warmup steps are not timed. CUDA events recorded
between the remaining steps (no host synchronisation inside the loop) give
each step's time; step_ms is their median and tokens_per_s = B T / step_ms
(tools/bench_gpu.sh takes tessera's median over steps too). The wall time
of the whole window (torch.cuda.synchronize on both ends,
time.perf_counter) gives step_ms_mean and tokens_per_s_mean. MFU =
tokens_per_s x flops_per_token / peak, with flops_per_token counted exactly
as tessera counts it (flops_per_token below mirrors
ts_llama_flops_per_token in models/llama.c) and peak = 989e12, the H100
SXM's dense bf16 tensor-core rate (--peak-flops to change). peak_bytes is
torch.cuda.max_memory_allocated() over the run: parameters, gradients,
AdamW state, activations, the caching allocator's live blocks (not its
reserve, which is reserved_bytes).

--mode gemm: C = A @ B in bf16 with M = N = K = --gemm-size (cuBLAS through
torch.matmul), --gemm-warmup untimed products then --gemm-runs timed one by
one with CUDA events; tflops is 2 M N K over the median time: the GEMM
ceiling that MFU figures should be read against.

Output: one JSON object on stdout, e.g.
    {"impl": "torch-eager", "model": "llama-124m", "tokens_per_s": ...,
     "step_ms": ..., "mfu": ..., "peak_bytes": ..., ...}
and human-readable progress on stderr. Without torch, transformers or a
CUDA device it prints one line on stderr and exits 1; bad flags exit 2.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

H100_SXM_BF16_DENSE = 989e12  # FLOP/s, NVIDIA H100 SXM datasheet (dense, no sparsity)
PROG = "torch_llama.py"


def fail(msg):
    """One line on stderr, exit 1."""
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(1)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def resolve_config(name):
    """A config.json path, or a preset name looked up as tessera does
    (models/model.c ts_model_resolve): $TESSERA_HOME/models/configs/NAME.json,
    else beside this script's repository."""
    if os.path.isfile(name):
        return os.path.abspath(name)
    if "/" in name or name.endswith(".json"):
        fail(f"{name}: model config not found: expected a config.json file")
    homes = [os.environ.get("TESSERA_HOME"),
             os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")]
    for home in homes:
        if home:
            path = os.path.normpath(os.path.join(home, "models", "configs", name + ".json"))
            if os.path.isfile(path):
                return os.path.abspath(path)
    fail(f"--config {name}: unknown preset: expected a config.json path or a preset in "
         f"$TESSERA_HOME/models/configs/")


def load_config_json(path):
    """The config.json as a dict, with the fields flops_per_token needs checked."""
    try:
        with open(path) as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: cannot read config.json: {e}")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "vocab_size"):
        if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
            fail(f"{path}: field \"{key}\" = {cfg.get(key)!r}: expected an integer > 0")
    return cfg


def flops_per_token(cfg, T):
    """Model FLOPs per token of one training step (forward + backward) at
    sequence length T: the PaLM count (Chowdhery et al. 2022, App. B).
    Mirrors ts_llama_flops_per_token in models/llama.c term by term — keep
    the two equal: 6 x matmul parameters (Q, K, V, O, gate, up, down per
    block, the LM head; the embedding lookup excluded) + 12 L C T for
    attention's QK^T and PV (the masked half counted, as PaLM does)."""
    C = cfg["hidden_size"]
    L = cfg["num_hidden_layers"]
    NH = cfg["num_attention_heads"]
    NKV = cfg.get("num_key_value_heads") or NH
    HS = C // NH  # ts_llama_head_size
    QD, KVD = NH * HS, NKV * HS
    per_block = QD * C + 2 * KVD * C + C * QD + 3 * cfg["intermediate_size"] * C
    matmul = L * per_block + cfg["vocab_size"] * C
    return 6.0 * matmul + 12.0 * L * C * T


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog=PROG,
        description="PyTorch LlamaForCausalLM training speed (or the cuBLAS bf16 GEMM "
                    "ceiling) on one CUDA GPU; one JSON object on stdout.")
    p.add_argument("--mode", choices=("eager", "compile", "gemm"), default="eager",
                   help="eager: the model as built; compile: torch.compile(model); "
                        "gemm: bf16 torch.matmul TFLOP/s (default eager)")
    p.add_argument("--config", metavar="PATH",
                   help="a tessera/Hugging Face config.json or a preset name "
                        "(llama-124m, ...); required unless --mode gemm")
    p.add_argument("--batch", type=int, default=8, metavar="B", help="sequences per step (default 8)")
    p.add_argument("--seq", type=int, default=1024, metavar="T",
                   help="tokens per sequence (default 1024)")
    p.add_argument("--steps", type=int, default=20, metavar="N",
                   help="optimizer steps in all, warm-up included (default 20)")
    p.add_argument("--warmup", type=int, default=5, metavar="N",
                   help="first steps left out of the timing (default 5)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the weights and tokens (default 1337)")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate (default 3e-4)")
    p.add_argument("--peak-flops", type=float, default=H100_SXM_BF16_DENSE, metavar="FLOPS",
                   help="the GPU's peak FLOP/s that MFU divides by (default 989e12, H100 SXM bf16)")
    p.add_argument("--name", help="the model's name in the JSON (default: the config file's stem)")
    p.add_argument("--gemm-size", type=int, default=8192, metavar="N", help="M = N = K (default 8192)")
    p.add_argument("--gemm-runs", type=int, default=20, metavar="N",
                   help="timed products, median taken (default 20)")
    p.add_argument("--gemm-warmup", type=int, default=5, metavar="N",
                   help="untimed products first (default 5)")
    a = p.parse_args(argv)
    if a.mode != "gemm" and not a.config:
        p.error(f"--mode {a.mode} needs --config")
    for flag in ("batch", "seq", "gemm_size", "gemm_runs"):
        if getattr(a, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} {getattr(a, flag)}: expected >= 1")
    if a.warmup < 0 or a.gemm_warmup < 0:
        p.error("--warmup and --gemm-warmup: expected >= 0")
    if a.steps <= a.warmup:
        p.error(f"--steps {a.steps} must exceed --warmup {a.warmup} (no step would be timed)")
    if not a.peak_flops > 0:
        p.error(f"--peak-flops {a.peak_flops}: expected > 0")
    return a


def import_torch():
    """torch with a CUDA device, or one line and exit 1."""
    try:
        import torch
    except ImportError as e:
        fail(f"PyTorch is not installed (import torch: {e})")
    if not torch.cuda.is_available():
        fail(f"no CUDA device visible to torch {torch.__version__} "
             f"(built for CUDA {torch.version.cuda or 'none'})")
    return torch


def timed_cuda_steps(torch, step, warmup, steps):
    """Runs step(0), ..., step(steps - 1) on the GPU (step(i) queues one
    training step and returns its loss as a device scalar): the first
    `warmup` untimed, each printing its loss; then the rest with CUDA events
    recorded between them and no host synchronisation inside the loop.
    Returns (every loss as a float, each timed step's seconds, the timed
    window's wall seconds). Shared by torch_llama.py and torch_bert.py."""
    t_setup = time.perf_counter()
    losses = []
    for i in range(warmup):
        losses.append(step(i).item())
        log(f"  warm-up step {i + 1}/{warmup}: loss {losses[-1]:.4f} "
            f"({time.perf_counter() - t_setup:.1f} s so far)")
    n = steps - warmup
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    timed = []
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    events[0].record()
    for j in range(n):
        timed.append(step(warmup + j))
        events[j + 1].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    losses += [l.item() for l in timed]
    per_step = [events[j].elapsed_time(events[j + 1]) / 1e3 for j in range(n)]  # s
    return losses, per_step, wall


def run_gemm(torch, a):
    n = a.gemm_size
    g = torch.Generator(device="cuda").manual_seed(a.seed)
    A = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    B = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
    C = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(a.gemm_warmup):
        torch.matmul(A, B, out=C)
    torch.cuda.synchronize()
    times = []
    for _ in range(a.gemm_runs):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record()
        torch.matmul(A, B, out=C)
        t1.record()
        t1.synchronize()
        times.append(t0.elapsed_time(t1) / 1e3)  # ms -> s
    med = statistics.median(times)
    tflops = 2.0 * n * n * n / med / 1e12
    log(f"cuBLAS bf16 GEMM {n}^3 on {torch.cuda.get_device_name()}: {tflops:.1f} TFLOP/s "
        f"(median of {a.gemm_runs}, {med * 1e3:.3f} ms; min {min(times) * 1e3:.3f}, "
        f"max {max(times) * 1e3:.3f}), {tflops * 1e12 / a.peak_flops:.1%} of {a.peak_flops / 1e12:g}")
    return {"impl": "cublas-gemm", "model": None, "m": n, "n": n, "k": n, "dtype": "bf16",
            "runs": a.gemm_runs, "ms_median": med * 1e3, "tflops": tflops,
            "fraction_of_peak": tflops * 1e12 / a.peak_flops, "peak_flops": a.peak_flops,
            "device": "cuda", "gpu_name": torch.cuda.get_device_name(), "torch": torch.__version__}


def run_train(torch, a, path, cfg_json):
    name = a.name or os.path.splitext(os.path.basename(path))[0]
    if name == "config":  # a Hugging Face folder's config.json: name it after the folder
        name = os.path.basename(os.path.dirname(path))
    try:
        import transformers
        from transformers import AutoModelForCausalLM, LlamaConfig
    except ImportError as e:
        fail(f"transformers is not installed (import transformers: {e})")
    import torch.nn.functional as F

    B, T, V = a.batch, a.seq, cfg_json["vocab_size"]
    dev = torch.device("cuda")
    torch.manual_seed(a.seed)
    torch.cuda.reset_peak_memory_stats()

    config = LlamaConfig.from_json_file(path)
    config.use_cache = False
    with dev:  # initialise the weights on the GPU (torch >= 2.0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.to(device=dev, dtype=torch.float32)  # fp32 parameters whatever torch_dtype says
    model.train()
    attn = getattr(model.config, "_attn_implementation", None)
    if attn is None:
        log(f"transformers {transformers.__version__} does not say which attention it uses")
    elif attn != "sdpa":
        fail(f"transformers {transformers.__version__} chose attn_implementation {attn!r}, not 'sdpa'")
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model

    # Every step's tokens, drawn up front on the host from a seeded generator.
    g = torch.Generator().manual_seed(a.seed)
    tokens = torch.randint(0, V, (a.steps, B, T + 1), generator=g, dtype=torch.long)
    inputs = tokens[:, :, :-1].contiguous().to(dev)   # (steps, B, T)
    targets = tokens[:, :, 1:].contiguous().to(dev)   # (steps, B, T)

    def step(i):
        x, y = inputs[i], targets[i]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = fwd(input_ids=x, use_cache=False).logits  # (B, T, V) bf16
        loss = F.cross_entropy(logits.float().view(-1, V), y.reshape(-1))
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

    fpt = flops_per_token(cfg_json, T)
    med = statistics.median(per_step)
    tok_s = B * T / med
    row = {
        "impl": f"torch-{a.mode}", "model": name, "config": path, "batch": B, "seq": T,
        "steps": a.steps, "warmup": a.warmup, "timed_steps": n, "params": n_params,
        "tokens_per_s": tok_s, "step_ms": med * 1e3,
        "tokens_per_s_mean": B * T * n / wall, "step_ms_mean": wall / n * 1e3,
        "flops_per_token": fpt, "mfu": tok_s * fpt / a.peak_flops, "peak_flops": a.peak_flops,
        "peak_bytes": torch.cuda.max_memory_allocated(),
        "reserved_bytes": torch.cuda.max_memory_reserved(),
        "loss_first": losses[0], "loss_last": losses[-1],
        "device": "cuda", "gpu_name": gpu, "torch": torch.__version__,
        "transformers": transformers.__version__, "attn_implementation": attn,
    }
    log(f"{name} torch-{a.mode}: {tok_s:,.0f} tok/s, {row['step_ms']:.1f} ms/step median "
        f"({row['step_ms_mean']:.1f} mean), MFU {row['mfu']:.1%}, peak "
        f"{row['peak_bytes'] / 2**30:.2f} GiB allocated, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    return row


def main(argv):
    a = parse_args(argv)
    if a.mode != "gemm":  # config errors first: they need no GPU
        path = resolve_config(a.config)
        cfg_json = load_config_json(path)
        maxpos = cfg_json.get("max_position_embeddings")
        if maxpos and a.seq > maxpos:
            fail(f"{path}: --seq {a.seq} exceeds field \"max_position_embeddings\" = {maxpos}")
    torch = import_torch()
    try:
        row = run_gemm(torch, a) if a.mode == "gemm" else run_train(torch, a, path, cfg_json)
    except torch.cuda.OutOfMemoryError as e:
        fail(f"CUDA out of memory ({a.mode}, --batch {a.batch} --seq {a.seq}): "
             f"{str(e).splitlines()[0]}")
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
