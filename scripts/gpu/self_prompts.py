"""self_prompts.py - requests that make the target write its own training
prompts (docs/TRAINING.md, the GPU recipe's --self-prompts).

The templated stage-2 prompts of scripts/train_data/ ask about the Python
and Debian documentation; the prompts people send a chat model are
everyday questions, small programs and word problems, and a speculator
trained on the first drafts worse on the second (held-out chat tau 1.47
against code 2.22 at one candidate, three heads). So the GPU recipe also
lets the target write prompts: each request below, rendered through the
chat template, is answered by the target sampled at temperature 0.8 (top-k
50), and each answer that ends at the end-of-turn token and passes
`clean()` becomes a user prompt that the target then continues greedily
like the others.

Every request is a template crossed with a topic, in a fixed order, so
speculator_tokens.py writes the same ids each time. No held-out prompt of
bench/eval-prompts.jsonl is used here; train_speculator.py drops any
written prompt that equals one (compared case- and space-insensitively).
"""

import json
import re

TOPICS = [
    "cooking", "baking bread", "coffee", "tea", "vegetarian meals", "breakfast", "desserts",
    "gardening", "houseplants", "composting", "birds", "dogs", "cats", "horses", "insects",
    "the ocean", "rivers", "mountains", "deserts", "forests", "volcanoes", "earthquakes",
    "the weather", "rain", "snow", "seasons", "the moon", "the sun", "planets", "stars",
    "space travel", "airplanes", "trains", "bicycles", "cars", "public transport", "road trips",
    "camping", "hiking", "swimming", "running", "football", "basketball", "tennis", "chess",
    "board games", "video games", "music", "the guitar", "the piano", "singing", "painting",
    "photography", "movies", "books", "poetry", "writing stories", "learning a language",
    "history", "ancient Egypt", "the Roman Empire", "inventions", "famous scientists",
    "electricity", "magnets", "light", "sound", "the human body", "sleep", "exercise",
    "healthy eating", "vitamins", "the common cold", "first aid", "stress", "friendship",
    "family", "birthdays", "weddings", "holidays", "gifts", "manners", "job interviews",
    "working from home", "saving money", "budgeting", "shopping", "cleaning the house",
    "moving to a new city", "apartments", "furniture", "recycling", "climate",
    "renewable energy", "computers", "smartphones", "the internet", "email", "passwords",
    "robots", "artificial intelligence", "math homework", "school", "teachers", "exams",
    "studying", "time management", "habits", "motivation", "public speaking", "kindness",
    "volunteering", "museums", "cities", "islands", "maps", "geography", "flags",
    "languages", "food from Italy", "food from Japan", "food from Mexico", "spices", "fruit",
    "vegetables", "chocolate", "pizza", "soup", "rainbows", "dinosaurs", "fossils", "whales",
    "sharks", "butterflies", "bees", "trees", "flowers", "pets", "zoos", "farms",
]

CODE_TOPICS = [
    "lists", "strings", "dictionaries", "sets", "tuples", "loops", "recursion", "sorting",
    "searching", "files", "dates and times", "random numbers", "prime numbers",
    "Fibonacci numbers", "factorials", "palindromes", "anagrams", "counting words",
    "reversing things", "matrices", "classes", "exceptions", "regular expressions", "JSON",
    "CSV files", "command-line arguments", "stacks", "queues", "linked lists", "binary search",
    "temperature conversion", "string formatting", "averages", "the maximum of a list",
    "removing duplicates", "vowels", "leap years", "GCD", "binary numbers", "generators",
]

LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Bash", "SQL"]

CHAT = [
    "Write one question that a curious person might ask an AI assistant about {t}. "
    "Reply with the question only.",
    "Write one request that someone might send to a helpful assistant about {t}: asking "
    "for advice, a list, a short poem, a story or an explanation. Reply with the request only.",
]
CODE = [
    "Write one short programming request that a user might ask an assistant, about {t}, "
    "in {lang}. Reply with the request only.",
    "Write one beginner question about {t} in {lang}. Reply with the question only.",
]
MATH = [
    "Write one short math word problem about {t} with small whole numbers. "
    "Reply with the problem only.",
    "Write one short arithmetic or algebra question a student might ask. It can mention "
    "{t}. Reply with the question only.",
]


def requests():
    """[(text, kind)] in a fixed order."""
    out = []
    for tmpl in CHAT:
        out += [(tmpl.format(t=t), "chat") for t in TOPICS]
    for i, tmpl in enumerate(CODE):
        out += [(tmpl.format(t=t, lang=LANGUAGES[(j + i) % len(LANGUAGES)]), "code")
                for j, t in enumerate(CODE_TOPICS * 2)]
    for tmpl in MATH:
        out += [(tmpl.format(t=t), "math") for t in TOPICS]
    return out


def clean(text):
    """A written prompt as a user would send it, or None. The target often
    wraps it ('A curious person might ask: "..."', a preamble, then the
    question in its own paragraph): the longest quoted span is taken if
    there is one, else the last paragraph; a short leading label ending in
    a colon is dropped. 12..400 characters, no chat markup."""
    s = text.strip()
    quoted = [q.strip() for q in re.findall(r'"([^"]{12,})"|\u201c([^\u201d]{12,})\u201d', s)
              for q in q if q]
    if quoted:
        s = max(quoted, key=len)
    else:
        paras = [p.strip() for p in s.split("\n\n") if p.strip()]
        if paras:
            s = paras[-1]
    m = re.match(r"^[^:\n]{0,60}:\s*", s)
    if m and re.search(r"(?i)ask|question|request|problem|prompt|here", m.group(0)):
        s = s[m.end():]
    s = s.strip().strip('"\'').strip()
    if not 12 <= len(s) <= 400 or "<|" in s:
        return None
    return s


def key(text):
    """The comparison key for duplicates and held-out prompts."""
    return " ".join(text.lower().split())


def held_out_keys(path):
    """key() of every prompt of a JSONL file (bench/eval-prompts.jsonl)."""
    with open(path, encoding="utf-8") as f:
        return {key(json.loads(line)["prompt"]) for line in f if line.strip()}


def fresh(text, seen):
    """True, and text's key added to `seen`, unless `seen` (the held-out
    prompts and those kept so far) already holds it."""
    k = key(text)
    if k in seen:
        return False
    seen.add(k)
    return True
