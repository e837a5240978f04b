#!/usr/bin/env python3
"""llamacpp_bench.py - llama.cpp's own speed on the same GGUF and thread count, as specd's yardstick.

Runs llama.cpp (through llama-cpp-python's low-level C API bindings, so the timings are llama.cpp's
own llama_perf_context counters) on models/SmolLM2-135M-Instruct.Q4_1.gguf:

  prefill: one llama_decode of a ~128-token ChatML prompt (one batch)   -> prompt tok/s
  decode:  128 greedy tokens, one llama_decode per token, no EOS stop     -> generation tok/s

One untimed warm-up run first, then --runs measured runs (KV cache cleared in between); the table shows
the median and the best of llama.cpp's counters, plus our own wall clock around the same calls.

Setup (compiles llama.cpp from source, 20-40 minutes on 2 busy cores; it builds with -march=native,
so the numbers are for the machine it was built on):
    pip install llama-cpp-python
On CPUs that advertise AMX but where the VM does not enable it (this dev VM: Sapphire Rapids flags,
yet `tileloadd` raises SIGILL as soon as a quantized matmul has more than one row), build without AMX:
    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' \
      -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'" \
      pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python
The table also says how much CPU other processes took while it measured: on a shared 2-core machine
llama.cpp's OpenMP threads spin, so any other load hurts it badly; compare only quiet runs.
Run:
    python3 bench/llamacpp_bench.py [--threads 2] [--model PATH] [--prompt-tokens 128]
                                    [--gen-tokens 128] [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
_LOG_CB = None

PROMPT_TEXT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nI am planning a week-long trip through the mountains in early autumn. I will be "
    "hiking every day, staying in small huts at night, and carrying everything on my back. The weather "
    "can change quickly: sunny mornings, cold rain in the afternoon, and sometimes snow above two "
    "thousand meters. I have never done a multi-day hike before. Please write me a detailed packing list "
    "grouped by category (clothing, sleeping, cooking, navigation, first aid, food), explain why each "
    "item matters, and tell me which items I could leave at home to save weight if my pack gets too "
    "heavy. Also give me some advice on how to train during the month before the trip.<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def die(msg: str) -> None:
    print(msg, file=sys.stderr)
    sys.exit(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    try:
        import llama_cpp as L
    except ImportError:
        die("llama_cpp is not installed: pip install llama-cpp-python")
    if not Path(args.model).exists():
        die(f"{args.model}: not found (run the setup script first)")

    L.llama_backend_init()
    # keep a reference: llama.cpp calls this pointer for the whole run
    global _LOG_CB
    _LOG_CB = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(_LOG_CB, ctypes.c_void_p())
    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = L.llama_model_load_from_file(args.model.encode(), mparams)
    if not model:
        die(f"{args.model}: llama.cpp could not load it")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)

    cparams = L.llama_context_default_params()
    cparams.n_ctx = args.ctx
    cparams.n_batch = max(512, args.prompt_tokens)
    cparams.n_ubatch = max(512, args.prompt_tokens)
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    cparams.no_perf = False
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        die("llama.cpp could not create a context")

    # Prompt: the ChatML text tokenized by llama.cpp, cut or repeated to exactly --prompt-tokens.
    text = PROMPT_TEXT.encode()
    buf = (L.llama_token * 4096)()
    n = L.llama_tokenize(vocab, text, len(text), buf, 4096, False, True)
    if n <= 0:
        die("tokenization failed")
    ids = list(buf[:n])
    while len(ids) < args.prompt_tokens:
        ids += ids[: args.prompt_tokens - len(ids)]
    ids = ids[: args.prompt_tokens]
    if args.prompt_tokens + args.gen_tokens > args.ctx:
        die("--prompt-tokens + --gen-tokens exceed --ctx")

    def argmax_last() -> int:
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        return int(logits.argmax())

    def one_run(n_gen: int) -> dict:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        L.llama_perf_context_reset(ctx)
        arr = (L.llama_token * len(ids))(*ids)
        t0 = time.perf_counter()
        if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(ids))) != 0:
            die("llama_decode (prefill) failed")
        L.llama_synchronize(ctx)
        t1 = time.perf_counter()
        tok = argmax_last()
        out = [tok]
        t_dec = 0.0
        for _ in range(n_gen - 1 if n_gen > 0 else 0):
            one = (L.llama_token * 1)(tok)
            ta = time.perf_counter()
            if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
                die("llama_decode (decode) failed")
            L.llama_synchronize(ctx)
            t_dec += time.perf_counter() - ta
            tok = argmax_last()  # greedy; EOS does not stop the run
            out.append(tok)
        perf = L.llama_perf_context(ctx)
        return {
            "prefill_tokens": perf.n_p_eval, "prefill_ms": perf.t_p_eval_ms,
            "decode_tokens": perf.n_eval, "decode_ms": perf.t_eval_ms,
            "wall_prefill_ms": (t1 - t0) * 1e3, "wall_decode_ms": t_dec * 1e3,
            "tokens": out,
        }

    one_run(16)  # warm-up: page in the weights, spin up the thread pool
    j0, t0 = cpu_jiffies(), os.times()
    runs = [one_run(args.gen_tokens) for _ in range(args.runs)]
    j1, t1 = cpu_jiffies(), os.times()
    # CPU time other processes used while we measured, as a share of the machine
    other = None
    if j0 and j1 and j1[1] > j0[1]:
        hz = os.sysconf("SC_CLK_TCK")
        ours = ((t1.user - t0.user) + (t1.system - t0.system)) * hz
        other = max(0.0, (j1[0] - j0[0]) - ours) / (j1[1] - j0[1])

    def rate(tok_key: str, ms_key: str) -> list[float]:
        return [r[tok_key] / (r[ms_key] / 1e3) for r in runs if r[ms_key] > 0]

    pre = rate("prefill_tokens", "prefill_ms")
    dec = rate("decode_tokens", "decode_ms")
    wpre = [len(ids) / (r["wall_prefill_ms"] / 1e3) for r in runs]
    wdec = [(args.gen_tokens - 1) / (r["wall_decode_ms"] / 1e3) for r in runs]
    sysinfo = L.llama_print_system_info().decode().strip()

    print(f"llama.cpp (llama-cpp-python {L.__version__}) on {Path(args.model).name}")
    print(f"threads {args.threads}, n_ctx {args.ctx}, prompt {len(ids)} tokens, decode {args.gen_tokens} "
          f"tokens greedy, {args.runs} runs after 1 warm-up")
    print(f"system: {sysinfo}")
    if other is not None:
        print(f"other processes used {100 * other:.0f}% of the {os.cpu_count()} CPUs during the runs"
              + ("  (WARNING: not an idle machine; numbers are pessimistic)" if other > 0.05 else ""))
    print()
    print(f"{'phase':<10} {'tokens':>7} {'median tok/s':>13} {'best tok/s':>11} {'wall median tok/s':>18}")
    print(f"{'prefill':<10} {runs[0]['prefill_tokens']:>7} {statistics.median(pre):>13.1f} {max(pre):>11.1f} "
          f"{statistics.median(wpre):>18.1f}")
    print(f"{'decode':<10} {runs[0]['decode_tokens']:>7} {statistics.median(dec):>13.1f} {max(dec):>11.1f} "
          f"{statistics.median(wdec):>18.1f}")
    print()
    print("tok/s columns 2-3: llama.cpp's own llama_perf_context counters (t_p_eval / t_eval);")
    print("wall: Python perf_counter around the same llama_decode calls (includes binding overhead).")

    if args.json:
        Path(args.json).write_text(json.dumps({
            "engine": "llama.cpp", "llama_cpp_python": L.__version__, "model": str(args.model),
            "threads": args.threads, "n_ctx": args.ctx, "prompt_tokens": len(ids),
            "gen_tokens": args.gen_tokens, "system_info": sysinfo, "other_cpu_share": other,
            "prefill_tok_s": {"median": statistics.median(pre), "best": max(pre)},
            "decode_tok_s": {"median": statistics.median(dec), "best": max(dec)},
            "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs],
            "greedy_tokens": runs[0]["tokens"],
        }, indent=1) + "\n")

    L.llama_free(ctx)
    L.llama_model_free(model)
    L.llama_backend_free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
