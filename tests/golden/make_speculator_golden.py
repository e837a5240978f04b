#!/usr/bin/env python3
"""make_speculator_golden.py - reference fixtures for specd's MLP speculator (common/model/mlp_speculator.c).

WHAT IT MAKES (under tests/golden/data/, committed; CI never runs this script):

  mlp-spec-untied/   vocab 100, emb_dim 32, inner_dim 48, n_predict 3, top_k [4, 3, 2], untied,
                     scale_input false; F32; keys "speculator.*"; one model.safetensors
  mlp-spec-tied/     vocab 64, emb_dim 32, inner_dim 0 (= emb_dim), n_predict 3, top_k [3, 2, 2],
                     tie_weights true, scale_input true; F16; keys WITHOUT the "speculator." prefix;
                     written by safetensors.torch.save_model, which stores each shared tensor once
                     (emb.0, proj.0, proj.1, head.0, ln.0.*) exactly as a tied checkpoint does
  mlp-spec-sharded/  vocab 80, emb_dim 32, inner_dim 48, n_predict 4, top_k [3, 2, 2, 1], untied,
                     scale_input true; BF16; keys "speculator.*"; two shards + model.safetensors.index.json

  Each directory: config.json + weights (the public Hugging Face "MLPSpeculator" format of IBM's
  accelerators, e.g. ibm-fms/llama-13b-accelerator), reference.json and ref/*.f32 (raw little-endian
  float32, row-major).

THE REFERENCE
  MLPSpeculator below is written as fms-extras' MLPSpeculator (fms_extras/models/speculator.py) and vLLM's
  MLPSpeculator loader compute it, in its teacher-forced form ("forward", the training pass): stage i gets
  the token inds[:, i]. With seq len 1 per row:
      state = ln0(state) / sqrt(2)                       if scale_input (ln0: x * rsqrt(mean(x^2) + 1e-6))
      for i in range(n_predict):
          z = emb[i](inds[:, i])
          state = proj[i](state)
          state = state + (emb_weight / state_weight) * z     state_weight = 0.5 ** (0.5 / n_predict),
                                                              emb_weight = sqrt((1 - sw^2) * inner_dim / 2)
          state = gelu(ln[i](state))                          ln: x * rsqrt(mean(x^2) + 1e-6) * w + b, exact GELU
          logits[i] = head[i](state)
  Tied weights as the reference ties them: emb/head/ln share index 0, proj of stages >= 1 shares proj.1.
  Computed in fp32 on the weights the file holds (F16/BF16 files: those weights converted to fp32). A
  float64 recomputation records the error the fp32 reference itself carries (fp64_check).

  Inputs per set: 6 rows; state_in [6, emb_dim] (scale_input sets use states of scale ~3 with an offset, so
  the input norm matters), tokens [6, n_predict] random ids; outputs per stage: logits [6, vocab] and the
  new state [6, inner_dim]. Weights ~ N(0, 1/sqrt(inner_dim)) as the reference's reset_parameters draws
  them; LayerNorm weights 1 + 0.25 N(0,1) and biases 0.1 N(0,1) so a pass that ignores them fails.

HOW TO RUN (repository root, a few seconds):
    python3 tests/golden/make_speculator_golden.py            # writes all three sets
    python3 tests/golden/make_speculator_golden.py --verify   # recomputes from the committed files, writes nothing
  Needs torch (CPU), safetensors, numpy. Made with python 3.11.7, torch 2.15.0, safetensors 0.8.0,
  numpy 2.4.6.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import shutil
import sys
from pathlib import Path

import numpy as np
import safetensors
import torch
import torch.nn as nn
from safetensors.torch import load_file, save_file, save_model

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
SCHEMA = "specd-mlp-spec-golden/1"
ROWS = 6
TOLERANCE = 1e-4

SETS = {
    "mlp-spec-untied": dict(
        seed=101, dtype="F32", prefix=True, layout="single", state_scale=1.0,
        config=dict(vocab_size=100, emb_dim=32, inner_dim=48, n_predict=3, top_k_tokens_per_head=[4, 3, 2],
                    n_candidates=5, tie_weights=False, scale_input=False)),
    "mlp-spec-tied": dict(
        seed=202, dtype="F16", prefix=False, layout="single", state_scale=3.0,
        config=dict(vocab_size=64, emb_dim=32, inner_dim=0, n_predict=3, top_k_tokens_per_head=[3, 2, 2],
                    n_candidates=4, tie_weights=True, scale_input=True)),
    "mlp-spec-sharded": dict(
        seed=303, dtype="BF16", prefix=True, layout="sharded", state_scale=3.0,
        config=dict(vocab_size=80, emb_dim=32, inner_dim=48, n_predict=4, top_k_tokens_per_head=[3, 2, 2, 1],
                    n_candidates=6, tie_weights=False, scale_input=True)),
}

TORCH_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


# ---------------------------------------------------------------------------------------------------
# the reference model (fms-extras' MLPSpeculator, teacher-forced forward)


class LayerNormParameterized(nn.Module):
    """fms' LayerNormParameterized with use_mean=False: x * rsqrt(mean(x^2) + eps) [* weight] [+ bias]."""

    def __init__(self, dim, eps=1e-6, elementwise_scale=True, elementwise_shift=False):
        super().__init__()
        self.eps = eps
        self.elementwise_scale = elementwise_scale
        self.elementwise_shift = elementwise_shift
        if elementwise_scale:
            self.weight = nn.Parameter(torch.ones(dim))
        if elementwise_shift:
            self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.elementwise_scale:
            x = self.weight * x
        if self.elementwise_shift:
            x = x + self.bias
        return x


class MLPSpeculator(nn.Module):
    def __init__(self, emb_dim, inner_dim, vocab_size, n_predict, tie_weights, scale_input):
        super().__init__()
        self.n_predict = n_predict
        self.emb_dim = emb_dim
        self.inner_dim = inner_dim if inner_dim != 0 else emb_dim
        self.vocab_size = vocab_size
        self.scale_input = scale_input
        self.emb = nn.ModuleList([nn.Embedding(vocab_size, self.inner_dim) for _ in range(n_predict)])
        self.proj = nn.ModuleList([nn.Linear(emb_dim if i == 0 else self.inner_dim, self.inner_dim, bias=False)
                                   for i in range(n_predict)])
        self.head = nn.ModuleList([nn.Linear(self.inner_dim, vocab_size, bias=False) for _ in range(n_predict)])
        self.ln = nn.ModuleList([LayerNormParameterized(self.inner_dim, elementwise_shift=True,
                                                        elementwise_scale=True) for _ in range(n_predict)])
        if scale_input:
            self.ln0 = LayerNormParameterized(emb_dim, elementwise_shift=False, elementwise_scale=False)
        self.state_weight = 0.5 ** (0.5 / n_predict)
        self.emb_weight = math.sqrt((1 - self.state_weight ** 2) * (self.inner_dim / 2))
        self.activation = nn.GELU()
        if tie_weights:
            assert n_predict > 1
            for emb in self.emb:
                emb.weight = self.emb[0].weight
            for head in self.head:
                head.weight = self.head[0].weight
            for ln in self.ln:
                ln.weight = self.ln[0].weight
                ln.bias = self.ln[0].bias
            for i in range(2, n_predict):
                self.proj[i].weight = self.proj[1].weight

    def forward(self, state, inds):
        """state [b n d], inds [b n+n_predict-1 (or more)]: returns logits [h b n v] and the states [h b n d']."""
        out, states = [], []
        if self.scale_input:
            state = self.ln0(state) / (2 ** 0.5)
        for i in range(self.n_predict):
            z = self.emb[i](inds[:, i: i + state.size(1)])
            state = self.proj[i](state)
            state = torch.add(state, z, alpha=self.emb_weight / self.state_weight)
            state = self.activation(self.ln[i](state))
            states.append(state)
            out.append(self.head[i](state))
        return torch.stack(out, dim=0), torch.stack(states, dim=0)


class Wrapped(nn.Module):
    """Puts the speculator under the attribute "speculator", so its keys read speculator.emb.0.weight."""

    def __init__(self, sp):
        super().__init__()
        self.speculator = sp


# ---------------------------------------------------------------------------------------------------
# helpers


def versions() -> dict:
    return {"python": platform.python_version(), "torch": torch.__version__,
            "safetensors": safetensors.__version__, "numpy": np.__version__}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_f32(path: Path, arr) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.ascontiguousarray(np.asarray(arr, dtype="<f4")).tofile(path)


def read_f32(path: Path, shape) -> np.ndarray:
    a = np.fromfile(path, dtype="<f4")
    assert a.size == int(np.prod(shape)), (path, a.size, shape)
    return a.reshape(shape)


def build(spec) -> MLPSpeculator:
    c = spec["config"]
    torch.manual_seed(spec["seed"])
    sp = MLPSpeculator(c["emb_dim"], c["inner_dim"], c["vocab_size"], c["n_predict"], c["tie_weights"],
                       c["scale_input"])
    inner = sp.inner_dim
    with torch.no_grad():
        for m in sp.modules():
            if isinstance(m, (nn.Embedding, nn.Linear)):
                nn.init.normal_(m.weight, 0, 1 / math.sqrt(inner))
            elif isinstance(m, LayerNormParameterized) and m.elementwise_scale:
                m.weight.copy_(1 + 0.25 * torch.randn_like(m.weight))
                m.bias.copy_(0.1 * torch.randn_like(m.bias))
        # round to the stored dtype, then compute in fp32 on exactly those values
        dt = TORCH_DTYPES[spec["dtype"]]
        for p in sp.parameters():
            p.copy_(p.to(dt).to(torch.float32))
    return sp.eval()


def inputs(spec, sp: MLPSpeculator):
    c = spec["config"]
    g = torch.Generator().manual_seed(spec["seed"] + 1)
    state = torch.randn(ROWS, c["emb_dim"], generator=g) * spec["state_scale"]
    if c["scale_input"]:
        state = state + 0.5  # an offset: the norm, not just the direction, must be right
    tokens = torch.randint(0, c["vocab_size"], (ROWS, c["n_predict"]), generator=g)
    return state, tokens


def run(sp: MLPSpeculator, state, tokens, dtype=torch.float32):
    with torch.no_grad():
        m = sp.to(dtype)
        logits, states = m(state.to(dtype).unsqueeze(1), tokens)
        sp.to(torch.float32)
    return logits[:, :, 0, :].to(torch.float32), states[:, :, 0, :].to(torch.float32)


def save_weights(spec, sp: MLPSpeculator, out: Path) -> list:
    """Writes the checkpoint as published speculators are laid out; returns the stored tensor names."""
    dt = TORCH_DTYPES[spec["dtype"]]
    mod = Wrapped(sp) if spec["prefix"] else sp
    if spec["layout"] == "single":
        # save_model keeps one name per shared storage, as HF's save_pretrained does for tied weights
        mod.to(dt)
        save_model(mod, str(out / "model.safetensors"), metadata={"format": "pt"})
        mod.to(torch.float32)
        # save_model also records the dropped aliases in the metadata, in hash order (the file would
        # change from run to run); rewrite it with the metadata transformers' save_pretrained writes
        path = str(out / "model.safetensors")
        tensors = load_file(path)
        save_file(dict(sorted(tensors.items())), path, metadata={"format": "pt"})
        names = sorted(tensors.keys())
    else:
        sd = {k: v.detach().to(dt).contiguous() for k, v in mod.state_dict().items()}
        names = sorted(sd.keys())
        # shard 1: the first half of the stages' emb/proj/ln; shard 2: the rest and every head
        n = spec["config"]["n_predict"]
        first = {k for k in names if ".head." not in k and int(k.split(".")[-2]) < n // 2}
        shards = {"model-00001-of-00002.safetensors": sorted(first),
                  "model-00002-of-00002.safetensors": sorted(set(names) - first)}
        weight_map, total = {}, 0
        for fname, keys in shards.items():
            save_file({k: sd[k] for k in keys}, str(out / fname), metadata={"format": "pt"})
            for k in keys:
                weight_map[k] = fname
                total += sd[k].numel() * sd[k].element_size()
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for f in out.glob("*.safetensors"):
        f.chmod(0o644)  # the writer makes them owner-only; fixtures are plain readable files
    return names


def check_roundtrip(spec, sp: MLPSpeculator, out: Path) -> None:
    """Loads the written files back into a fresh reference model and requires identical weights."""
    c = spec["config"]
    files = sorted(out.glob("*.safetensors"))
    sd = {}
    for f in files:
        sd.update(load_file(str(f)))
    prefix = "speculator." if spec["prefix"] else ""
    fresh = MLPSpeculator(c["emb_dim"], c["inner_dim"], c["vocab_size"], c["n_predict"], c["tie_weights"],
                          c["scale_input"])
    own = {k[len(prefix):]: v.to(torch.float32) for k, v in sd.items()}
    missing, unexpected = fresh.load_state_dict(own, strict=False)
    assert not unexpected, unexpected
    if not c["tie_weights"]:
        assert not missing, missing
    for (k, a), (_, b) in zip(sp.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), k


# ---------------------------------------------------------------------------------------------------


def make_set(name: str, spec: dict, verify: bool) -> float:
    out = DATA / name
    c = spec["config"]
    sp = build(spec)
    state, tokens = inputs(spec, sp)
    logits, states = run(sp, state, tokens)
    logits64, states64 = run(sp, state, tokens, torch.float64)
    fp64 = {"logits_max_abs_err": float((logits - logits64).abs().max()),
            "state_max_abs_err": float((states - states64).abs().max())}
    n = c["n_predict"]
    if verify:
        ref = json.loads((out / "reference.json").read_text())
        worst = 0.0
        for i in range(n):
            got = read_f32(out / ref["stages"][i]["logits"]["path"], (ROWS, c["vocab_size"]))
            worst = max(worst, float(np.abs(got - logits[i].numpy()).max()))
        check_roundtrip(spec, sp, out)
        print(f"{name}: max |committed - recomputed| logits = {worst:.3g}")
        return worst
    if out.exists():
        shutil.rmtree(out)
    (out / "ref").mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(
        {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator", **c,
         "torch_dtype": {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[spec["dtype"]]},
        indent=2) + "\n")
    stored = save_weights(spec, sp, out)
    check_roundtrip(spec, sp, out)
    write_f32(out / "ref/state_in.f32", state)
    stages = []
    for i in range(n):
        write_f32(out / f"ref/stage{i}.logits.f32", logits[i])
        write_f32(out / f"ref/stage{i}.state.f32", states[i])
        stages.append({"logits": {"path": f"ref/stage{i}.logits.f32", "rows": ROWS, "cols": c["vocab_size"]},
                       "state": {"path": f"ref/stage{i}.state.f32", "rows": ROWS,
                                 "cols": c["inner_dim"] or c["emb_dim"]},
                       "argmax": [int(t) for t in logits[i].argmax(-1)]})
    ref = {
        "schema": SCHEMA,
        "set": name,
        "description": f"tiny random MLPSpeculator: {json.dumps(c)}; weights {spec['dtype']}, "
                       f"keys {'with' if spec['prefix'] else 'without'} the 'speculator.' prefix, "
                       f"{spec['layout']} file layout",
        "generator": {"script": "tests/golden/make_speculator_golden.py", "seed": spec["seed"],
                      "versions": versions()},
        "config": c,
        "weights": {"dtype": spec["dtype"], "prefix": "speculator." if spec["prefix"] else "",
                    "layout": spec["layout"], "stored_tensors": stored},
        "rows": ROWS,
        "state_in": {"path": "ref/state_in.f32", "rows": ROWS, "cols": c["emb_dim"]},
        "tokens": tokens.tolist(),
        "tokens_note": "teacher-forced: stage i gets tokens[row][i]; stage 0's state is state_in, stage i's "
                       "the state stage i-1 produced",
        "stages": stages,
        "tolerance": {"logits_rel": TOLERANCE, "state_rel": TOLERANCE,
                      "rule": "max |c - ref| <= rel * max(1, max |ref|) per stage array"},
        "fp64_check": fp64,
        "file_info": {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)}
                      for p in sorted(out.iterdir()) if p.is_file()},
    }
    (out / "reference.json").write_text(json.dumps(ref, indent=1) + "\n")
    print(f"{name}: stored {len(stored)} tensors, fp64 check {fp64}")
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--verify", action="store_true", help="recompute and compare, write nothing")
    ap.add_argument("--only", choices=sorted(SETS), help="one set")
    a = ap.parse_args()
    torch.set_num_threads(1)  # deterministic summation order
    worst = 0.0
    for name, spec in SETS.items():
        if a.only and name != a.only:
            continue
        worst = max(worst, make_set(name, spec, a.verify))
    if a.verify and worst > 1e-6:
        print(f"verify: committed references differ by {worst:.3g}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
