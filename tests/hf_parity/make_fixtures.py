#!/usr/bin/env python3
"""make_fixtures.py — Hugging Face parity fixtures for tessera's LLaMA model.

Builds two tiny transformers.LlamaForCausalLM models (untied and tied word
embeddings), runs one forward/backward on a fixed batch and five AdamW steps,
and writes everything tessera must reproduce into
tests/hf_parity/fixtures/llama_<variant>[_bf16].safetensors plus the model's
config.json. CI never runs this script; developers run it (see README.md) and
commit its output.

Contents of each .safetensors file (B=2, T=12, V=96):
    <hf name>              initial parameter, F32 (fp32 master weights)
    input_ids, targets     I32 (B, T); targets hold -100 at 3 ignored positions
    logits                 F32 (B, T, V)
    loss                   F32 (1,)   mean cross-entropy over non-ignored targets
    grad.<hf name>         F32        d loss / d parameter
    adamw.losses           F32 (5,)   loss before each of the 5 AdamW steps
    adamw.final.<hf name>  F32        parameters after the 5 steps
    __metadata__           lr, beta1, beta2, eps, weight_decay, steps, seed,
                                                  dtype, variant, torch_version, transformers_version, ...

Tied weights appear once, as model.embed_tokens.weight (no lm_head.weight).

With --dtype bf16 the model runs forward/backward in bfloat16
(model.to(torch.bfloat16)); the cross-entropy is taken on the logits upcast to
fp32; AdamW updates fp32 master weights from the bf16 gradients cast to fp32,
and the bf16 compute copy is re-cast from the masters before every step (the
mixed-precision scheme of shared/DESIGN.md). Every bf16 result is stored as F32
(exact conversion); parameters are the fp32 masters.
"""

import argparse
import copy
import json
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save
from transformers import LlamaConfig, LlamaForCausalLM

B, T = 2, 12
N_IGNORED = 3
IGNORE_INDEX = -100
SEED = 1234
STEPS = 5
LR, BETA1, BETA2, EPS, WEIGHT_DECAY = 1e-2, 0.9, 0.95, 1e-8, 0.1
WEIGHT_STD = 0.08  # 2-D weights ~ N(0, 0.08^2)
NORM_STD = 0.1     # RMSNorm weights = 1 + 0.1 * N(0, 1)


def make_config(tied):
    return LlamaConfig(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
            tie_word_embeddings=tied,
            attn_implementation="eager",
    )


def explicit_config(model, keys, model_type, architecture):
    """transformers' own config dict (what model.config.to_json_file
    writes) with `keys` written explicitly (to_diff_dict leaves out
    defaults), model_type and architectures set, and the loader-only
    attention and path fields dropped."""
    c = model.config
    d = c.to_diff_dict()
    for key in keys:
        d[key] = getattr(c, key)
    d["model_type"] = model_type
    d["architectures"] = [architecture]
    for k in ("_attn_implementation", "attn_implementation", "_name_or_path"):
        d.pop(k, None)
    return d


def config_dict(model):
    """config.json contents: explicit_config, plus the legacy top-level
    rope_theta (transformers >= 5 nests it in rope_parameters), so readers
    of either layout find every field."""
    d = explicit_config(model, ("hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "vocab_size",
                                "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                                "hidden_act", "attention_bias", "mlp_bias"),
                        "llama", "LlamaForCausalLM")
    rope = d.get("rope_parameters") or {}
    d["rope_theta"] = float(rope.get("rope_theta", getattr(model.config, "rope_theta", 10000.0)))
    return dict(sorted(d.items()))


def init_weights(model):
    """Seeded init in named_parameters() order (tied weights visited once)."""
    torch.manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape) * WEIGHT_STD)
            else:
                p.copy_(1.0 + NORM_STD * torch.randn(p.shape))


def make_batch(vocab):
    """Same batch for every variant and dtype: its own generator."""
    g = torch.Generator().manual_seed(SEED + 1)
    input_ids = torch.randint(0, vocab, (B, T), generator=g)
    targets = torch.randint(0, vocab, (B, T), generator=g)
    ignored = torch.randperm(B * T, generator=g)[:N_IGNORED]
    targets.view(-1)[ignored] = IGNORE_INDEX
    return input_ids, targets


def loss_fn(logits, targets):
    """Mean cross-entropy over non-ignored targets, no shift, fp32."""
    v = logits.shape[-1]
    return F.cross_entropy(logits.float().reshape(-1, v), targets.reshape(-1),
                                                  ignore_index=IGNORE_INDEX)


def param_groups(named):
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    return [{"params": decay, "weight_decay": WEIGHT_DECAY},
                    {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(named):
    return torch.optim.AdamW(param_groups(named), lr=LR, betas=(BETA1, BETA2), eps=EPS)


def run_fp32(model, input_ids, targets, **model_kwargs):
    """One forward/backward, then 5 AdamW steps from the same initial weights.
    model_kwargs (attention_mask, token_type_ids, ...) go to every forward."""
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=input_ids, **model_kwargs).logits
    loss = loss_fn(logits, targets)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    m2 = copy.deepcopy(model)
    with torch.no_grad():
        for n, p in m2.named_parameters():
            p.copy_(initial[n])
    named = list(m2.named_parameters())
    opt = make_optimizer(named)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        l = loss_fn(m2(input_ids=input_ids, **model_kwargs).logits, targets)
        losses.append(l.item())
        l.backward()
        opt.step()
    final = {n: p.detach().clone() for n, p in m2.named_parameters()}
    return initial, logits.detach(), loss.detach(), grads, losses, final


def run_bf16(model, input_ids, targets, **model_kwargs):
    """bf16 forward/backward on a bf16 copy; AdamW on fp32 master weights.
    model_kwargs (attention_mask, token_type_ids, ...) go to every forward."""
    initial = {n: p.detach().clone() for n, p in model.named_parameters()}
    mb = copy.deepcopy(model).to(torch.bfloat16)
    masters = {n: torch.nn.Parameter(v.clone()) for n, v in initial.items()}

    def load_compute_copy():
        with torch.no_grad():
            for n, p in mb.named_parameters():
                p.copy_(masters[n].detach().to(torch.bfloat16))

    def fwd_bwd():
        load_compute_copy()
        mb.zero_grad(set_to_none=True)
        logits = mb(input_ids=input_ids, **model_kwargs).logits
        loss = loss_fn(logits, targets)
        loss.backward()
        grads = {n: p.grad.detach().float() for n, p in mb.named_parameters()}
        return logits.detach().float(), loss.detach(), grads

    logits, loss, grads = fwd_bwd()
    named = list(masters.items())
    opt = make_optimizer(named)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _, l, g = fwd_bwd()
        losses.append(l.item())
        for n, p in named:
            p.grad = g[n]
        opt.step()
    final = {n: p.detach().clone() for n, p in named}
    return initial, logits, loss, grads, losses, final


def write_canonical(path, blob):
    """Writes safetensors bytes with a canonical header, so that regenerating
    gives byte-identical files: safetensors.torch.save orders __metadata__
    keys as a Rust HashMap does (randomly). Keys are re-sorted, the header is
    padded with spaces to a multiple of 8 bytes (as the format allows); the
    data section and its offsets are unchanged."""
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None)
    ordered = {}
    if meta is not None:
        ordered["__metadata__"] = dict(sorted(meta.items()))
    ordered.update(sorted(header.items()))
    text = json.dumps(ordered, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        f.write(blob[8 + n:])
    os.replace(tmp, path)


def fixture_tensors(names, initial, ids, logits, loss, grads, losses, final):
    """What every fixture stores, in this order: the initial parameters
    `names` (F32), the I32 tensors of `ids` (name -> tensor, in its order),
    logits, loss (1,), grad.<name>, adamw.losses, adamw.final.<name>."""
    tensors = {n: initial[n].float().contiguous() for n in names}
    for k, v in ids.items():
        tensors[k] = v.to(torch.int32).contiguous()
    tensors["logits"] = logits.float().contiguous()
    tensors["loss"] = loss.float().reshape(1).contiguous()
    for n in names:
        tensors["grad." + n] = grads[n].float().contiguous()
    tensors["adamw.losses"] = torch.tensor(losses, dtype=torch.float32)
    for n in names:
        tensors["adamw.final." + n] = final[n].float().contiguous()
    return tensors


def build(variant, dtype, out_dir):
    tied = variant == "tied"
    model = LlamaForCausalLM(make_config(tied)).float()
    model.eval()  # no dropout (attention_dropout is 0 anyway)
    assert model.config._attn_implementation == "eager"
    init_weights(model)
    input_ids, targets = make_batch(model.config.vocab_size)

    run = run_bf16 if dtype == "bf16" else run_fp32
    initial, logits, loss, grads, losses, final = run(model, input_ids, targets)

    # Sanity checks: the record is self-consistent and every gradient is live.
    assert logits.shape == (B, T, model.config.vocab_size)
    assert abs(losses[0] - loss.item()) <= 1e-6 * abs(loss.item()), (losses[0], loss.item())
    assert losses[-1] < losses[0], losses
    for n, g in grads.items():
        assert torch.isfinite(g).all() and g.abs().max() > 0, n
    names = list(initial.keys())
    assert ("lm_head.weight" in names) == (not tied)

    tensors = fixture_tensors(names, initial, {"input_ids": input_ids, "targets": targets},
                              logits, loss, grads, losses, final)

    metadata = {
            "format": "tessera-hf-parity-1",
            "variant": variant,
            "dtype": dtype,
            "master_dtype": "fp32",
            "loss_dtype": "fp32",
            "seed": str(SEED),
            "batch": str(B),
            "seq_len": str(T),
            "ignore_index": str(IGNORE_INDEX),
            "lr": repr(LR),
            "beta1": repr(BETA1),
            "beta2": repr(BETA2),
            "eps": repr(EPS),
            "weight_decay": repr(WEIGHT_DECAY),
            "weight_decay_applies_to": "ndim>=2 (norm weights: 0.0)",
            "steps": str(STEPS),
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
    }
    suffix = "_bf16" if dtype == "bf16" else ""
    path = os.path.join(out_dir, "llama_%s%s.safetensors" % (variant, suffix))
    write_canonical(path, save(tensors, metadata=metadata))

    cfg_path = os.path.join(out_dir, "llama_%s.config.json" % variant)
    with open(cfg_path, "w") as f:
        json.dump(config_dict(model), f, indent=2)
        f.write("\n")
    # The written config must load back to the same model shape.
    back = LlamaConfig.from_json_file(cfg_path)
    assert back.num_key_value_heads == 2 and back.tie_word_embeddings == tied

    print("%s: %d tensors, %d bytes, loss %.6f, adamw.losses %s" %
                (path, len(tensors), os.path.getsize(path), loss.item(),
                  " ".join("%.6f" % l for l in losses)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--variants", default="untied,tied")
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out_dir, exist_ok=True)
    for variant in args.variants.split(","):
        if variant not in ("untied", "tied"):
            sys.exit("unknown variant %r (expected untied or tied)" % variant)
        build(variant, args.dtype, args.out_dir)


if __name__ == "__main__":
    main()
