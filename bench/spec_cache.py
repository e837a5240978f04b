"""spec_cache.py - read the caches `specd train speculator --prepare-only`
writes (safetensors shards: tokens [n][L] I32, len [n] I32, hidden
[n][L][dim] F16; tools/train/spec_data.c) and the first stage of the
speculator checkpoint beside them, for bench/lookup_headroom.py and
bench/attention_headroom.py. numpy only."""
import glob
import json
import math
import os
import struct

import numpy as np

DTYPES = {"F16": np.float16, "F32": np.float32, "I32": np.int32}
MAX_HEADER = 100 << 20  # the safetensors format's own cap on the JSON header


def st_load(path):
    """A safetensors file as {name: array} (F16, F32 and I32 tensors);
    exits naming the file and what is wrong with it."""
    def bad(why):
        raise SystemExit(f"{path}: not a safetensors file this reads: {why}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size < 8:
            bad("shorter than its 8-byte header length")
        n = struct.unpack("<Q", f.read(8))[0]
        if n > MAX_HEADER or n > size - 8:
            bad(f"header length {n} past the file's {size} bytes or the 100 MiB cap")
        try:
            hdr = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            bad(f"header is not JSON ({e})")
        out = {}
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            try:
                dt = DTYPES[v["dtype"]]
                a, b = v["data_offsets"]
                shape = [int(d) for d in v["shape"]]
            except (KeyError, TypeError, ValueError):
                bad(f"tensor {k!r}: needs dtype F16/F32/I32, data_offsets and shape")
            want = int(np.prod(shape)) * np.dtype(dt).itemsize
            if not (0 <= a <= b <= size - 8 - n) or b - a != want:
                bad(f"tensor {k!r}: bytes {a}..{b} do not hold its shape {shape} in the file")
            f.seek(8 + n + a)
            out[k] = np.frombuffer(f.read(b - a), dtype=dt).reshape(shape)
    return out


def shard_paths(patterns, who):
    """The files the globs match, sorted; exits naming the globs if none."""
    paths = sorted(p for pat in patterns for p in glob.glob(pat))
    if not paths:
        raise SystemExit(f"{who}: no files match {' '.join(patterns)}")
    return paths


def load_shard(path):
    """One cache shard, checked: tokens [n][L], len [n] (each 0..L) and
    hidden [n][L][dim]."""
    t = st_load(path)
    tok, ln, hid = t.get("tokens"), t.get("len"), t.get("hidden")
    if (tok is None or ln is None or hid is None or tok.ndim != 2 or ln.shape != tok.shape[:1]
            or hid.shape[:2] != tok.shape or ln.min(initial=0) < 0 or ln.max(initial=0) > tok.shape[1]):
        raise SystemExit(f"{path}: not a `specd train speculator --prepare-only` cache shard "
                         "(tokens [n][L], len [n] in 0..L, hidden [n][L][dim])")
    return t


def first_stage(spec_dir):
    """Stage 0 of an MLPSpeculator checkpoint with a reduced draft
    vocabulary (common/model/mlp_speculator.c), as float32 arrays: proj,
    emb, head, lnw, lnb; vmap (draft id -> target id, -1 = the "other"
    bucket), t2d (target id -> draft id), other (that bucket's draft id),
    esc (the reference's emb_weight / state_weight), inner (state width)."""
    cfg = json.load(open(os.path.join(spec_dir, "config.json")))
    w = st_load(os.path.join(spec_dir, "model.safetensors"))
    s = {k: w[f"speculator.{name}"].astype(np.float32)
         for k, name in (("proj", "proj.0.weight"), ("emb", "emb.0.weight"),
                         ("head", "head.0.weight"), ("lnw", "ln.0.weight"), ("lnb", "ln.0.bias"))}
    vmap = w["speculator.vocab_map"].astype(np.int64)
    other = int(np.nonzero(vmap < 0)[0][0])
    t2d = np.full(cfg["target_vocab_size"], other, np.int64)
    keep = np.nonzero(vmap >= 0)[0]
    t2d[vmap[keep]] = keep
    sw = 0.5 ** (0.5 / cfg["n_predict"])
    s.update(vmap=vmap, t2d=t2d, other=other, inner=cfg["inner_dim"], emb_dim=cfg["emb_dim"],
             esc=math.sqrt((1 - sw * sw) * (cfg["inner_dim"] / 2)) / sw)
    return s
