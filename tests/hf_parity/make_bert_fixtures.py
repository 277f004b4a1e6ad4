#!/usr/bin/env python3
"""make_bert_fixtures.py — Hugging Face parity fixtures for tessera's BERT masked LM.

Builds two tiny transformers.BertForMaskedLM models (variants bert_gelu and
bert_gelu_new, see VARIANTS), runs one forward/backward on a fixed masked-LM
batch and five AdamW steps, and writes everything tessera must reproduce into
tests/hf_parity/fixtures/<variant>[_bf16].safetensors plus the model's
config.json. The file format, the optimizer, the loss and the bf16 scheme are
make_fixtures.py's (the LLaMA fixtures), whose functions this script imports.
CI never runs this script; developers run it (see README.md) and commit its
output.

Contents of each .safetensors file (B=2, T=12, V=96):
    <hf name>              initial parameter, F32 (fp32 master weights)
    input_ids, targets     I32 (B, T); targets: the original token at the 9
                           masked-LM positions, -100 elsewhere
    token_type_ids         I32 (B, T)  number of [SEP] strictly before t,
                                       capped at type_vocab_size - 1
    attention_mask         I32 (B, T)  input_ids != pad_token_id
    logits                 F32 (B, T, V)
    loss                   F32 (1,)   mean cross-entropy over targets != -100
    grad.<hf name>         F32        d loss / d parameter
    adamw.losses           F32 (5,)   loss before each of the 5 AdamW steps
    adamw.final.<hf name>  F32        parameters after the 5 steps
    logits_row1_alone      F32 (1, T, V)  row 1 run alone (fp32 files only);
                                          equals logits[1]: padding is masked
    __metadata__           as make_fixtures.py, plus the special token ids and
                           the token-type / attention-mask rules

token_type_ids and attention_mask are what the model was given; tessera
derives both from input_ids by the rules above. Tied weights appear once:
cls.predictions.decoder.weight is bert.embeddings.word_embeddings.weight and
cls.predictions.decoder.bias is cls.predictions.bias; only the latter names are
stored (they are the names named_parameters() gives).

bert.encoder.layer.*.attention.self.key.bias has an analytically zero
gradient (the softmax is shift-invariant): its stored grad.* is rounding noise
and its adamw.final.* moved by noise-driven Adam steps; compare it with an
absolute bound, not relative to itself.
"""

import argparse
import copy
import json
import os
import sys
import tempfile

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save
from transformers import BertConfig, BertForMaskedLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (same folder)

B, T = mf.B, mf.T
SEED = mf.SEED
IGNORE_INDEX = mf.IGNORE_INDEX
WEIGHT_STD = mf.WEIGHT_STD  # 2-D weights ~ N(0, 0.08^2)
NORM_STD = 0.1              # LayerNorm weights = 1 + 0.1 * N(0, 1)
BIAS_STD = 0.1              # every bias (LayerNorm's and cls.predictions.bias too) ~ 0.1 * N(0, 1)

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
FIRST_ORDINARY = 5          # ordinary tokens are 5 .. vocab-1
N_TARGETS = (5, 4)          # masked-LM targets in row 0 and row 1
INERT = "attention.self.key.bias"  # its gradient is analytically zero (see build)

# variant: (hidden_act, layer_norm_eps, intermediate_size, tie_word_embeddings).
# bert_untied: the decoder has its own weight and bias (cls.predictions.decoder.*),
# which transformers 5's forward uses; cls.predictions.bias, which that forward
# never reads (BertLMPredictionHead.forward is transform then decoder), is
# removed from the module before the run, so every stored tensor is live.
VARIANTS = {
        "bert_gelu": ("gelu", 1e-12, 160, True),
        "bert_gelu_new": ("gelu_new", 1e-5, 128, True),
        "bert_untied": ("gelu", 1e-12, 160, False),
}


def make_config(variant):
    act, eps, inter, tie = VARIANTS[variant]
    return BertConfig(
            vocab_size=96,
            hidden_size=64,
            intermediate_size=inter,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=64,
            type_vocab_size=2,
            layer_norm_eps=eps,
            hidden_act=act,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            initializer_range=0.02,
            pad_token_id=PAD,
            # Not fields of BertConfig in transformers 5 (position_embedding_type
            # was dropped: positions are always absolute); it keeps them as
            # extra attributes and writes them to config.json.
            sep_token_id=SEP,
            cls_token_id=CLS,
            position_embedding_type="absolute",
            tie_word_embeddings=tie,
            attn_implementation="eager",
    )


def config_dict(model):
    """config.json contents: make_fixtures.explicit_config with the fields
    a reader needs."""
    d = mf.explicit_config(model, ("hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "vocab_size", "max_position_embeddings",
                                   "type_vocab_size", "layer_norm_eps", "hidden_act",
                                   "hidden_dropout_prob", "attention_probs_dropout_prob",
                                   "pad_token_id", "sep_token_id", "cls_token_id",
                                   "position_embedding_type", "tie_word_embeddings",
                                   "initializer_range"),
                           "bert", "BertForMaskedLM")
    return dict(sorted(d.items()))


def expected_names(cfg):
    """named_parameters() of BertForMaskedLM, in order: no pooler
    (add_pooling_layer=False), no cls.predictions.decoder.* (tied)."""
    names = ["bert.embeddings.word_embeddings.weight",
             "bert.embeddings.position_embeddings.weight",
             "bert.embeddings.token_type_embeddings.weight",
             "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias"]
    for i in range(cfg.num_hidden_layers):
        for m in ("attention.self.query", "attention.self.key", "attention.self.value",
                  "attention.output.dense", "attention.output.LayerNorm",
                  "intermediate.dense", "output.dense", "output.LayerNorm"):
            names += ["bert.encoder.layer.%d.%s.weight" % (i, m),
                      "bert.encoder.layer.%d.%s.bias" % (i, m)]
    names += ["cls.predictions.bias",
              "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
              "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias"]
    if not cfg.tie_word_embeddings:  # its own decoder; the unused bias removed (VARIANTS)
        names.remove("cls.predictions.bias")
        names += ["cls.predictions.decoder.weight", "cls.predictions.decoder.bias"]
    return names


def init_weights(model):
    """Seeded init in named_parameters() order (tied weights visited once).
    Every tensor is non-trivial, the [PAD] embedding row included."""
    torch.manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape) * WEIGHT_STD)
            elif name.endswith("LayerNorm.weight"):
                p.copy_(1.0 + NORM_STD * torch.randn(p.shape))
            else:  # biases, LayerNorm biases, cls.predictions.bias
                p.copy_(BIAS_STD * torch.randn(p.shape))


def token_types(input_ids, type_vocab_size):
    """type[b, t] = number of [SEP] strictly before t in row b, capped at
    type_vocab_size - 1 (the rule tessera uses)."""
    sep = (input_ids == SEP).long()
    return (torch.cumsum(sep, dim=1) - sep).clamp(max=type_vocab_size - 1)


def make_batch(cfg):
    """Same batch for every variant and dtype: its own generator.
    Row 0: [CLS] a1..a4 [SEP] b1..b5 [SEP]; row 1: [CLS] c1..c6 [SEP] [PAD] x4.
    Per row, N_TARGETS ordinary positions are targets; in input_ids all but two
    become [MASK], one becomes a different random ordinary token, one is left
    unchanged (BERT's 80/10/10 rule, made deterministic)."""
    V = cfg.vocab_size
    g = torch.Generator().manual_seed(SEED + 1)

    def ordinary(n):
        return torch.randint(FIRST_ORDINARY, V, (n,), generator=g).tolist()

    row0 = [CLS] + ordinary(4) + [SEP] + ordinary(5) + [SEP]
    row1 = [CLS] + ordinary(6) + [SEP] + [PAD] * 4
    original = torch.tensor([row0, row1])
    assert original.shape == (B, T)
    input_ids = original.clone()
    targets = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    for r, n in enumerate(N_TARGETS):
        cand = (original[r] >= FIRST_ORDINARY).nonzero().flatten()
        chosen = cand[torch.randperm(len(cand), generator=g)[:n]]  # random order = random roles
        targets[r, chosen] = original[r, chosen]
        for k, t in enumerate(chosen.tolist()):
            if k < n - 2:
                input_ids[r, t] = MASK
            elif k == n - 2:
                shift = int(torch.randint(1, V - FIRST_ORDINARY, (1,), generator=g))
                input_ids[r, t] = FIRST_ORDINARY + (original[r, t] - FIRST_ORDINARY + shift) % (V - FIRST_ORDINARY)
            # else: unchanged, still a target
    type_ids = token_types(input_ids, cfg.type_vocab_size)
    attention_mask = (input_ids != cfg.pad_token_id).long()

    # The layout the fixtures promise.
    assert type_ids.tolist() == [[0] * 6 + [1] * 6, [0] * 8 + [1] * 4], type_ids
    assert attention_mask.tolist() == [[1] * 12, [1] * 8 + [0] * 4]
    kept = targets != IGNORE_INDEX
    assert kept.sum(dim=1).tolist() == list(N_TARGETS)
    assert (original[kept] >= FIRST_ORDINARY).all()  # never a special token or a pad
    assert (input_ids[kept] == MASK).sum() == sum(N_TARGETS) - 2 * B
    assert (input_ids[kept] == targets[kept]).sum() == B
    return input_ids, targets, type_ids, attention_mask


def check_row1_alone(model, inputs, logits):
    """Row 1 run alone (B=1) gives row 1's logits of the batch: the padded
    keys are masked. Without the mask its real tokens' logits change."""
    with torch.no_grad():
        alone = model(input_ids=inputs["input_ids"][1:2], attention_mask=inputs["attention_mask"][1:2],
                      token_type_ids=inputs["token_type_ids"][1:2]).logits
        unmasked = model(input_ids=inputs["input_ids"][1:2], token_type_ids=inputs["token_type_ids"][1:2],
                         attention_mask=torch.ones_like(inputs["attention_mask"][1:2])).logits
    err = (alone[0] - logits[1]).abs().max().item()
    assert err <= 1e-5, err
    real = inputs["attention_mask"][1].bool()
    moved = (unmasked[0][real] - logits[1][real]).abs().max().item()
    assert moved > 1e-2, moved
    return alone, err, moved


def pad_row_grad_parts(model, inputs, targets, padding_idx):
    """One forward/backward of a copy of the model with the given padding_idx
    (nn.Embedding's) on the word embedding. Returns the [PAD] row of the word
    embedding's gradient, the tied decoder's part of it
    (d loss / d logits[:, PAD] times the decoder's input), and the whole
    word-embedding gradient."""
    m = copy.deepcopy(model)
    m.bert.embeddings.word_embeddings.padding_idx = padding_idx
    m.zero_grad(set_to_none=True)
    seen = {}
    hook = m.cls.predictions.decoder.register_forward_hook(lambda mod, inp, out: seen.update(h=inp[0]))
    logits = m(**inputs).logits
    hook.remove()
    logits.retain_grad()
    mf.loss_fn(logits, targets).backward()
    V = logits.shape[-1]
    dlogits = logits.grad.reshape(-1, V)
    decoder_part = dlogits[:, PAD] @ seen["h"].detach().reshape(dlogits.shape[0], -1)
    g = m.bert.embeddings.word_embeddings.weight.grad
    return g[PAD], decoder_part, g


def check_padding_idx_gradient(model, inputs, targets, grads):
    """BertEmbeddings' nn.Embedding(padding_idx=pad_token_id) gives the [PAD]
    row of the word embedding no gradient from the lookup; with the tie, its
    gradient is the decoder's part only. On the fixture's batch the lookup
    part is zero anyway ([PAD] positions are masked keys and ignored targets,
    so nothing in the loss depends on their embeddings): the stored gradient
    equals the decoder part with or without padding_idx. With the pads left
    unmasked (a probe, not stored) padding_idx does drop a lookup part.
    Returns max |stored row - decoder part|, max |decoder part|, and the max
    |lookup part| dropped in the unmasked probe."""
    name = "bert.embeddings.word_embeddings.weight"
    tol = 1e-6
    for padding_idx in (PAD, None):
        row, dec, g = pad_row_grad_parts(model, inputs, targets, padding_idx)
        assert torch.equal(g[1:], grads[name][1:])
        diff = (row - dec).abs().max().item()
        assert diff <= tol * max(1.0, dec.abs().max().item()), (padding_idx, diff)
        if padding_idx == PAD:
            assert torch.equal(row, grads[name][PAD])
            stored_diff, dec_max = (grads[name][PAD] - dec).abs().max().item(), dec.abs().max().item()
    unmasked = dict(inputs, attention_mask=torch.ones_like(inputs["attention_mask"]))
    row_pad, dec_pad, _ = pad_row_grad_parts(model, unmasked, targets, PAD)
    row_none, dec_none, _ = pad_row_grad_parts(model, unmasked, targets, None)
    assert (row_pad - dec_pad).abs().max().item() <= tol * max(1.0, dec_pad.abs().max().item())
    lookup = (row_none - dec_none).abs().max().item()
    assert lookup > 1e-3, lookup
    return stored_diff, dec_max, lookup


def saved_keys(model):
    """The tensor names save_pretrained writes to model.safetensors."""
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
            return sorted(f.keys())


def build(variant, dtype, out_dir):
    cfg = make_config(variant)
    model = BertForMaskedLM(cfg).float()
    model.eval()  # no dropout (the probabilities are 0 anyway)
    assert model.config._attn_implementation == "eager"
    assert model.bert.pooler is None
    tied = cfg.tie_word_embeddings
    if tied:
        assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
        assert model.cls.predictions.decoder.bias is model.cls.predictions.bias
    else:
        assert model.cls.predictions.decoder.weight is not model.bert.embeddings.word_embeddings.weight
        assert model.cls.predictions.decoder.bias is not model.cls.predictions.bias
        del model.cls.predictions.bias  # unused by the forward (VARIANTS)
    assert model.bert.embeddings.word_embeddings.padding_idx == PAD
    names = [n for n, _ in model.named_parameters()]
    assert names == expected_names(model.config), names
    init_weights(model)

    input_ids, targets, type_ids, attention_mask = make_batch(model.config)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": type_ids}
    model_kwargs = {"attention_mask": attention_mask, "token_type_ids": type_ids}

    run = mf.run_bf16 if dtype == "bf16" else mf.run_fp32
    initial, logits, loss, grads, losses, final = run(model, input_ids, targets, **model_kwargs)

    # Sanity checks: the record is self-consistent and every gradient is live.
    V = model.config.vocab_size
    assert list(initial.keys()) == names and list(grads.keys()) == names and list(final.keys()) == names
    assert logits.shape == (B, T, V)
    assert abs(losses[0] - loss.item()) <= 1e-6 * abs(loss.item()), (losses[0], loss.item())
    assert losses[-1] < losses[0], losses
    # The key bias has no effect on the output: it adds q . b_k to every score
    # of a query's row, and the softmax is shift-invariant. Its gradient is 0
    # analytically; what is stored is rounding noise (fp32 ~1e-9, bf16 ~1e-5),
    # and its adamw.final moves by noise-driven Adam steps (README.md).
    live = {n: g.abs().max().item() for n, g in grads.items() if not n.endswith(INERT)}
    for n, g in grads.items():
        assert torch.isfinite(g).all(), n
        if n.endswith(INERT):
            assert g.abs().max().item() < 1e-2 * min(live.values()), (n, g.abs().max().item())
        else:
            assert live[n] > 0, n

    extra = {}
    if dtype == "fp32":
        # BertForMaskedLM's own loss (labels=...) is the loss stored.
        with torch.no_grad():
            hf_loss = model(**inputs, labels=targets).loss.item()
        assert abs(hf_loss - loss.item()) <= 1e-6 * abs(loss.item()), (hf_loss, loss.item())
        alone, err, moved = check_row1_alone(model, inputs, logits)
        extra["logits_row1_alone"] = alone.float().contiguous()
        print("  row 1 alone vs batch: max |diff| %.3g (without the mask real-token logits move %.3g)"
              % (err, moved))
        if tied:
            diff, dec, lookup = check_padding_idx_gradient(model, inputs, targets, grads)
            print("  grad word_embeddings[PAD] = tied decoder part to %.3g (decoder part max %.4g); "
                  "with pads unmasked, padding_idx drops a lookup part of max %.4g" % (diff, dec, lookup))
        print("  save_pretrained writes: %s" % ", ".join(
                k for k in saved_keys(model) if k.startswith("cls.") or "word_embeddings" in k))

    ids = {"input_ids": input_ids, "targets": targets, "token_type_ids": type_ids,
           "attention_mask": attention_mask}
    tensors = mf.fixture_tensors(names, initial, ids, logits, loss, grads, losses, final)
    tensors.update(extra)
    # Exactly named_parameters() is stored (as weights, grad.* and adamw.final.*),
    # the tied decoder names and the pooler are not.
    aux = {"input_ids", "targets", "token_type_ids", "attention_mask", "logits", "loss",
           "adamw.losses"} | set(extra)
    stored = {k for k in tensors if k not in aux and not k.startswith(("grad.", "adamw.final."))}
    assert stored == set(n for n, _ in model.named_parameters()) and len(stored) == len(names)
    assert {k[5:] for k in tensors if k.startswith("grad.")} == stored
    assert {k[12:] for k in tensors if k.startswith("adamw.final.")} == stored
    assert not any(("decoder" in k and tied) or "pooler" in k for k in tensors)

    metadata = {
            "format": "tessera-hf-parity-1",
            "model": "BertForMaskedLM",
            "variant": variant,
            "dtype": dtype,
            "master_dtype": "fp32",
            "loss_dtype": "fp32",
            "seed": str(SEED),
            "batch": str(B),
            "seq_len": str(T),
            "ignore_index": str(IGNORE_INDEX),
            "pad_token_id": str(PAD),
            "unk_token_id": str(UNK),
            "cls_token_id": str(CLS),
            "sep_token_id": str(SEP),
            "mask_token_id": str(MASK),
            "token_type_rule": "count of sep_token_id strictly before t, capped at type_vocab_size-1",
            "attention_mask_rule": "input_ids != pad_token_id (masks keys)",
            "lr": repr(mf.LR),
            "beta1": repr(mf.BETA1),
            "beta2": repr(mf.BETA2),
            "eps": repr(mf.EPS),
            "weight_decay": repr(mf.WEIGHT_DECAY),
            "weight_decay_applies_to": "ndim>=2, embeddings included (biases, LayerNorm: 0.0)",
            "zero_gradient": "*.attention.self.key.bias (softmax shift invariance; stored grad is rounding noise)",
            "steps": str(mf.STEPS),
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
    }
    suffix = "_bf16" if dtype == "bf16" else ""
    path = os.path.join(out_dir, "%s%s.safetensors" % (variant, suffix))
    mf.write_canonical(path, save(tensors, metadata=metadata))

    cfg_path = os.path.join(out_dir, "%s.config.json" % variant)
    with open(cfg_path, "w") as f:
        json.dump(config_dict(model), f, indent=2)
        f.write("\n")
    # The written config must load back to the same model.
    back = BertConfig.from_json_file(cfg_path)
    act, eps, inter, tie = VARIANTS[variant]
    assert (back.hidden_act, back.layer_norm_eps, back.intermediate_size) == (act, eps, inter)
    assert back.pad_token_id == PAD and back.sep_token_id == SEP and back.tie_word_embeddings == tie
    assert back.position_embedding_type == "absolute" and back.architectures == ["BertForMaskedLM"]
    back_names = [n for n, _ in BertForMaskedLM(back).named_parameters()]
    assert sorted(back_names) == sorted(names + ([] if tie else ["cls.predictions.bias"])), back_names

    print("%s: %d tensors, %d bytes, loss %.6f, adamw.losses %s" %
          (path, len(tensors), os.path.getsize(path), loss.item(),
           " ".join("%.6f" % l for l in losses)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out-dir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures"))
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    os.makedirs(args.out_dir, exist_ok=True)
    for variant in args.variants.split(","):
        if variant not in VARIANTS:
            sys.exit("unknown variant %r (expected %s)" % (variant, " or ".join(VARIANTS)))
        build(variant, args.dtype, args.out_dir)


if __name__ == "__main__":
    main()
