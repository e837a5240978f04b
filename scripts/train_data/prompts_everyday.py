"""prompts_everyday.py - everyday chat requests for fine-tuning the speculator.

The stage-2 chat prompts of build.py come mostly from the fetched Python and
Debian documentation (FAQ questions, section titles, paragraphs to
summarize); its hand-written everyday requests are 294 in all. A speculator
trained on them drafts well for those, but a user's chat is mostly everyday
questions and requests: on bench/eval-prompts.jsonl the shipped speculator's
first drafted token was accepted 25% of the time for chat, against 46-49%
for training-distribution chat prompts it had not seen (`specd eval --ks 1
--heads 1`). This file makes many more of them, template x topic, both
lists written for this file (no third-party text), deterministic.

Usage: python3 prompts_everyday.py OUT.jsonl N [--replay FILE K] [--eval FILE]
  writes N everyday chat prompts, plus K prompts of each kind (chat, code,
  math) taken in order from FILE (build.py's prompts.jsonl) so that a
  fine-tune keeps what the speculator drafts well, all shuffled together;
  prompts equal to one of --eval's (ignoring case and whitespace) are left
  out.
"""
import json
import sys

from rng import Rng

# (template, the topic kinds it takes)
TEMPLATES = [
    ("Explain {t} in simple terms.", "thing"),
    ("Can you explain {t} to a ten-year-old?", "thing"),
    ("What should I know about {t}?", "thing"),
    ("Tell me three interesting facts about {t}.", "thing"),
    ("Write a short paragraph about {t}.", "thing"),
    ("What are the main benefits of {t}?", "thing"),
    ("Give me a brief history of {t}.", "thing"),
    ("Write a haiku about {t}.", "thing"),
    ("Write a four-line poem about {t}.", "thing"),
    ("Describe {t} in two sentences.", "thing"),
    ("What is a common misconception about {t}?", "thing"),
    ("Write a short story that involves {t}.", "thing"),
    ("I'm curious about {t}. Where should I start?", "thing"),
    ("Summarize what most people get wrong about {t}.", "thing"),
    ("How do I get better at {a}?", "activity"),
    ("Give me five tips for {a}.", "activity"),
    ("What is the best way to start {a}?", "activity"),
    ("I want to try {a}. What do I need?", "activity"),
    ("What mistakes do beginners make when {a}?", "activity"),
    ("Make a one-week plan for {a}.", "activity"),
    ("Why is {a} good for you?", "activity"),
    ("How much time should I spend on {a} each week?", "activity"),
    ("Write a motivational message for someone who is {a}.", "activity"),
    ("I feel {f}. What can I do?", "feeling"),
    ("My friend feels {f}. How can I help?", "feeling"),
    ("Write a short note to cheer up someone who feels {f}.", "feeling"),
    ("Why do people sometimes feel {f}?", "feeling"),
    ("Write a polite message to {p} about {s}.", "message"),
    ("Help me write a text to {p} about {s}.", "message"),
    ("Compare {x} and {y}.", "pair"),
    ("Which is better, {x} or {y}? Explain.", "pair"),
    ("What is the difference between {x} and {y}?", "pair"),
    ("Should I choose {x} or {y}?", "pair"),
]

THINGS = [
    "volcanoes", "the Roman Empire", "honeybees", "coral reefs", "the moon landing",
    "electric guitars", "sourdough bread", "the water cycle", "earthquakes", "penguins",
    "the printing press", "chess", "solar eclipses", "recycling", "the human heart",
    "tea ceremonies", "the Great Wall of China", "octopuses", "hot air balloons",
    "the stock market", "wind turbines", "dinosaurs", "the Olympic Games", "rainforests",
    "sleep", "coffee", "the northern lights", "submarines", "jazz music", "origami",
    "the pyramids of Giza", "vaccines", "black holes", "tides", "lightning", "glaciers",
    "the immune system", "photosynthesis", "compound interest", "credit scores",
    "renewable energy", "the French Revolution", "ancient Greece", "the Silk Road",
    "whales", "mushrooms", "the Amazon river", "deserts", "the periodic table",
    "gravity", "magnets", "the internet", "smartphones", "artificial intelligence",
    "public libraries", "national parks", "bicycles", "trains", "lighthouses",
    "castles", "pirates", "the Vikings", "the Renaissance", "impressionist painting",
    "classical music", "hip hop", "board games", "video games", "movies from the 1950s",
    "fairy tales", "mythology", "the solar system", "Mars", "Saturn's rings",
    "comets", "the ocean floor", "sharks", "elephants", "wolves", "owls", "butterflies",
    "ants", "spiders", "frogs", "houseplants", "cacti", "bonsai trees", "tulips",
    "the seasons", "rain", "snowflakes", "rainbows", "clouds", "fog", "hurricanes",
    "the Sahara", "the Arctic", "islands", "mountains", "rivers", "caves", "waterfalls",
    "bread", "cheese", "chocolate", "pizza", "sushi", "spices", "vegetarian cooking",
    "breakfast", "soup", "street food", "olive oil", "honey", "pasta", "rice",
    "the first computers", "the telephone", "electricity", "the steam engine",
    "airplanes", "rockets", "satellites", "clocks", "maps", "money", "banks",
    "taxes", "inflation", "supply and demand", "small businesses", "job interviews",
    "remote work", "time management", "habits", "memory", "dreams", "laughter",
    "friendship", "kindness", "gratitude", "patience", "curiosity", "creativity",
    "democracy", "elections", "human rights", "climate change", "air pollution",
    "plastic waste", "electric cars", "public transport", "cities", "villages",
    "architecture", "bridges", "skyscrapers", "museums", "zoos", "circuses", "theater",
    "poetry", "novels", "comic books", "photography", "sculpture", "dance", "opera",
    "the violin", "the piano", "drums", "languages", "sign language", "handwriting",
    "emoji", "birthdays", "weddings", "holidays", "New Year traditions", "festivals",
]

ACTIVITIES = [
    "running", "swimming", "cycling", "hiking", "yoga", "meditation", "journaling",
    "learning Spanish", "learning to draw", "playing the piano", "playing the guitar",
    "baking bread", "cooking at home", "gardening", "birdwatching", "photography",
    "knitting", "painting with watercolors", "writing poetry", "writing a novel",
    "public speaking", "saving money", "budgeting", "investing for beginners",
    "studying for exams", "reading more books", "waking up early", "eating healthier",
    "drinking more water", "lifting weights", "stretching", "dancing", "rock climbing",
    "camping", "traveling alone", "learning to code", "chess", "solving crossword puzzles",
    "keeping a clean house", "decluttering", "volunteering", "making new friends",
    "networking", "negotiating a salary", "managing stress", "sleeping better",
    "training a puppy", "caring for a cat", "raising chickens", "growing tomatoes",
]

FEELINGS = [
    "tired all the time", "nervous about a presentation", "lonely after moving",
    "bored at work", "overwhelmed by my to-do list", "stuck in my career",
    "anxious before exams", "unmotivated to exercise", "homesick", "stressed about money",
    "jealous of a friend", "sad after a breakup", "frustrated with a coworker",
    "afraid of flying", "restless on weekends", "unsure about my future",
]

PEOPLE = ["my boss", "a neighbor", "my teacher", "a customer", "my landlord", "a friend",
          "my team", "a new coworker", "my dentist", "a shop owner"]
SUBJECTS = ["a missed deadline", "a package that never arrived", "a noisy party",
            "a schedule change", "a broken window", "a late payment", "a thank-you",
            "a lost key", "a meeting next week", "a vacation request", "a refund"]

PAIRS = [
    ("cats", "dogs"), ("tea", "coffee"), ("books", "movies"), ("summer", "winter"),
    ("trains", "planes"), ("renting", "buying a home"), ("running", "swimming"),
    ("city life", "country life"), ("paper books", "e-readers"), ("gas stoves", "induction stoves"),
    ("a laptop", "a tablet"), ("saving", "investing"), ("the beach", "the mountains"),
    ("working from home", "working in an office"), ("cooking", "ordering takeout"),
    ("a weather forecast", "a climate model"), ("speed", "velocity"), ("a virus", "bacteria"),
    ("a lake", "a sea"), ("butter", "margarine"), ("jogging", "walking"), ("an apple", "an orange"),
]


def everyday(n, seed, accept):
    r = Rng(seed)
    out, seen = [], set()
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        tpl, kind = TEMPLATES[r.below(len(TEMPLATES))]
        if kind == "thing":
            p = tpl.format(t=THINGS[r.below(len(THINGS))])
        elif kind == "activity":
            p = tpl.format(a=ACTIVITIES[r.below(len(ACTIVITIES))])
        elif kind == "feeling":
            p = tpl.format(f=FEELINGS[r.below(len(FEELINGS))])
        elif kind == "message":
            p = tpl.format(p=PEOPLE[r.below(len(PEOPLE))], s=SUBJECTS[r.below(len(SUBJECTS))])
        else:
            x, y = PAIRS[r.below(len(PAIRS))]
            if r.below(2):
                x, y = y, x
            p = tpl.format(x=x, y=y)
        p = p[0].upper() + p[1:]
        if p not in seen and accept(p):
            seen.add(p)
            out.append(p)
    return out


def normalize(s):
    return " ".join(s.lower().split())


def main(argv):
    args = argv[1:]
    replay, k, eval_path = None, 0, None
    if "--replay" in args:
        i = args.index("--replay")
        replay, k = args[i + 1], int(args[i + 2])
        del args[i:i + 3]
    if "--eval" in args:
        i = args.index("--eval")
        eval_path = args[i + 1]
        del args[i:i + 2]
    out_path, n = args[0], int(args[1])
    banned = set()
    if eval_path:
        with open(eval_path, encoding="utf-8") as f:
            banned = {normalize(json.loads(line)["prompt"]) for line in f if line.strip()}

    def accept(p):
        return normalize(p) not in banned

    rows = [{"prompt": p, "kind": "chat"} for p in everyday(n, 20261127, accept)]
    if replay:
        taken = {"chat": 0, "code": 0, "math": 0}
        with open(replay, encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                kind = d.get("kind")
                if kind in taken and taken[kind] < k and accept(d["prompt"]):
                    taken[kind] += 1
                    rows.append({"prompt": d["prompt"], "kind": kind})
    rows = Rng(7).shuffle(rows)
    with open(out_path, "w", encoding="utf-8") as f:
        for d in rows:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    kinds = {}
    for d in rows:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    print(f"{out_path}: {len(rows)} prompts {kinds}")


if __name__ == "__main__":
    main(sys.argv)
