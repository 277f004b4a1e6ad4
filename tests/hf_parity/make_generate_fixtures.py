#!/usr/bin/env python3
"""make_generate_fixtures.py — what transformers' greedy generate gives for
the parity fixtures' LLaMA models, for tessera's `generate` to match.

For each variant (untied, tied) it loads the fixture's config.json and its
initial weights (fixtures/llama_<variant>.safetensors, the tensors named as
parameters), runs LlamaForCausalLM.generate(do_sample=False) in fp32 on the
CPU from a fixed prompt (the fixture's input_ids row 0, first 8 ids), with
no end-of-sequence id (so exactly MAX_NEW tokens come out), and writes
fixtures/generate.json:

    {"<variant>": {"prompt": [...], "tokens": [...],
                   "min_margin": smallest gap between the largest and the
                                 second-largest logit over the steps}, ...,
     "versions": {...}}

A token is only a fair test of the argmax where its margin exceeds the
difference between two fp32 implementations (about 1e-5 here); the script
prints min_margin so whoever regenerates can see it. CI never runs this
script (torch); developers run it (README.md) and commit the output.
"""

import json
import os

import torch
import transformers
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures")
PROMPT_LEN = 8
MAX_NEW = 40  # prompt + new = 48 <= max_position_embeddings 64


def run(variant):
    with open(os.path.join(FIX, f"llama_{variant}.config.json")) as f:
        cfg = json.load(f)
    config = LlamaConfig(**cfg)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    tensors = load_file(os.path.join(FIX, f"llama_{variant}.safetensors"))
    names = dict(model.named_parameters())
    state = {k: tensors[k] for k in names if k in tensors}
    missing = model.load_state_dict(state, strict=False)
    assert not [k for k in missing.missing_keys if k != "lm_head.weight"], missing
    if config.tie_word_embeddings:
        model.tie_weights()
    prompt = tensors["input_ids"][0, :PROMPT_LEN].to(torch.long).unsqueeze(0)
    with torch.no_grad():
        out = model.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW,
                             eos_token_id=None, pad_token_id=0,
                             output_scores=True, return_dict_in_generate=True)
    margins = []
    for s in out.scores:
        top = torch.topk(s[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    tokens = out.sequences[0, PROMPT_LEN:].tolist()
    assert len(tokens) == MAX_NEW
    return {"prompt": prompt[0].tolist(), "tokens": tokens, "min_margin": min(margins)}


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    result = {v: run(v) for v in ("untied", "tied")}
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
    with open(os.path.join(FIX, "generate.json"), "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    for v in ("untied", "tied"):
        print(v, "min margin", result[v]["min_margin"])


if __name__ == "__main__":
    main()
