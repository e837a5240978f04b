#!/usr/bin/env python3
"""make_tokenizer_fixtures.py - reference data for specd's tokenizer tests.

Offline tool (needs the Python packages gguf, tokenizers and jinja2; CI does
not run it). From the SmolLM2-135M-Instruct GGUF it writes, next to itself:

  smollm2_tokenizer.json  the Hugging Face tokenizer.json for SmolLM2, rebuilt
                          from the GGUF metadata with the configuration of the
                          real SmolLM2-135M-Instruct tokenizer.json: BPE model,
                          pre_tokenizer Sequence[Digits(individual_digits),
                          ByteLevel(add_prefix_space=False, use_regex=True)],
                          ByteLevel decoder, the control tokens as special
                          added tokens.
  corpus.json             the test strings (JSON, so whitespace is exact).
  reference_ids.json      [{"text", "ids", "decoded", "text_hex", "decoded_hex"}]
                          from `tokenizers`: encode(text, add_special_tokens=False)
                          .ids and decode(ids, skip_special_tokens=False); the
                          _hex fields are the exact UTF-8 bytes (C's JSON
                          reader stops strings at U+0000).
  tiny_llama3_tokenizer.json / tiny_llama3_reference.json
                          a small BPE trained on the corpus with Llama 3's
                          configuration (Split with the Llama 3 regex,
                          ByteLevel without regex, ignore_merges, merges
                          written as "a b" strings) and its reference ids,
                          so the other pre-tokenizer path is checked too.
  tiny_llama3.gguf        the same tokenizer as GGUF metadata only (no
                          tensors), tokenizer.ggml.pre = "llama-bpe", as
                          llama.cpp's converter writes it.
  chat_fixtures.json      chat conversations rendered by jinja2 with the GGUF's
                          chat template (what transformers' apply_chat_template
                          does), plus a plain ChatML template.

Usage: python3 make_tokenizer_fixtures.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import json
import os
import random
import sys

import gguf
import jinja2
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers,
                        processors, trainers)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
DEFAULT_GGUF = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4


def gguf_field(reader, key):
    field = reader.fields[key]
    if field.types[0] == gguf.GGUFValueType.ARRAY:
        if field.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [int(field.parts[i][0]) for i in field.data]
    if field.types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]][0]


def build_tokenizer(gguf_path):
    reader = gguf.GGUFReader(gguf_path)
    tokens = gguf_field(reader, "tokenizer.ggml.tokens")
    types = gguf_field(reader, "tokenizer.ggml.token_type")
    merges = gguf_field(reader, "tokenizer.ggml.merges")
    template = gguf_field(reader, "tokenizer.chat_template")

    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ")) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types)
               if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)]
    tok.add_special_tokens(special)
    return tok, template


def hand_written():
    s = []
    # Empty and trivial.
    s += ["", " ", "a", "A", "\n", "\t", "Hello", "Hello world", "Hello, world!",
          "The quick brown fox jumps over the lazy dog.",
          "What is the capital of France?"]
    # Whitespace runs: spaces, tabs, newlines, mixed, leading, trailing.
    s += ["  ", "   ", "    leading spaces", "trailing spaces    ", "\n\n", "\n\n\n",
          "a\nb", "a\n\nb", "a\r\nb", "\r\n\r\n", "\t\tindent", "mixed \t \n \r\n end",
          "word  two   three    four", " \n ", "\t \t", "x \n", "x\n ", "  \n  x",
          "line1\nline2\n", "\n leading newline", "tab\tseparated\tvalues\n1\t2\t3",
          "a \u00a0 b", "nbsp\u00a0nbsp", "em\u2003space", "ideographic\u3000space",
          "nel\u0085x", "x\u0085 y", "ls\u2028ps\u2029end", "mongolian\u180evowel",
          "zw\u200bsp", "bom\ufeffbom", "ogham\u1680mark", "narrow\u202fnbsp",
          "math\u205fspace", "vt\x0bff\x0cend", "fs\x1cgs\x1drs\x1eus\x1fend",
          "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a",
          "  \u00a0  x", "a\u3000\u3000b", " \u0085 "]
    # Digits and numbers.
    s += ["0", "7", "42", "123", "1234", "12345678901234567890", "3.14159",
          "-273.15", "1,000,000", "1e-9", "0x1F", "2024-01-01", "12:30:45",
          "$100.00", "99%", "v1.2.3", "a1b2c3", "007", " 1 2 3 ", "10^6",
          "٠١٢٣٤٥٦٧٨٩", "१२३", "½ ¾ ⅓", "²³¹", "Ⅻ ⅻ", "①②③", "１２３"]
    # Contractions, all cases, straight and curly quotes.
    s += ["it's", "don't", "they're", "we've", "I'm", "you'll", "he'd",
          "IT'S", "DON'T", "THEY'RE", "WE'VE", "I'M", "YOU'LL", "HE'D",
          "It'S", "Don'T", "it’s", "don’t", "they’re", "'s", "'t", "''", "'",
          "rock 'n' roll", "'quoted'", "\"double\"", "“curly double”",
          "‘curly single’", "O'Neill's", "ſ's K's", "'ſ 'K", "it 's", "x'sy"]
    # Scripts.
    s += ["Привет, мир!", "Съешь же ещё этих мягких французских булок.",
          "Γειά σου Κόσμε", "Ἀλέξανδρος ὁ Μέγας", "你好，世界", "我爱自然语言处理。",
          "日本語のテキストです。", "カタカナとひらがな", "한국어 텍스트입니다", "안녕하세요",
          "مرحبا بالعالم", "السلام عليكم ورحمة الله", "שלום עולם", "עִבְרִית",
          "नमस्ते दुनिया", "हिन्दी भाषा", "สวัสดีชาวโลก", "ภาษาไทย",
          "Tiếng Việt có dấu", "Ελληνικά και English", "Ünïcödé", "naïve café résumé",
          "Ærøskøbing", "straße STRASSE", "İstanbul ıi", "ქართული", "Հայերեն",
          "ኢትዮጵያ", "ᚠᚢᚦᚨᚱᚲ", "𝕳𝖊𝖑𝖑𝖔", "𝒜𝒷𝒸", "Z͑ͫ̓ͪ̂ͫ̽͏̴̙̤̞͉͚̯̞̠͍a̴̵̜̰͔ͫ͗͢l̠ͨͧͩ͘g̴̻͈͍͔̹̑͗̎̅͛́ǫ̵̹̻̝̳͂̌̌͘",
          "e\u0301 vs \u00e9", "\u0301\u0302 leading combining", "ﬁ ligature",
          "Ｆｕｌｌｗｉｄｔｈ", "ｶﾀｶﾅ", "ⓐⓑⓒ", "mixed日本語and English",
          "Привет123мир", "عربي123", "中文，标点。！？"]
    # Emoji: plain, skin tones, ZWJ sequences, flags, keycaps.
    s += ["😀", "😀😃😄", "👍🏽", "👋🏿👋🏻", "👨‍👩‍👧‍👦", "👩‍💻", "🧑🏽‍🚀",
          "🏳️‍🌈", "🏴‍☠️", "🇺🇸🇬🇧🇯🇵", "🇩🇪 flag", "1️⃣ 2️⃣ #️⃣", "❤️", "☺︎",
          "I ❤️ NY", "emoji😀in😀text", " 🎉🎉 ", "🤖: beep", "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
          "👁️‍🗨️", "🫠🫡🫥", "⌚⌛⏰", "♠♥♦♣", "→←↑↓", "∑∫∂√∞≈≠", "™©®"]
    # Code.
    s += ["def foo(x):\n    return x * 2\n",
          "int main(void) {\n\treturn 0;\n}\n",
          "for (int i = 0; i < n; ++i) { sum += a[i]; }",
          "console.log(`Hello ${name}!`);",
          "fn main() { println!(\"{}\", 42); }",
          "SELECT * FROM users WHERE id = 1;",
          "<div class=\"x\">&amp;&lt;&gt;</div>",
          "{\"key\": [1, 2.5, null, true]}",
          "x = [i**2 for i in range(10) if i % 2 == 0]",
          "#include <stdio.h>\n#define MAX(a,b) ((a)>(b)?(a):(b))",
          "    if (a && b || !c) {\n        return;\n    }",
          "git commit -m 'fix: bug'", "ls -la | grep '.py$' > out.txt",
          "func (s *Server) Run() error {\n\treturn nil\n}",
          "public static void main(String[] args) {}",
          "let x: Vec<u8> = vec![0; 16];", "$ echo $HOME && cd ~/",
          "a==b!=c<=d>=e->f=>g::h", "/* comment */ // line comment",
          "\\n \\t \\\\ \\\"", "https://example.com/path?q=1&r=2#frag",
          "user@example.com", "C:\\Windows\\System32", "@decorator\nclass A:\n\tpass",
          "    \n    \n", "```python\nprint('hi')\n```", "$$E = mc^2$$",
          "\\frac{a}{b} + \\sqrt{x}"]
    # Special tokens inline.
    s += ["<|im_start|>", "<|im_end|>", "<|endoftext|>",
          "<|im_start|>user\nHi<|im_end|>\n",
          "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
          "text<|endoftext|>more", "<|im_start|><|im_end|>", " <|im_end|> ",
          "<|im_end|><|im_end|>", "<|im_start", "im_end|>", "<| im_start |>",
          "<|IM_START|>", "<<|im_start|>>", "<|endoftext|>\n\n<|endoftext|>",
          "<file_sep>a.py\n<filename>b", "<repo_name>x<gh_stars>10",
          "<jupyter_code>print(1)<jupyter_output>1", "<empty_output>",
          "<|im_start|>user\n日本語😀<|im_end|>"]
    # Invalid-looking and odd sequences (valid UTF-8 text; real invalid
    # bytes are tested in C since `tokenizers` only accepts valid strings).
    s += ["\ufffd", "\ufffd\ufffd", "\\xff\\xfe", "\x00", "a\x00b", "\x01\x02\x03\x7f",
          "\u0080\u0081\u009f", "\ue000 private use", "\U000f0000", "\U0010ffff",
          "\u00ad soft hyphen", "\u200d\u200c", "\u202e reversed \u202c",
          "Ā ā Ġ ġ", "ĠĠ", "Ċ", "Ã©", "Â", "ÿþ", "�", "\u0378", "\ufff0\ufffe\uffff"]
    # Long words and repetitions.
    s += ["supercalifragilisticexpialidocious", "antidisestablishmentarianism",
          "Pneumonoultramicroscopicsilicovolcanoconiosis", "a" * 100, "ab" * 80,
          "The" * 50, " " * 50, "\n" * 30, "!" * 40, "=" * 64, "-" * 80 + "\n",
          "😀" * 30, "日本" * 40, "1" * 60, "x" + " " * 20 + "y",
          "Donaudampfschifffahrtsgesellschaftskapitän", "ababababababababababab"]
    return s


def generated(rng):
    """Combinations and seeded random mixes so the corpus covers odd adjacency."""
    s = []
    words = ["the", "The", "THE", "hello", "world", "token", "日本", "мир",
             "😀", "123", "4.5", "it's", "x", "__init__", "a-b", "é"]
    seps = [" ", "  ", "\t", "\n", " \n", "\n\n", "", ", ", ". ", "\u00a0", "\u3000"]
    for w in words:
        for sep in seps[:6]:
            s.append(sep + w + sep + w + sep)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "éèêëàâäôöùûüçñßøåæœ",
        "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
        "αβγδεζηθικλμνξοπρστυφχψω",
        "的一是不了人我在有他这为之大来以个中上们",
        "あいうえおかきくけこアイウエオ",
        "가나다라마바사아자차카타파하",
        "ابتثجحخدذرزسشصضطظعغفقكلمنهوي",
        "אבגדהוזחטיכלמנסעפצקרשת",
        "कखगघङचछजझञटठडढणतथदधन",
        "กขคงจฉชซฌญฎฏฐ",
        "😀😂🥲👍🏽❤️🇫🇷👨‍👩‍👧🎉🔥✨",
        "\u00a0\u2003\u3000\u0085\u2028\u180e\u200b",
    ]
    for _ in range(200):
        n = rng.randint(1, 40)
        chosen = rng.sample(pools, rng.randint(1, 4))
        text = "".join(rng.choice(rng.choice(chosen)) for _ in range(n))
        s.append(text)
    return s


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def tiny_llama3(corpus, path):
    """A 1000-token BPE with Llama 3's pre-tokenizer, trained on the corpus."""
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin_of_text|>", "<|eot_id|>"])
    tok.train_from_iterator(corpus * 3, trainer=trainer)
    tok.add_tokens([AddedToken("plain_added", special=False, normalized=False)])
    data = json.loads(tok.to_str())
    data["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                               for m in data["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    return Tokenizer.from_file(path)


def tiny_llama3_gguf(tok_path, gguf_path):
    """Writes the tiny tokenizer the way convert_hf_to_gguf.py does for Llama 3."""
    data = json.load(open(tok_path, encoding="utf-8"))
    vocab = dict(data["model"]["vocab"])
    types = {}
    for a in data["added_tokens"]:
        vocab[a["content"]] = a["id"]
        types[a["id"]] = TOKEN_TYPE_CONTROL if a["special"] else TOKEN_TYPE_USER_DEFINED
    tokens = [None] * (max(vocab.values()) + 1)
    for text, i in vocab.items():
        tokens[i] = text
    w = gguf.GGUFWriter(gguf_path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([types.get(i, 1) for i in range(len(tokens))])
    w.add_token_merges(data["model"]["merges"])
    w.add_bos_token_id(vocab["<|begin_of_text|>"])
    w.add_eos_token_id(vocab["<|eot_id|>"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def chat_fixtures(template):
    plain_chatml = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
                    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
    conversations = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Tell me a joke.\nMake it short."}],
        [{"role": "assistant", "content": "I speak first."}],
        [{"role": "user", "content": ""}],
        [{"role": "user", "content": "日本語 😀 <b>bold</b> {{ not jinja }} {% raw %}"}],
        [{"role": "system", "content": ""}, {"role": "user", "content": "x"},
         {"role": "system", "content": "late system"}],
        [],
    ]
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as transformers does
    out = []
    for name, tmpl in (("smollm2", template), ("chatml", plain_chatml)):
        compiled = env.from_string(tmpl)
        for msgs in conversations:
            for gen in (False, True):
                out.append({"template_name": name, "template": tmpl, "messages": msgs,
                            "add_generation_prompt": gen,
                            "expected": compiled.render(messages=msgs, add_generation_prompt=gen)})
    return out


def reference(tok, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    decoded = tok.decode(ids, skip_special_tokens=False)
    return {"text": text, "ids": ids, "decoded": decoded,
            "text_hex": text.encode("utf-8").hex(), "decoded_hex": decoded.encode("utf-8").hex()}


def main():
    gguf_path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF
    tok, template = build_tokenizer(gguf_path)
    tok.save(os.path.join(HERE, "smollm2_tokenizer.json"))
    # Reload from disk so the references come from exactly what C reads.
    tok = Tokenizer.from_file(os.path.join(HERE, "smollm2_tokenizer.json"))

    corpus = hand_written() + generated(random.Random(20240601))
    seen = set()
    corpus = [t for t in corpus if not (t in seen or seen.add(t))]
    refs = []
    for text in corpus:
        refs.append(reference(tok, text))

    def dump(name, obj):
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
            f.write("\n")

    tiny = tiny_llama3(corpus, os.path.join(HERE, "tiny_llama3_tokenizer.json"))
    tiny_llama3_gguf(os.path.join(HERE, "tiny_llama3_tokenizer.json"),
                     os.path.join(HERE, "tiny_llama3.gguf"))
    tiny_texts = corpus + ["plain_added", "x plain_added y", "<|eot_id|>hi<|begin_of_text|>"]
    tiny_refs = []
    for text in tiny_texts:
        tiny_refs.append(reference(tiny, text))

    dump("corpus.json", corpus)
    dump("tiny_llama3_reference.json", tiny_refs)
    dump("reference_ids.json", refs)
    dump("chat_fixtures.json", chat_fixtures(template))
    print(f"{len(corpus)} corpus strings, {sum(len(r['ids']) for r in refs)} reference ids")


if __name__ == "__main__":
    main()
