#!/usr/bin/env python3
"""check_export.py — does a `tessera export` folder load in transformers and
compute the logits of the fixture it came from?

    python3 tests/hf_parity/check_export.py EXPORTED_DIR FIXTURE.safetensors

Loads EXPORTED_DIR with AutoModelForCausalLM.from_pretrained, or
AutoModelForMaskedLM for a BERT folder (fp32, eager attention, CPU), runs
the fixture's input_ids (and a BERT fixture's attention_mask and
token_type_ids) and compares the logits with
the fixture's "logits" (what transformers computed from the original
weights). Prints the relative max error and exits 0 when it is below 1e-5
(the parity tolerance of tests/hf_parity_test.cc), 1 otherwise. Needs torch
and transformers (CI has neither: run it where they are installed, e.g.
the GPU machine, and record the run in docs/BENCHMARKS.md).

The exported folders of the committed fixtures (imported into tessera,
saved as a checkpoint, exported: tests/hf_roundtrip_test.cc) are kept by
Bazel:
    bazel test //tests:hf_roundtrip_test
    unzip -o bazel-testlogs/tests/hf_roundtrip_test/test.outputs/outputs.zip -d /tmp/exports
    for v in llama_untied llama_tied bert_gelu bert_gelu_new; do
      python3 tests/hf_parity/check_export.py /tmp/exports/$v tests/hf_parity/fixtures/$v.safetensors
    done
"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    folder, fixture = sys.argv[1], sys.argv[2]
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    ref = load_file(fixture)
    bert = AutoConfig.from_pretrained(folder).model_type == "bert"
    auto = AutoModelForMaskedLM if bert else AutoModelForCausalLM
    model = auto.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    inputs = {"input_ids": ref["input_ids"].long()}
    if bert:
        inputs["attention_mask"] = ref["attention_mask"].long()
        inputs["token_type_ids"] = ref["token_type_ids"].long()
    with torch.no_grad():
        logits = model(**inputs).logits
    want = ref["logits"]
    err = (logits - want).abs().max().item() / want.abs().max().item()
    print(f"{folder}: logits {tuple(logits.shape)}, relative max error {err:.3e} "
          f"against {fixture} (tolerance 1e-5)")
    return 0 if err < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
