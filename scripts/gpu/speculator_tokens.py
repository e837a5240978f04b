#!/usr/bin/env python3
"""speculator_tokens.py - the speculator's training text as token ids, small
enough to travel to a GPU machine with one device command (README
"Training", the GPU recipe).

    python3 scripts/gpu/speculator_tokens.py DATA_DIR OUT.npz

DATA_DIR holds corpus.jsonl and prompts.jsonl (scripts/fetch_train_data.sh;
SPECD_TRAIN_PROMPTS_PER_KIND=6000 for the GPU recipe). Tokenization is the
one tools/train/spec_data.c does with specd's own tokenizer:

  stream    every "text" document of corpus.jsonl, in file order, each
            followed by EOS (stage 1 cuts it into windows);
  prompts   every prompt rendered through the model's chat template (one
            user message, generation prompt added: specd_chat_render), cut
            to its last 384 tokens as the trainer does.

It uses Hugging Face's `tokenizers` on the tokenizer file that
tests/golden/ checks specd's tokenizer against, and jinja2 on the chat
template stored in the GGUF, so the ids are the ones specd would make.
"""
import json
import sys

import numpy as np

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
    np.savez_compressed(
        out,
        stream=np.asarray(stream, dtype=np.uint16),
        prompt_ids=np.asarray([t for x in ids for t in x], dtype=np.uint16),
        prompt_offsets=offsets,
        prompt_kind=np.asarray([kind_names.index(k) for k in kinds], dtype=np.uint8),
        kind_names=np.asarray(kind_names))
    print(f"speculator_tokens: {len(stream)} stream tokens from {len(texts)} documents; "
          f"{len(ids)} prompts ({offsets[-1]} tokens, mean {offsets[-1] / len(ids):.0f}) -> {out}")


if __name__ == "__main__":
    main()
