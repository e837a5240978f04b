"""prompts_chat.py - conversational prompts: questions about the fetched
documentation, paragraphs to summarize or rewrite, word questions, and
everyday requests from templates.

Only the prompts are built here; the target model answers them itself
(stage-2 data), so the prompts need to be what users ask, not what a
dataset's answers need.
"""
import re
from collections import Counter

from rng import Rng

TITLE_TEMPLATES = [
    "Explain what \"{t}\" means in Python.",
    "What is {t} in Python? Explain briefly.",
    "Give me a short overview of {t} in Python.",
    "I'm new to Python. Can you explain {t} with a simple example?",
    "What should a beginner know about {t}?",
    "Write a short tutorial section about {t} in Python.",
]
PARAGRAPH_TEMPLATES = [
    "Summarize this paragraph in one sentence:\n\n{p}",
    "Summarize this paragraph:\n\n{p}",
    "Rewrite this paragraph in simpler words:\n\n{p}",
    "What is the main point of the following text?\n\n{p}",
    "Explain this to someone who is not a computer expert:\n\n{p}",
    "Write three bullet points that capture this text:\n\n{p}",
    "Give this paragraph a short title:\n\n{p}",
]
WORD_TEMPLATES = [
    "What does the word \"{w}\" mean?",
    "Use the word \"{w}\" in a sentence.",
    "Give two synonyms for \"{w}\".",
    "Write a short sentence for a child that uses the word \"{w}\".",
    "What is the opposite of \"{w}\"?",
    "Define \"{w}\" and give an example.",
]

# Everyday requests: template x topic. The lists are ours (written for this
# file), so the prompts carry no third-party text.
GENERAL = [
    ("Write a short poem about {x}.", ["the ocean at night", "a rainy Monday", "autumn leaves",
     "a lost umbrella", "city lights", "an old bicycle", "the first snow", "a quiet library",
     "a cup of tea", "the moon", "a mountain lake", "a lighthouse", "spring flowers"]),
    ("Give me three tips for {x}.", ["staying focused while studying", "sleeping better",
     "learning a new language", "saving money on groceries", "running a first 5k",
     "keeping houseplants alive", "writing a cover letter", "public speaking", "cooking rice",
     "organizing a small kitchen", "starting to meditate", "traveling with a toddler",
     "making new friends in a new city", "preparing for a job interview"]),
    ("Write a short story about {x}.", ["a robot who learns to paint", "a cat who runs a bakery",
     "a girl who finds a map in a library book", "two friends lost in a forest",
     "a dragon who is afraid of the dark", "a detective who solves crimes by smell",
     "a village where it never stops raining", "a clock that runs backwards",
     "an astronaut who misses her dog", "a boy who can talk to birds"]),
    ("What are the pros and cons of {x}?", ["working from home", "electric cars",
     "living in a big city", "online classes", "owning a dog", "renting versus buying a home",
     "social media for teenagers", "a four-day work week", "solar panels", "public transport"]),
    ("Write a polite email to {x}.", ["my landlord about a broken heater",
     "a teacher asking for an extension", "a colleague to reschedule a meeting",
     "a customer apologizing for a late delivery", "my neighbor about a noisy party",
     "a hotel asking for a late checkout", "my manager asking for a day off"]),
    ("Explain {x} in simple terms.", ["how vaccines work", "why the sky is blue",
     "how a rainbow forms", "what inflation is", "how the internet works", "what DNA is",
     "how airplanes stay in the air", "why we have seasons", "what a black hole is",
     "how batteries store energy", "what photosynthesis is", "how a bill becomes a law"]),
    ("Plan a {x}.", ["three-day trip to the mountains", "birthday party for a seven-year-old",
     "weekly vegetarian dinner menu", "study schedule for a final exam",
     "beginner workout week", "picnic for six people", "small wedding on a budget"]),
    ("Give me some ideas for {x}.", ["a rainy weekend at home", "a science fair project",
     "a gift for my grandmother", "a team-building activity", "a blog about gardening",
     "healthy snacks for work", "a name for a coffee shop", "a school fundraiser"]),
    ("How do I {x}?", ["make a good first impression", "stop procrastinating",
     "change a flat bike tire", "bake bread without yeast", "write a good thank-you note",
     "take care of a cactus", "remove a coffee stain", "start journaling", "tie a tie",
     "calm down before an exam"]),
    ("What is the difference between {x}?", ["weather and climate", "a virus and bacteria",
     "a crocodile and an alligator", "speed and velocity", "a simile and a metaphor",
     "baking soda and baking powder", "a lake and a pond", "empathy and sympathy"]),
    ("Can you recommend {x}?", ["a good book for a long flight", "a hobby I can do at home",
     "a simple breakfast that keeps me full", "a way to learn to draw", "a houseplant for a dark room",
     "a board game for two players", "a podcast topic for beginners in history",
     "an easy dessert for a dinner party", "a stretching routine for office workers"]),
    ("Write a short description of {x} for a travel brochure.", ["a seaside village",
     "a mountain cabin", "an old castle", "a busy night market", "a quiet island",
     "a desert oasis", "a lakeside campsite"]),
    ("Why do {x}?", ["we dream", "cats like boxes", "people yawn", "stars twinkle",
     "birds migrate", "bread go stale", "we get goosebumps", "ice cubes crack in a drink",
     "some people like spicy food", "boats float"]),
    ("Tell me {x}.", ["a fun fact about octopuses", "a joke about computers",
     "something interesting about ancient Egypt", "why cats purr",
     "a short history of the bicycle", "how honey is made", "about the planet Mars"]),
    ("Write a {x}.", ["product description for a reusable water bottle",
     "short speech for a friend's wedding", "limerick about a sleepy cat",
     "motivational message for a team", "review of a fictional restaurant",
     "riddle about time", "thank-you card for a nurse", "tweet announcing a bake sale"]),
]

STOPWORDS = set("""about above after again against their there these those which while where
would could should other being having because before below between through during under
until very more most some such only same than then them they what when with your yours
into from have this that were been also each just over both does doing will shall""".split())


def _clean_title(t):
    t = re.sub(r"^[\d.]+\s+", "", t).strip()           # "4.2. Title"
    t = re.sub(r"\s+---?\s+.*$", "", t)                  # "`json` --- JSON encoder"
    return t.strip()


def faq_questions(sections):
    out = []
    for rel, titles in sections:
        if rel.startswith("faq/"):
            for t in titles:
                t = t.strip()
                if t.endswith("?") and 15 <= len(t) <= 140:
                    out.append(t)
    return sorted(set(out))


def doc_titles(sections):
    out = []
    for rel, titles in sections:
        if not rel.startswith(("tutorial/", "howto/", "reference/", "library/", "using/")):
            continue
        for t in titles:
            t = _clean_title(t)
            words = t.split()
            # short noun phrases only: long titles are sentences, odd ones are API names
            if 2 <= len(words) <= 6 and not t.endswith("?") and re.fullmatch(r"[\w `'\-,.()/]+", t) \
                    and not t.lower().startswith(("example", "notes", "see also", "footnotes")):
                out.append(t)
    return sorted(set(out))


def prose_paragraphs(texts):
    """Plain prose paragraphs of 250-700 characters from the corpus."""
    out = []
    for text in texts:
        in_code = False
        for block in re.split(r"\n\s*\n", text):
            if block.lstrip().startswith("```"):
                in_code = not block.rstrip().endswith("```") or block.strip() == "```"
                continue
            if in_code or block.startswith((" ", "\t", "#", "*", "-", "..", ">>>")):
                continue
            p = " ".join(ln.strip() for ln in block.splitlines())
            if not 250 <= len(p) <= 700 or not p.endswith(".") or not p[0].isupper():
                continue
            # mostly words: no tables, option lists or code-heavy lines
            if sum(c.isalpha() or c == " " for c in p) < 0.9 * len(p) or "::" in p:
                continue
            out.append(p)
    return sorted(set(out))


def common_words(prose_texts, dictionary):
    """Dictionary words that occur often in our prose, most frequent first:
    the word list alone has no frequencies and is full of rare words."""
    counts = Counter(w for t in prose_texts for w in re.findall(r"\b[a-z]{5,12}\b", t))
    return [w for w, c in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))
            if w in dictionary and w not in STOPWORDS and c >= 5]


def chat_prompts(n, seed, sections, prose_texts, dictionary, accept):
    """n prompts for which accept(prompt) holds, in fixed shares per source."""
    r = Rng(seed)
    faq = r.shuffle(faq_questions(sections))
    titles = r.shuffle(doc_titles(sections))
    paras = r.shuffle(prose_paragraphs(prose_texts))
    words = r.shuffle(common_words(prose_texts, dictionary)[:3000])
    general = [tpl.format(x=x) for tpl, xs in GENERAL for x in xs]
    # the share of each source, in order (the rest is filled by paragraphs)
    plan = [
        ([q for q in faq], n * 15 // 100),
        ([r.choice(TITLE_TEMPLATES).format(t=t) for t in titles], n * 22 // 100),
        ([r.choice(WORD_TEMPLATES).format(w=w) for w in words], n * 16 // 100),
        (r.shuffle(general), n * 20 // 100),
        ([r.choice(PARAGRAPH_TEMPLATES).format(p=p) for p in paras], n),
    ]
    out, seen = [], set()
    for items, quota in plan:
        took = 0
        for p in items:
            if took >= quota or len(out) >= n:
                break
            if p not in seen and accept(p):
                seen.add(p)
                out.append(p)
                took += 1
    return r.shuffle(out)  # the sources mixed, for any prefix
