#!/usr/bin/env python3
"""train_speculator.py - the default model's MLP speculator, data and
training on one GPU in a few minutes (docs/TRAINING.md, the GPU recipe).

    python3 scripts/gpu/train_speculator.py --tokens .gpu-spec/tokens.npz --out DIR

`specd train speculator` (C, tools/train/) is the reference recipe and runs
anywhere; on a 2-core VM its target forward limits it to well under 1M
tokens of data a day. This script is the same recipe with PyTorch on a GPU,
so that the data can be 4M tokens:

  target     the GGUF (Q4_1 + Q8_0 blocks) dequantized to fp32 and run as
             llama.cpp's LLaMA graph: RMSNorm, RoPE on adjacent pairs (the
             GGUF's q/k rows are permuted for that), GQA, SwiGLU, tied
             embeddings. Matmuls in TF32 on the GPU (--exact: fp32), so the
             states are the target's within its own int8-activation noise.
  stage 1    the token stream of speculator_tokens.py cut into windows of
             --seq-len, each one prefill; every position keeps the final-norm
             hidden state (spec_data.h's alignment: hidden[j] predicts
             token j+1).
  prompts    with --self-prompts N, the target also writes N prompts of its
             own: self_prompts.py's requests (everyday questions, small
             programs, word problems), each sampled at --self-temperature,
             the answers cleaned, deduplicated, any held-out prompt of
             bench/eval-prompts.jsonl dropped, and rendered as user
             messages; they join the templated prompts (the first --prompts)
             and are the held-out rows of stage 2 (written to
             self_prompts.jsonl in --out).
  stage 2    every prompt continued GREEDILY by the target (the server's
             default mode) for up to --gen-len tokens, many prompts side by
             side; rows are [last prompt token, generated...] with the
             states, ending at the end-of-turn token (kept), as
             spec_data_generate keeps them.
  training   tools/train/spec_model.c's model and loss exactly (stage i reads
             the true token t+i+1 and predicts t+i+2; sum over heads of the
             mean cross-entropy; draft vocabulary = the 8191 most frequent
             tokens of both sets + one 'other' bucket, ties to the lower id),
             AdamW (0.9, 0.95), weight decay on matrices, warm-up + cosine,
             clip 1.0; stage 1 then stage 2 at a lower rate. The last
             --holdout windows and prompts are never trained on: their top-1
             per head is printed.
  export     config.json + model.safetensors in the MLPSpeculator format
             draft-svc loads (fp16, speculator.vocab_map), plus
             stage2_tokens.npz (the greedy continuations, for checks).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

EOS = 2            # <|im_end|>: SmolLM2-Instruct's end of turn (and EOS)
NORM_EPS = 1e-6    # the speculator's norms (common/model/mlp_speculator.c)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- the target ---------------------------------------------------------------

class Target:
    """SmolLM2 from its GGUF, fp32 weights on `device`."""

    def __init__(self, path, device):
        from gguf import GGUFReader
        from gguf.quants import dequantize
        r = GGUFReader(path)

        def field(k):
            return r.fields[k].contents()
        self.dim = int(field("llama.embedding_length"))
        self.n_layers = int(field("llama.block_count"))
        self.n_heads = int(field("llama.attention.head_count"))
        self.n_kv = int(field("llama.attention.head_count_kv"))
        self.head_dim = self.dim // self.n_heads
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.base = float(field("llama.rope.freq_base"))
        W = {}
        for t in r.tensors:
            a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
            W[t.name] = torch.from_numpy(a.copy()).to(device)
        self.emb = W["token_embd.weight"]                       # [V, D], also the LM head
        self.vocab = self.emb.shape[0]
        self.out_norm = W["output_norm.weight"]
        self.layers = []
        for i in range(self.n_layers):
            p = f"blk.{i}."
            self.layers.append(dict(
                an=W[p + "attn_norm.weight"], fn=W[p + "ffn_norm.weight"],
                qkv=torch.cat([W[p + "attn_q.weight"], W[p + "attn_k.weight"],
                               W[p + "attn_v.weight"]]),
                o=W[p + "attn_output.weight"],
                gu=torch.cat([W[p + "ffn_gate.weight"], W[p + "ffn_up.weight"]]),
                down=W[p + "ffn_down.weight"]))
        half = self.head_dim // 2
        self.inv_freq = (self.base ** (-torch.arange(half, dtype=torch.float64) * 2 / self.head_dim)
                         ).to(device)

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def rope_table(self, pos):
        """cos, sin [B, 1, T, hd/2] for positions pos [B, T]; angles in
        float64 so long positions keep their digits."""
        ang = (pos.to(torch.float64)[..., None] * self.inv_freq)[:, None]
        return ang.cos().float(), ang.sin().float()

    @staticmethod
    def rope(x, cos, sin):
        """Rotates pairs (2i, 2i+1) of x [B, H, T, hd]: llama.cpp's NORM mode."""
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)

    def forward(self, tokens, pos, mask, cache=None, slot=0):
        """tokens, pos [B, T]; mask [B, 1, T, S] bool (True = may attend) over
        the cache slots [0, S) after this call writes slots [slot, slot+T);
        cache None = no cache (S = T). Returns the final-norm hidden [B,T,D]."""
        B, T = tokens.shape
        H, KV, hd = self.n_heads, self.n_kv, self.head_dim
        x = self.emb[tokens]
        cos, sin = self.rope_table(pos)
        for li, L in enumerate(self.layers):
            h = self.rmsnorm(x, L["an"]) @ L["qkv"].T
            q = h[..., :H * hd].view(B, T, H, hd).transpose(1, 2)
            k = h[..., H * hd:(H + KV) * hd].view(B, T, KV, hd).transpose(1, 2)
            v = h[..., (H + KV) * hd:].view(B, T, KV, hd).transpose(1, 2)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            if cache is not None:
                kc, vc = cache[li]
                kc[:, :, slot:slot + T] = k
                vc[:, :, slot:slot + T] = v
                S = mask.shape[-1]
                k, v = kc[:, :, :S], vc[:, :, :S]
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(B, T, H * hd) @ L["o"].T
            g, u = (self.rmsnorm(x, L["fn"]) @ L["gu"].T).chunk(2, -1)
            x = x + (F.silu(g) * u) @ L["down"].T
        return self.rmsnorm(x, self.out_norm)

    def logits(self, hidden):
        return hidden @ self.emb.T


@torch.no_grad()
def encode_windows(t, stream, seq_len, batch, device):
    """Stage 1: hidden states of every window of seq_len tokens."""
    n = len(stream) // seq_len
    toks = torch.from_numpy(stream[:n * seq_len].astype(np.int64)).view(n, seq_len)
    hidden = torch.empty(n, seq_len, t.dim, dtype=torch.float16, device=device)
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).tril()[None, None]
    for b0 in range(0, n, batch):
        tk = toks[b0:b0 + batch].to(device)
        pos = torch.arange(seq_len, device=device).expand(tk.shape[0], -1)
        hidden[b0:b0 + batch] = t.forward(tk, pos, causal).half()
    return toks.to(device), torch.full((n,), seq_len, device=device), hidden


@torch.no_grad()
def generate(t, prompts, gen_len, batch, device, sampled=None, temperature=0.7, top_k=50, seed=42):
    """Stage 2: greedy continuations (prompt i sampled at `temperature`,
    top-k, where sampled[i]: the mix for a speculator meant for the
    sampling mode). prompts: list of int arrays. Rows are
    [last prompt token, generated ..., EOS if reached] with their states
    (the state of a row's final token is left zero: no example starts
    there). Prompts run in batches of similar length, left-padded."""
    L = gen_len + 1
    n = len(prompts)
    toks = torch.zeros(n, L, dtype=torch.int64, device=device)
    lens = torch.zeros(n, dtype=torch.int64, device=device)
    hidden = torch.zeros(n, L, t.dim, dtype=torch.float16, device=device)
    order = sorted(range(n), key=lambda i: len(prompts[i]))
    hd, KV = t.head_dim, t.n_kv
    steps = 0
    for b0 in range(0, n, batch):
        idx = order[b0:b0 + batch]
        B = len(idx)
        P = max(len(prompts[i]) for i in idx)
        S = P + gen_len
        pad = torch.tensor([P - len(prompts[i]) for i in idx], device=device)
        tk = torch.full((B, P), EOS, dtype=torch.int64)
        for r, i in enumerate(idx):
            tk[r, P - len(prompts[i]):] = torch.from_numpy(prompts[i].astype(np.int64))
        tk = tk.to(device)
        ar = torch.arange(P, device=device)
        pos = (ar[None] - pad[:, None]).clamp(min=0)
        valid = torch.zeros(B, S, dtype=torch.bool, device=device)
        valid[:, :P] = ar[None] >= pad[:, None]
        # causal over real keys; a pad query sees itself, so no row is all
        # masked (an all-masked row gives NaN, and NaN * 0 poisons others)
        m = (torch.ones(P, P, dtype=torch.bool, device=device).tril()[None] & valid[:, None, :P]) \
            | torch.eye(P, dtype=torch.bool, device=device)[None]
        cache = [(torch.empty(B, KV, S, hd, device=device), torch.empty(B, KV, S, hd, device=device))
                 for _ in t.layers]
        h = t.forward(tk, pos, m[:, None], cache, 0)[:, -1]
        rows = torch.tensor(idx, device=device)
        toks[rows, 0] = tk[:, -1]
        hidden[rows, 0] = h.half()
        cur = torch.zeros(B, dtype=torch.int64, device=device)   # tokens generated
        done = torch.zeros(B, dtype=torch.bool, device=device)
        npos = P - pad
        samp = None if sampled is None else torch.from_numpy(sampled[idx]).to(device)
        gen = torch.Generator(device=device).manual_seed(seed + b0)
        for s in range(gen_len):
            lg = t.logits(h)
            nxt = lg.argmax(-1)
            if samp is not None and bool(samp.any()):
                v, ix = (lg[samp] / temperature).topk(top_k, -1)
                pick = torch.multinomial(v.softmax(-1), 1, generator=gen)[:, 0]
                nxt[samp] = ix.gather(1, pick[:, None])[:, 0]
            live = ~done
            cur = cur + live
            toks[rows[live], cur[live]] = nxt[live]
            done = done | (nxt == EOS)
            if bool(done.all()) or s == gen_len - 1:
                break
            valid[:, P + s] = True
            h = t.forward(nxt[:, None], npos[:, None], valid[:, None, None, :P + s + 1], cache,
                          P + s)[:, 0]
            npos = npos + 1
            hidden[rows[~done], cur[~done]] = h[~done].half()
            steps += 1
        lens[rows] = cur + 1
        log(f"  stage 2: {min(b0 + batch, n)}/{n} prompts, {int(lens.sum())} tokens")
    return toks, lens, hidden, steps


def write_prompts(t, z, a, device):
    """--self-prompts: the target's own prompts (see the top of the file).
    Returns (prompt id arrays, [(text, kind)])."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import self_prompts
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    offs, ids, kinds = z["request_offsets"], z["request_ids"], z["request_kind"]
    names = [str(k) for k in z["kind_names"]]
    reqs = [ids[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]
    order = [i % len(reqs) for i in range(a.self_prompts)]
    toks, lens, _, _ = generate(t, [reqs[i] for i in order], a.self_len, a.gen_batch, device,
                                np.ones(len(order), dtype=bool), a.self_temperature,
                                a.self_top_k, a.seed + 7)
    toks, lens = toks.cpu().numpy(), lens.cpu().numpy()
    seen = self_prompts.held_out_keys(a.eval_prompts)
    held = len(seen)
    pre, post = z["wrap_prefix"].astype(np.int64), z["wrap_suffix"].astype(np.int64)
    out, texts, unfinished, rejected, dup = [], [], 0, 0, 0
    for r, i in enumerate(order):
        row = toks[r, 1:lens[r]]
        if row.size == 0 or row[-1] != EOS:
            unfinished += 1
            continue
        text = self_prompts.clean(tok.decode(row[:-1].tolist()))
        if text is None:
            rejected += 1
            continue
        if not self_prompts.fresh(text, seen):
            dup += 1
            continue
        body = np.asarray(tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        out.append(np.concatenate([pre, body, post])[-384:])
        texts.append((text, names[kinds[i]]))
    log(f"written prompts: {len(out)} of {len(order)} answers kept ({unfinished} unfinished, "
        f"{rejected} rejected by clean(), {dup} duplicates of each other or of the {held} "
        f"held-out prompts); by kind " + ", ".join(
            f"{n} {sum(1 for _, k in texts if k == n)}" for n in names))
    return out, texts


# ---- the speculator (tools/train/spec_model.c) ---------------------------------

class Speculator(torch.nn.Module):
    def __init__(self, emb_dim, inner, vocab, n_predict, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        def normal(*shape, fan):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) / math.sqrt(fan))
        self.n_predict, self.inner, self.emb_dim = n_predict, inner, emb_dim
        self.emb = normal(vocab, inner, fan=inner)
        self.proj0 = normal(inner, emb_dim, fan=emb_dim)
        self.proj1 = normal(inner, inner, fan=inner)
        self.head = normal(vocab, inner, fan=inner)
        self.ln_w = torch.nn.Parameter(torch.ones(inner))
        self.ln_b = torch.nn.Parameter(torch.zeros(inner))
        sw = 0.5 ** (0.5 / n_predict)                       # IBM's state_weight
        ew = math.sqrt((1 - sw * sw) * (inner / 2))          # and emb_weight
        self.k_emb = ew / sw

    def forward(self, hidden, toks):
        """hidden [N, E] fp32; toks [N, n_predict+1] draft ids. Returns the
        per-head losses and top-1 hit counts."""
        s = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + NORM_EPS) / math.sqrt(2)
        losses, hits = [], []
        for i in range(self.n_predict):
            u = s @ (self.proj0 if i == 0 else self.proj1).T + self.k_emb * self.emb[toks[:, i]]
            v = self.ln_w * (u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + NORM_EPS)) + self.ln_b
            s = F.gelu(v)
            logits = s @ self.head.T
            losses.append(F.cross_entropy(logits.float(), toks[:, i + 1]))
            hits.append((logits.argmax(-1) == toks[:, i + 1]).sum())
        return losses, hits


def examples(lens, seq_len, n_predict, device):
    """(row, pos) of every position with n_predict+1 tokens after it."""
    j = torch.arange(seq_len, device=device)
    ok = j[None] + n_predict + 1 < lens[:, None]
    r, c = ok.nonzero(as_tuple=True)
    return r, c


def gather(toks, hidden, r, c, n_predict, t2d):
    h = hidden[r, c].float()
    off = torch.arange(1, n_predict + 2, device=toks.device)
    tk = t2d[toks[r[:, None], c[:, None] + off[None]]]
    return h, tk


def train_stage(model, opt, data, steps, batch, lr, warmup, min_ratio, n_predict, t2d, seed, label,
                eval_sets, best):
    """One stage: warm-up then cosine to min_ratio * lr; batches drawn
    uniformly over the stage's examples by a generator seeded per stage.
    Every 100 steps the held-out top-1 is measured; `best` keeps the
    parameters with the highest sum over heads on the set best["on"]."""
    toks, lens, hidden, r, c = data
    n = r.numel()
    g = torch.Generator(device=toks.device).manual_seed(seed)
    for step in range(steps):
        if step < warmup:
            f = (step + 1) / warmup
        else:
            p = (step - warmup) / max(1, steps - warmup)
            f = min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * p))
        for grp in opt.param_groups:
            grp["lr"] = lr * f
        pick = torch.randint(0, n, (batch,), device=toks.device, generator=g)
        h, tk = gather(toks, hidden, r[pick], c[pick], n_predict, t2d)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=toks.is_cuda):
            losses, hits = model(h, tk)
        loss = sum(losses)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 99 or step == steps - 1:
            acc = " ".join(f"{int(x) / batch:.3f}" for x in hits)
            msg = f"{label} step {step + 1}/{steps} loss {float(loss.detach()):.3f} top1 {acc}"
            for name, ev in eval_sets.items():
                acc = evaluate(model, ev, n_predict, t2d)
                msg += f" | held-out {name} " + " ".join(f"{a:.3f}" for a in acc)
                if name == best["on"] and sum(acc) > best["score"]:
                    best.update(score=sum(acc), where=f"{label} step {step + 1}",
                                state={k: v.detach().clone() for k, v in model.state_dict().items()})
            log(msg)


@torch.no_grad()
def evaluate(model, ev, n_predict, t2d):
    toks, hidden, r, c = ev
    tot = [0] * n_predict
    for b0 in range(0, r.numel(), 16384):
        h, tk = gather(toks, hidden, r[b0:b0 + 16384], c[b0:b0 + 16384], n_predict, t2d)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=toks.is_cuda):
            _, hits = model(h, tk)
        tot = [a + int(b) for a, b in zip(tot, hits)]
    return [x / max(1, r.numel()) for x in tot]


def export(model, vocab_map, target_vocab, top_k, out):
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    cfg = {"architectures": ["MLPSpeculatorPreTrainedModel"], "model_type": "mlp_speculator",
           "vocab_size": int(vocab_map.numel()), "emb_dim": model.emb_dim, "inner_dim": model.inner,
           "n_predict": model.n_predict, "top_k_tokens_per_head": top_k, "n_candidates": top_k[0],
           "tie_weights": True, "scale_input": True, "torch_dtype": "float16",
           "target_vocab_size": target_vocab}
    with open(f"{out}/config.json", "w") as f:
        json.dump(cfg, f, indent="\t")
    t = {"speculator.emb.0.weight": model.emb, "speculator.head.0.weight": model.head,
         "speculator.ln.0.bias": model.ln_b, "speculator.ln.0.weight": model.ln_w,
         "speculator.proj.0.weight": model.proj0, "speculator.proj.1.weight": model.proj1}
    t = {k: v.detach().half().cpu().contiguous() for k, v in t.items()}
    t["speculator.vocab_map"] = vocab_map.to(torch.int32).cpu().contiguous()
    save_file(t, f"{out}/model.safetensors")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--tokens", required=True, help="speculator_tokens.py output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--stage1-tokens", type=int, default=0, help="0 = the whole stream")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--encode-batch", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=0, help="0 = all")
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=1024)
    ap.add_argument("--sampled-frac", type=float, default=0.0,
                    help="fraction of the prompts continued sampled (default 0: all greedy)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-k", type=int, default=50)
    ap.add_argument("--self-prompts", type=int, default=0,
                    help="answers to sample for prompts the target writes itself (0 = none)")
    ap.add_argument("--self-len", type=int, default=64, help="tokens a written prompt may take")
    ap.add_argument("--self-temperature", type=float, default=0.8)
    ap.add_argument("--self-top-k", type=int, default=50)
    ap.add_argument("--tokenizer", default="tests/golden/tokenizer/smollm2_tokenizer.json")
    ap.add_argument("--eval-prompts", default="bench/eval-prompts.jsonl",
                    help="held-out prompts that no written prompt may equal")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--inner", type=int, default=512)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--steps1", type=int, default=600)
    ap.add_argument("--steps2", type=int, default=900)
    ap.add_argument("--batch", type=int, default=16384, help="positions per step")
    ap.add_argument("--lr1", type=float, default=2e-3)
    ap.add_argument("--lr2", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--holdout", type=int, default=64, help="windows and prompts never trained on")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--exact", action="store_true", help="fp32 matmuls (no TF32) in the target")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.backends.cuda.matmul.allow_tf32 = not a.exact
    torch.backends.cudnn.allow_tf32 = not a.exact
    t0 = time.time()
    if dev.type == "cuda":
        log(f"device {torch.cuda.get_device_name(dev)}, torch {torch.__version__}")

    t = Target(a.gguf, dev)
    log(f"target: {t.n_layers} layers, dim {t.dim}, vocab {t.vocab} ({time.time() - t0:.1f} s)")
    z = np.load(a.tokens)
    stream = z["stream"]
    if a.stage1_tokens:
        stream = stream[:a.stage1_tokens]
    offs, pids = z["prompt_offsets"], z["prompt_ids"]   # each z[...] decompresses anew
    prompts = [pids[offs[i]:offs[i + 1]] for i in range(len(offs) - 1)]
    if a.prompts:
        prompts = prompts[:a.prompts]

    t1 = time.time()
    s1 = encode_windows(t, stream, a.seq_len, a.encode_batch, dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    n1 = s1[0].numel()
    log(f"stage 1: {s1[0].shape[0]} windows, {n1} tokens in {time.time() - t1:.1f} s "
        f"({n1 / (time.time() - t1):.0f} tok/s)")
    os.makedirs(a.out, exist_ok=True)
    if a.self_prompts:
        t2 = time.time()
        written, texts = write_prompts(t, z, a, dev)
        prompts += written
        with open(f"{a.out}/self_prompts.jsonl", "w", encoding="utf-8") as f:
            for text, kind in texts:
                f.write(json.dumps({"prompt": text, "kind": kind}) + "\n")
        log(f"written prompts in {time.time() - t2:.1f} s")
    t2 = time.time()
    sampled = np.random.default_rng(a.seed).random(len(prompts)) < a.sampled_frac \
        if a.sampled_frac > 0 else None
    s2toks, s2lens, s2hid, steps = generate(t, prompts, a.gen_len, a.gen_batch, dev, sampled,
                                            a.temperature, a.top_k, a.seed)
    n2 = int(s2lens.sum())
    log(f"stage 2: {len(prompts)} prompts, {n2} tokens (mean {n2 / len(prompts):.0f} a row, "
        f"{int((s2toks == EOS).any(1).sum())} ended at EOS) in {time.time() - t2:.1f} s "
        f"({n2 / (time.time() - t2):.0f} tok/s, {steps} decode steps)")
    np.savez_compressed(f"{a.out}/stage2_tokens.npz", tokens=s2toks.cpu().numpy().astype(np.uint16),
                        lens=s2lens.cpu().numpy().astype(np.int32))

    # the draft vocabulary: most frequent tokens of both sets (ties to the lower id) + 'other'
    V = t.vocab
    cnt = torch.bincount(s1[0].flatten(), minlength=V)
    m2 = torch.arange(s2toks.shape[1], device=dev)[None] < s2lens[:, None]
    cnt += torch.bincount(s2toks[m2], minlength=V)
    cnt_np = cnt.cpu().numpy()
    order = np.lexsort((np.arange(V), -cnt_np)).tolist()   # by count, ties to the lower id
    keep = a.draft_vocab - 1
    vocab_map = torch.tensor(order[:keep] + [-1], dtype=torch.int64)
    cover = float(cnt[vocab_map[:keep].to(dev)].sum()) / float(cnt.sum())
    t2d = torch.full((V,), keep, dtype=torch.int64, device=dev)
    t2d[vocab_map[:keep].to(dev)] = torch.arange(keep, device=dev)
    log(f"draft vocabulary: {keep} tokens + other, {100 * cover:.2f}% of the data's tokens")

    P = a.heads
    def split(toks, lens, hid, hold):
        n = toks.shape[0]
        tr = examples(lens[:n - hold], toks.shape[1], P, dev)
        ho = examples(lens[n - hold:], toks.shape[1], P, dev)
        return (toks, lens, hid, *tr), (toks, hid, ho[0] + (n - hold), ho[1])
    d1, e1 = split(*s1, a.holdout)
    d2, e2 = split(s2toks, s2lens, s2hid, a.holdout)
    log(f"examples: stage 1 {d1[3].numel()} (held out {e1[2].numel()}), "
        f"stage 2 {d2[3].numel()} (held out {e2[2].numel()})")

    model = Speculator(t.dim, a.inner, a.draft_vocab, P, a.seed).to(dev)
    del t
    decay = [model.emb, model.proj0, model.proj1, model.head]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": [model.ln_w, model.ln_b], "weight_decay": 0.0}],
                            lr=a.lr1, betas=(0.9, 0.95))
    evs = {"text": e1, "greedy": e2}
    best = {"on": "greedy", "score": -1.0, "state": None, "where": ""}
    t3 = time.time()
    train_stage(model, opt, d1, a.steps1, a.batch, a.lr1, a.warmup, 0.1, P, t2d, a.seed,
                "stage 1", evs, best)
    train_stage(model, opt, d2, a.steps2, a.batch, a.lr2, a.warmup, 0.1, P, t2d, a.seed + 1,
                "stage 2", evs, best)
    log(f"training: {a.steps1 + a.steps2} steps of {a.batch} positions in {time.time() - t3:.1f} s; "
        f"exporting the best held-out greedy top-1 ({best['where']})")
    model.load_state_dict(best["state"])
    top_k = [5, 4, 3, 2][:P] + [2] * max(0, P - 4)
    export(model, vocab_map, V, top_k, a.out)
    for name, ev in evs.items():
        acc = evaluate(model, ev, P, t2d)
        log(f"FINAL held-out top-1 {name}: " + " ".join(f"head{i + 1} {100 * x:.1f}%"
                                                       for i, x in enumerate(acc)))
    log(f"wrote {a.out} in {time.time() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
