#!/usr/bin/env python3
"""torch_bert.py — the PyTorch peer of tessera's BERT masked-LM training on
the CPU (tools/bench_bert.sh runs both and tabulates them).

    tools/peer/torch_bert.py --config models/configs/bert-base.json \\
        --batch 8 --seq 128 --threads 2 [--steps 6] [--warmup 2]

Trains Hugging Face transformers' BertForMaskedLM built from one of
tessera's config.json files (fp32, attn_implementation "sdpa", dropout 0 as
the config says) the way a PyTorch user would on a CPU:
torch.set_num_threads(--threads), torch.optim.AdamW (lr 1e-4, betas (0.9,
0.95), weight decay 0.1), clip_grad_norm_(1.0). Each step's batch is random
ids [CLS] ... [SEP] from a seeded generator with 15% of the text as targets
(the same rate as tessera's masking): speed does not depend on the text.

Timing: the first --warmup steps are not timed; each later step is timed
with time.perf_counter; step_s is the median, tokens_per_s = B T / step_s
(tessera's figure is its median over the same kind of window).

Output: one JSON object on stdout,
    {"impl": "torch-cpu", "model": ..., "tokens_per_s": ..., "step_s": ...,
     "threads": ..., "torch_version": ..., "transformers_version": ...}
and progress on stderr. Without torch or transformers it prints one line on
stderr and exits 1.
"""

import argparse
import json
import statistics
import sys
import time

PROG = "torch_bert.py"


def fail(msg):
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser(prog=PROG)
    ap.add_argument("--config", required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    try:
        import torch
        import transformers
        from transformers import BertConfig, BertForMaskedLM
    except ImportError as e:
        fail(f"needs torch and transformers: {e}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    with open(a.config) as f:
        cfg = json.load(f)
    config = BertConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    config._attn_implementation = "sdpa"
    model = BertForMaskedLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    B, T, V = a.batch, a.seq, config.vocab_size
    times = []
    for step in range(a.warmup + a.steps):
        ids = torch.randint(5, V, (B, T), generator=g)
        ids[:, 0], ids[:, -1] = 2, 3
        labels = torch.full((B, T), -100)
        sel = torch.rand((B, T), generator=g) < 0.15
        sel[:, 0] = sel[:, -1] = False
        labels[sel] = ids[sel]
        ids[sel] = 4
        t0 = time.perf_counter()
        loss = model(input_ids=ids, attention_mask=(ids != 0).long(), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        print(f"step {step + 1}: loss {loss.item():.4f}, {dt:.2f} s", file=sys.stderr, flush=True)
        if step >= a.warmup:
            times.append(dt)
    step_s = statistics.median(times)
    print(json.dumps({"impl": "torch-cpu", "model": cfg.get("name", a.config), "batch": B,
                      "seq": T, "threads": a.threads, "step_s": step_s,
                      "tokens_per_s": B * T / step_s, "torch_version": torch.__version__,
                      "transformers_version": transformers.__version__}))


if __name__ == "__main__":
    main()
