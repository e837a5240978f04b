#!/usr/bin/env python3
"""attention_headroom.py - would attention over the target's features
(EAGLE's idea, Li et al. 2024) make the speculator's first head better,
measured offline before draft-svc is built for it.

    python3 bench/attention_headroom.py --train 'DS/cache/stage2-*.safetensors' \
        --held 'HO/cache/stage2-*.safetensors' --mode attn|mlp [--epochs 3]

Needs numpy and PyTorch (`pip install numpy torch`; not part of
scripts/setup.sh: nothing in CI runs this). The inputs are `specd train
speculator --prepare-only` caches: the target's greedy continuations with
its final-norm hidden state at every position (docs/BENCHMARKS.md,
fifty-first session, has the commands). Both modes start from the shipped speculator's stage 0 and
train on --train's continuations to predict the token at j + 2 from the
state at j and the token at j + 1, as stage 0 does:

  mlp   the stage as it is (the control: what more data of this kind
        gives by itself);
  attn  the same stage, with the state first moved by one causal
        transformer block over the continuation so far (input: the
        normalized state and the token's embedding at every earlier
        position; 9 heads of 64, RoPE, a SwiGLU MLP of 1536; its output
        projections start at zero, so training starts at the shipped
        head exactly). In draft-svc this needs the target's state at every
        accepted position, not only the last, and a cache of the block's
        keys and values per session.

Each epoch prints the held-out top-1: how often stage 0's most likely token
(never the "other" bucket) is the target's greedy token, which is the
chance that greedy verification accepts the first drafted token. The
caches hold the continuation only (the prompt's states are not stored), so
attn sees less context than it would in draft-svc.
"""
import argparse
import math
import os
import time

try:
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    raise SystemExit(f"attention_headroom: needs numpy and PyTorch ({e}); pip install numpy torch")

from spec_cache import first_stage, load_shard, shard_paths  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_caches(patterns):
    """tokens [N, L] (zero-padded), states [N, L, dim], lengths [N]."""
    parts = [load_shard(p) for p in shard_paths(patterns, "attention_headroom")]
    L = max(t["tokens"].shape[1] for t in parts)
    toks = np.concatenate([np.pad(t["tokens"], ((0, 0), (0, L - t["tokens"].shape[1]))) for t in parts])
    hid = np.concatenate([np.pad(t["hidden"], ((0, 0), (0, L - t["hidden"].shape[1]), (0, 0)))
                          for t in parts])
    lens = np.concatenate([t["len"] for t in parts])
    return torch.tensor(toks).long(), torch.tensor(hid.astype(np.float32)), torch.tensor(lens).long()


class FirstStage(nn.Module):
    def __init__(self, spec_dir, attn):
        super().__init__()
        st = first_stage(spec_dir)
        p = lambda k: nn.Parameter(torch.tensor(st[k]))  # noqa: E731
        self.proj, self.emb, self.head = p("proj"), p("emb"), p("head")
        self.lnw, self.lnb = p("lnw"), p("lnb")
        self.register_buffer("vmap", torch.tensor(st["vmap"]))
        self.register_buffer("t2d", torch.tensor(st["t2d"]))
        self.other, self.inner, self.esc = st["other"], st["inner"], st["esc"]
        self.attn = attn
        if attn:
            D, E = st["emb_dim"], self.inner
            self.nh, self.hd = 9, D // 9
            self.fc = nn.Linear(D + E, D, bias=False)
            self.n1, self.n2 = nn.RMSNorm(D, eps=1e-6), nn.RMSNorm(D, eps=1e-6)
            self.qkv, self.o = nn.Linear(D, 3 * D, bias=False), nn.Linear(D, D, bias=False)
            self.up, self.gate = nn.Linear(D, 1536, bias=False), nn.Linear(D, 1536, bias=False)
            self.down = nn.Linear(1536, D, bias=False)
            nn.init.zeros_(self.o.weight)
            nn.init.zeros_(self.down.weight)

    def rope(self, x):  # [B, heads, L, hd], adjacent pairs as the target's
        L = x.shape[2]
        inv = 1.0 / (10000 ** (torch.arange(0, self.hd, 2).float() / self.hd))
        ang = torch.arange(L).float()[:, None] * inv[None]
        c, s = ang.cos(), ang.sin()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)

    def forward(self, h, nxt):  # states at j [B, L, D], tokens at j + 1 [B, L]
        B, L, D = h.shape
        s = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6) / math.sqrt(2)
        e = self.emb[self.t2d[nxt]]
        if self.attn:
            x = self.fc(torch.cat([s, e], -1))
            q, k, v = self.qkv(self.n1(x)).view(B, L, 3, self.nh, self.hd).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
            d = self.o(y.transpose(1, 2).reshape(B, L, D))
            z = self.n2(x + d)
            d = d + self.down(F.silu(self.gate(z)) * self.up(z))
            s = s + d  # zero at the start: the shipped stage exactly
        u = s @ self.proj.T + self.esc * e
        u = F.layer_norm(u, (self.inner,), self.lnw, self.lnb, 1e-6)
        return F.gelu(u) @ self.head.T


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", nargs="+", required=True, help="globs of the training caches")
    ap.add_argument("--held", required=True, help="glob of the held-out prompts' cache")
    ap.add_argument("--speculator", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.speculator"))
    ap.add_argument("--mode", choices=["mlp", "attn"], default="attn")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16, help="continuations per step")
    ap.add_argument("--lr", type=float, default=1e-3, help="the new block's peak learning rate")
    ap.add_argument("--lr-stage", type=float, default=1e-4, help="the shipped stage's (0 = frozen)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)

    Ttr, Htr, Ltr = load_caches(a.train)
    Tho, Hho, Lho = load_caches([a.held])
    m = FirstStage(a.speculator, a.mode == "attn")
    stage = [m.proj, m.emb, m.head, m.lnw, m.lnb]
    new = [p for p in m.parameters() if not any(p is q for q in stage)]
    groups = [{"params": stage, "lr": a.lr_stage, "base": a.lr_stage}]
    if new:
        groups.append({"params": new, "lr": a.lr, "base": a.lr})
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.95), weight_decay=0.01)
    print(f"{a.mode}: {len(Ttr)} continuations, {int((Ltr - 2).clamp(min=0).sum())} positions "
          f"to train on; {int((Lho - 2).clamp(min=0).sum())} held out", flush=True)

    def logits_of(T, H, lens):
        Lm = int(lens.max())
        T, H = T[:, :Lm], H[:, :Lm]
        mask = torch.arange(Lm - 2)[None] < (lens[:, None] - 2)
        return m(H[:, :-2], T[:, 1:-1]), T[:, 2:], mask

    def held_top1():
        m.eval()
        right = total = 0
        with torch.no_grad():
            for i in range(0, len(Tho), 32):
                lg, truth, mask = logits_of(Tho[i:i + 32], Hho[i:i + 32], Lho[i:i + 32])
                lg[..., m.other] = -torch.inf
                right += ((m.vmap[lg.argmax(-1)] == truth) & mask).sum().item()
                total += mask.sum().item()
        m.train()
        return right / total

    print(f"{a.mode}: before training, held-out top-1 {held_top1():.4f}", flush=True)
    steps = a.epochs * (len(Ttr) // a.batch)
    step, t0 = 0, time.time()
    for ep in range(a.epochs):
        perm = torch.randperm(len(Ttr))
        for i in range(0, len(Ttr) - a.batch + 1, a.batch):
            idx = perm[i:i + a.batch]
            f = min(1.0, (step + 1) / 20) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / steps)))
            for g in opt.param_groups:
                g["lr"] = g["base"] * f
            lg, truth, mask = logits_of(Ttr[idx], Htr[idx], Ltr[idx])
            loss = F.cross_entropy(lg[mask], m.t2d[truth][mask])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            step += 1
        print(f"{a.mode}: epoch {ep + 1}, loss {loss.item():.3f}, held-out top-1 {held_top1():.4f} "
              f"({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
