#!/usr/bin/env python3
"""speculator_tokens.py - the speculator's training text as token ids, small
enough to travel to a GPU machine with one device command (docs/TRAINING.md,
the GPU recipe).

    python3 scripts/gpu/speculator_tokens.py DATA_DIR OUT.npz

DATA_DIR holds corpus.jsonl and prompts.jsonl (scripts/fetch_train_data.sh;
SPECD_TRAIN_PROMPTS_PER_KIND=6000 for the GPU recipe). Tokenization is the
one tools/train/spec_data.c does with specd's own tokenizer:

  stream    every "text" document of corpus.jsonl, in file order, each
            followed by EOS (stage 1 cuts it into windows);
  prompts   every prompt rendered through the model's chat template (one
            user message, generation prompt added: specd_chat_render), cut
            to its last 384 tokens as the trainer does;
  requests  self_prompts.py's requests, rendered the same way, with which
            the target writes prompts of its own (--self-prompts), and
            the template's ids before and after a user message
            (wrap_prefix, wrap_suffix) to render what it writes.

It uses Hugging Face's `tokenizers` on the tokenizer file that
tests/golden/ checks specd's tokenizer against, and jinja2 on the chat
template stored in the GGUF, so the ids are the ones specd would make.
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import self_prompts  # noqa: E402

TOKENIZER = "tests/golden/tokenizer/smollm2_tokenizer.json"
GGUF = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
EOS = 2
MAX_PROMPT = 384


def chat_template():
    from gguf import GGUFReader
    return GGUFReader(GGUF).fields["tokenizer.chat_template"].contents()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    data_dir, out = sys.argv[1:]
    import jinja2
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(TOKENIZER)
    tmpl = jinja2.Environment().from_string(chat_template())

    stream = []
    with open(f"{data_dir}/corpus.jsonl", encoding="utf-8") as f:
        docs = [json.loads(line) for line in f]
    texts = [d["text"] for d in docs if "text" in d]
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        stream.extend(enc.ids)
        stream.append(EOS)

    prompts, kinds = [], []
    with open(f"{data_dir}/prompts.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            prompts.append(tmpl.render(messages=[{"role": "user", "content": d["prompt"]}],
                                       add_generation_prompt=True))
            kinds.append(d.get("kind", ""))
    ids = [e.ids[-MAX_PROMPT:] for e in tok.encode_batch(prompts, add_special_tokens=False)]
    offsets = np.cumsum([0] + [len(x) for x in ids]).astype(np.int64)
    kind_names = sorted(set(kinds))

    reqs = self_prompts.requests()
    rtext = [tmpl.render(messages=[{"role": "user", "content": t}], add_generation_prompt=True)
             for t, _ in reqs]
    rids = [e.ids for e in tok.encode_batch(rtext, add_special_tokens=False)]
    roffs = np.cumsum([0] + [len(x) for x in rids]).astype(np.int64)
    mark = "\u0001MESSAGE\u0001"
    pre, post = tmpl.render(messages=[{"role": "user", "content": mark}],
                            add_generation_prompt=True).split(mark)
    wrap_pre = tok.encode(pre, add_special_tokens=False).ids
    wrap_post = tok.encode(post, add_special_tokens=False).ids
    np.savez_compressed(
        out,
        stream=np.asarray(stream, dtype=np.uint16),
        prompt_ids=np.asarray([t for x in ids for t in x], dtype=np.uint16),
        prompt_offsets=offsets,
        prompt_kind=np.asarray([kind_names.index(k) for k in kinds], dtype=np.uint8),
        kind_names=np.asarray(kind_names),
        request_ids=np.asarray([t for x in rids for t in x], dtype=np.uint16),
        request_offsets=roffs,
        request_kind=np.asarray([kind_names.index(k) for _, k in reqs], dtype=np.uint8),
        wrap_prefix=np.asarray(wrap_pre, dtype=np.uint16),
        wrap_suffix=np.asarray(wrap_post, dtype=np.uint16))
    print(f"speculator_tokens: {len(stream)} stream tokens from {len(texts)} documents; "
          f"{len(ids)} prompts ({offsets[-1]} tokens, mean {offsets[-1] / len(ids):.0f}); "
          f"{len(rids)} requests for written prompts; wrap {len(wrap_pre)} + {len(wrap_post)} "
          f"tokens -> {out}")


if __name__ == "__main__":
    main()
