#!/usr/bin/env python3
"""torch_xcheck.py - models made on the GPU machine by transformers, for scripts/gpu/check.sh.

    python3 scripts/gpu/torch_xcheck.py xcheck DIR      # tiny Llama + PyTorch references
    python3 scripts/gpu/torch_xcheck.py smol-shape DIR  # SmolLM2-135M shape, random fp16

xcheck: a tiny Llama built by transformers with a fixed seed (a shape the committed fixtures do
not have: 3 layers, 8 query / 2 KV heads, head_dim 32, so GQA groups of 4), saved as a Hugging
Face directory in fp32 ("hf") and bf16 ("hf_bf16"), plus a fixture set in the committed schema
(specd-golden/1, tests/golden/README.md) whose references PyTorch computed on the GPU: logits
and post-norm hidden states at every prompt position, a 64-token greedy continuation with its
top1-top2 margins, and the same recomputed in float64 (fp64_check). tests/golden/test_golden.c
reads the set from SPECD_GOLDEN_EXTRA and compares our CPU and our CUDA forward with it, with
the tolerances it documents. TF32 is switched off so the fp32 reference is fp32.

smol-shape: a model with SmolLM2-135M-Instruct's hyperparameters and random weights (seeded),
fp16 safetensors, with SmolLM2's real tokenizer.json (committed under tests/golden/tokenizer/),
so both services can run end to end on the GPU without carrying the 98 MB GGUF (docs/GPU.md).
Its text is noise and the shipped speculator's acceptance on it is near zero: it measures
speed and proves the path, not tau.

Needs torch and transformers (the GPU image has both); uses CUDA when torch sees a device.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = Path(__file__).resolve().parent.parent.parent
SCHEMA = "specd-golden/1"
N_NEW = 64
SEED = 2026
# Lengths 1 (a pure decode shape), 9, 40 and 130 (past 64 tokens: more than one CUDA-graph step
# size and several 16-row KV pages).
PROMPT_LENGTHS = [1, 9, 40, 130]
TINY = dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=3,
            num_attention_heads=8, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
            rms_norm_eps=1e-5, tie_word_embeddings=False)
ROPE_THETA = 10000.0
# config.json of HuggingFaceTB/SmolLM2-135M-Instruct
SMOL = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, head_dim=64,
            max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True)
SMOL_ROPE_THETA = 100000.0


def log(*a):
    print("torch_xcheck:", *a, flush=True)


def make_config(spec: dict, theta: float) -> LlamaConfig:
    # transformers 5 (the GPU image has 5.17) keeps RoPE in rope_parameters, as
    # tests/golden/make_golden.py does
    cfg = LlamaConfig(**spec, bos_token_id=1, eos_token_id=2, pad_token_id=None,
                      attention_bias=False, mlp_bias=False, hidden_act="silu",
                      initializer_range=0.2 if spec is TINY else 0.02,
                      rope_parameters={"rope_type": "default", "rope_theta": theta})
    cfg._attn_implementation = "eager"
    return cfg


def build(spec: dict, theta: float, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(make_config(spec, theta)).eval()
    # RMSNorm weights start at exactly 1.0, which would hide a forward pass that ignores them
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
    return model


def check_config_rope(hf_dir: Path, theta: float) -> None:
    """Our config.json reader takes rope_theta or rope_parameters; make sure one is there."""
    p = hf_dir / "config.json"
    c = json.loads(p.read_text())
    if "rope_theta" not in c and "rope_theta" not in (c.get("rope_parameters") or {}):
        c["rope_theta"] = theta
        p.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def reference(model, prompt: list[int], dev):
    """Logits + post-norm hidden at every position, then greedy with the KV cache."""
    ids = torch.tensor([prompt], dtype=torch.long, device=dev)
    out = model(ids, use_cache=True, output_hidden_states=True)
    logits = out.logits[0]
    hidden = model.model(ids).last_hidden_state[0]  # post-norm: the LM head's input
    past, nxt = out.past_key_values, logits[-1]
    toks, margins = [], []
    for step in range(N_NEW):
        top2 = torch.topk(nxt, 2).values
        tok = int(torch.argmax(nxt))
        toks.append(tok)
        margins.append(float(top2[0] - top2[1]))
        if step == N_NEW - 1:
            break
        o = model(torch.tensor([[tok]], dtype=torch.long, device=dev), past_key_values=past,
                  use_cache=True)
        past, nxt = o.past_key_values, o.logits[0, -1]
    return logits, hidden, toks, margins


def write_f32(path: Path, t) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4").tofile(path)


def xcheck(out: Path) -> int:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    log(f"torch {torch.__version__} on {torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model = build(TINY, ROPE_THETA, SEED)
    model.save_pretrained(out / "hf")
    check_config_rope(out / "hf", ROPE_THETA)
    # bf16 copy: the reference is fp32 compute on the bf16-rounded weights
    model_bf = build(TINY, ROPE_THETA, SEED).to(torch.bfloat16)
    model_bf.save_pretrained(out / "hf-bf16")
    check_config_rope(out / "hf-bf16", ROPE_THETA)
    # A fresh fp32 model given the rounded weights: model_bf.to(float32)
    # would keep RoPE's inv_freq buffer (not saved, so not in our input)
    # rounded to bf16, a reference whose error grows with the position (1.7
    # in the logits at 130 tokens against float64, seen on the first GPU run)
    model_bf32 = build(TINY, ROPE_THETA, SEED)
    model_bf32.load_state_dict({k: v.to(torch.float32) for k, v in model_bf.state_dict().items()})
    variants = {"hf": model, "hf_bf16": model_bf32}

    g = torch.Generator().manual_seed(SEED + 2)
    prompts = [torch.randint(0, TINY["vocab_size"], (n,), generator=g).tolist()
               for n in PROMPT_LENGTHS]
    cases = []
    for key, m in variants.items():
        m32 = m.to(dev).eval()
        m64 = build(TINY, ROPE_THETA, SEED)  # same weights, float64
        m64.load_state_dict({k: v.detach().cpu() for k, v in m.state_dict().items()})
        m64 = m64.to(dev, torch.float64).eval()
        for i, prompt in enumerate(prompts):
            logits, hidden, toks, margins = reference(m32, prompt, dev)
            l64, _, toks64, _ = reference(m64, prompt, dev)
            name = f"{key}_{i}"
            write_f32(out / "ref" / f"{name}.logits.f32", logits)
            write_f32(out / "ref" / f"{name}.hidden.f32", hidden)
            n = len(prompt)
            cases.append({
                "name": f"{key}/prompt{i}", "file": key, "prompt": prompt,
                "logits": {"path": f"ref/{name}.logits.f32", "rows": n,
                           "cols": TINY["vocab_size"], "positions": "all"},
                "hidden": {"path": f"ref/{name}.hidden.f32", "rows": n,
                           "cols": TINY["hidden_size"], "positions": "all"},
                "greedy": toks, "greedy_margins": margins, "greedy_min_margin": min(margins),
                "fp64_check": {"logits_max_abs_err": float((logits.double() - l64).abs().max()),
                               "greedy_fp64_agrees": toks == toks64},
            })
            log(f"{name}: {n} tokens, fp64 logits error "
                f"{cases[-1]['fp64_check']['logits_max_abs_err']:.2e}, min margin {min(margins):.3g}")
    ref = {
        "schema": SCHEMA, "model": "torch-xcheck",
        "description": f"tiny random Llama made by scripts/gpu/torch_xcheck.py (seed {SEED}); "
                       f"references computed by PyTorch on {dev}",
        "generator": {"script": "scripts/gpu/torch_xcheck.py", "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"},
        "config": {**TINY, "rope_theta": ROPE_THETA, "rope_scaling": None, "bos_token_id": 1,
                   "eos_token_id": 2},
        "format_files": {"hf": "hf", "hf_bf16": "hf-bf16"},
        "n_new": N_NEW,
        # fp32 vs fp32 on identical weights: summation order only (tests/golden/README.md)
        "tolerance": {"logits_rel": 1e-4, "hidden_rel": 1e-4},
        "cases": cases,
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    log(f"wrote {len(cases)} cases to {out}")
    return 0


def smol_shape(out: Path) -> int:
    if out.exists():
        shutil.rmtree(out)
    model = build(SMOL, SMOL_ROPE_THETA, SEED).to(torch.float16)
    model.save_pretrained(out)
    check_config_rope(out, SMOL_ROPE_THETA)
    shutil.copy(ROOT / "tests/golden/tokenizer/smollm2_tokenizer.json", out / "tokenizer.json")
    n = sum(p.numel() for p in model.parameters())
    log(f"wrote {out}: SmolLM2-135M shape, {n / 1e6:.1f}M random fp16 parameters")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] not in ("xcheck", "smol-shape"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return xcheck(Path(argv[2])) if argv[1] == "xcheck" else smol_shape(Path(argv[2]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
