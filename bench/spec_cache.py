"""spec_cache.py - read the caches `specd train speculator --prepare-only`
writes (safetensors shards: tokens [n][L] I32, len [n] I32, hidden
[n][L][dim] F16; tools/train/spec_data.c) and the speculator checkpoint
beside them, for bench/lookup_headroom.py and bench/attention_headroom.py.
numpy only."""
import glob
import json
import struct

import numpy as np


def st_load(path):
    """A safetensors file as {name: array} (F16, F32 and I32 tensors)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        out = {}
        for k, v in hdr.items():
            if k == "__metadata__":
                continue
            a, b = v["data_offsets"]
            f.seek(8 + n + a)
            dt = {"F16": np.float16, "F32": np.float32, "I32": np.int32}[v["dtype"]]
            out[k] = np.frombuffer(f.read(b - a), dtype=dt).reshape(v["shape"])
    return out


def shard_paths(patterns, who):
    """The files the globs match, sorted; exits naming the globs if none."""
    paths = sorted(p for pat in patterns for p in glob.glob(pat))
    if not paths:
        raise SystemExit(f"{who}: no files match {' '.join(patterns)}")
    return paths
