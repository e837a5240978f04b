"""prompts_math.py - arithmetic and word problems from templates.

Grade-school problems in the GSM8K style, but generated here from a fixed
seed, so they are ours to use. Every template draws its numbers so that the
answer is a whole number (or a simple decimal for money), as such problems
are usually posed; the answer itself is not needed, since the target model
writes its own.
"""
from rng import Rng

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal",
         "Kira", "Liam", "Maya", "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara",
         "Umar", "Vera", "Wei", "Yusuf", "Zoe"]
ITEMS = [("apple", "apples"), ("pencil", "pencils"), ("cookie", "cookies"), ("book", "books"),
         ("marble", "marbles"), ("sticker", "stickers"), ("egg", "eggs"), ("card", "cards"),
         ("balloon", "balloons"), ("shell", "shells"), ("stamp", "stamps"), ("coin", "coins")]
# (plural, lowest and highest unit price in dollars)
SHOP = [("notebooks", 2, 6), ("sandwiches", 4, 9), ("tickets", 8, 25), ("T-shirts", 9, 20),
        ("bags of rice", 3, 12), ("plants", 5, 15), ("toy cars", 3, 11), ("cups of coffee", 2, 5)]
# (singular, lowest and highest price in tens of dollars)
PRICEY = [("jacket", 4, 12), ("pair of shoes", 3, 15), ("lamp", 2, 8), ("backpack", 2, 9),
          ("bicycle", 12, 60), ("video game", 2, 7), ("watch", 5, 30), ("phone", 15, 90)]
CONTAINERS = [("box", "boxes", "in"), ("bag", "bags", "in"), ("crate", "crates", "in"),
              ("basket", "baskets", "in"), ("shelf", "shelves", "on"), ("row", "rows", "in")]
RATIOS = [(1, 2), (2, 3), (3, 4), (3, 5), (1, 3), (2, 5), (4, 5), (5, 3), (3, 2), (2, 1), (5, 7)]
VEHICLES = ["a train", "a car", "a bus", "a cyclist", "a boat", "a truck"]


def _t_add(r):
    a, b = r.int(12, 9999), r.int(12, 9999)
    return r.choice(["What is {a} + {b}?", "Calculate {a} plus {b}.", "Add {a} and {b}."]).format(a=a, b=b)


def _t_sub(r):
    a = r.int(100, 9999)
    b = r.int(10, a - 1)
    return r.choice(["What is {a} - {b}?", "Subtract {b} from {a}.", "Compute {a} minus {b}."]).format(a=a, b=b)


def _t_mul(r):
    a, b = r.int(3, 99), r.int(3, 999)
    return r.choice(["What is {a} times {b}?", "Multiply {a} by {b}.", "Compute {a} x {b}."]).format(a=a, b=b)


def _t_div(r):
    b, q = r.int(2, 25), r.int(3, 400)
    return r.choice(["What is {a} divided by {b}?", "Divide {a} by {b}.", "Compute {a} / {b}."]).format(a=b * q, b=b)


def _t_order_ops(r):
    a, b, c, d = r.int(2, 30), r.int(2, 12), r.int(2, 12), r.int(1, 50)
    e = r.choice(["{a} + {b} * {c} - {d}", "({a} + {b}) * {c} - {d}", "{a} * {b} - {c} * {d}",
                  "{a} + {b} * ({c} + {d})"]).format(a=a, b=b, c=c, d=d)
    return r.choice(["Evaluate {e}.", "What is the value of {e}?", "Compute {e} step by step."]).format(e=e)


def _t_percent(r):
    p, n = r.choice([5, 10, 15, 20, 25, 30, 40, 50, 75]), r.int(2, 80) * 20
    return r.choice(["What is {p}% of {n}?", "Find {p} percent of {n}.",
                     "Calculate {p}% of {n}."]).format(p=p, n=n)


def _t_discount(r):
    name, (item, lo, hi) = r.choice(NAMES), r.choice(PRICEY)
    price, p = r.int(lo, hi) * 10, r.choice([10, 20, 25, 30, 50])
    return (f"A {item} costs ${price}. It is on sale for {p}% off. "
            f"How much does {name} pay for it?")


def _t_shopping(r):
    name = r.choice(NAMES)
    (i1, lo1, hi1), (i2, lo2, hi2) = r.sample(SHOP, 2)
    n1, n2 = r.int(2, 6), r.int(2, 6)
    p1, p2 = r.int(lo1, hi1), r.int(lo2, hi2)
    pay = ((n1 * p1 + n2 * p2) // 10 + 1 + r.int(0, 3)) * 10
    return (f"{name} buys {n1} {i1} at ${p1} each and {n2} {i2} at ${p2} each, "
            f"and pays with ${pay}. How much change does {name} get?")


def _t_share(r):
    name, (one, many) = r.choice(NAMES), r.choice(ITEMS)
    k = r.int(2, 9)
    n = k * r.int(3, 20)
    return (f"{name} has {n} {many} and shares them equally among {k} friends. "
            f"How many {many} does each friend get?")


def _t_give_get(r):
    a, b = r.sample(NAMES, 2)
    _, many = r.choice(ITEMS)
    start, give, get = r.int(20, 90), r.int(3, 19), r.int(2, 30)
    return (f"{a} has {start} {many}. {a} gives {give} to {b} and then finds {get} more. "
            f"How many {many} does {a} have now?")


def _t_containers(r):
    (c1, cs, prep), (_, many) = r.choice(CONTAINERS), r.choice(ITEMS)
    n, per, extra = r.int(3, 24), r.int(4, 36), r.int(0, 15)
    tail = f" and {extra} loose {many}" if extra else ""
    return f"There are {n} {cs} with {per} {many} {prep} each {c1}{tail}. How many {many} are there in total?"


def _t_speed(r):
    v, h = r.choice(VEHICLES), r.int(2, 9)
    speed = r.int(4, 24) * 5
    return r.choice([
        f"{v.capitalize()} travels at {speed} km per hour for {h} hours. How far does it go?",
        f"{v.capitalize()} covers {speed * h} km in {h} hours. What is its average speed?",
        f"How long does it take {v} moving at {speed} km/h to travel {speed * h} km?"])


def _t_rect(r):
    w, h = r.int(2, 60), r.int(2, 60)
    what = r.choice(["garden", "room", "field", "poster", "table top", "parking lot"])
    return r.choice([f"A rectangular {what} is {w} m long and {h} m wide. What is its area?",
                     f"What is the perimeter of a rectangular {what} measuring {w} m by {h} m?",
                     f"A rectangle has an area of {w * h} square cm and a width of {w} cm. How long is it?"])


def _t_average(r):
    k = r.int(3, 6)
    xs = [r.int(40, 100) for _ in range(k)]
    s = ", ".join(map(str, xs))
    return r.choice([f"What is the average of {s}?", f"Find the mean of these numbers: {s}.",
                     f"{r.choice(NAMES)} scored {s} on {k} tests. What is the average score?"])


def _t_linear(r):
    a, x, b = r.int(2, 12), r.int(-20, 30), r.int(-40, 40)
    sign = "+" if b >= 0 else "-"
    return r.choice(["Solve for x: {a}x {s} {b} = {c}.", "Find x if {a}x {s} {b} = {c}.",
                     "What value of x makes {a}x {s} {b} equal to {c}?"]).format(
        a=a, s=sign, b=abs(b), c=a * x + b)


def _t_fraction(r):
    d = r.choice([2, 3, 4, 5, 6, 8, 10])
    n = r.int(1, d - 1)
    total = d * r.int(2, 30)
    _, many = r.choice(ITEMS)
    return r.choice([f"What is {n}/{d} of {total}?",
                     f"A jar holds {total} {many}. {n}/{d} of them are red. How many are not red?"])


def _t_fraction_add(r):
    a, b, c, d = r.int(1, 9), r.int(2, 12), r.int(1, 9), r.int(2, 12)
    return r.choice(["What is {a}/{b} + {c}/{d}? Simplify the result.",
                     "Compute {a}/{b} - {c}/{d}.", "Multiply {a}/{b} by {c}/{d}."]).format(a=a, b=b, c=c, d=d)


def _t_ages(r):
    a, b = r.sample(NAMES, 2)
    age, diff, yrs = r.int(5, 40), r.int(2, 30), r.int(2, 15)
    return r.choice([f"{a} is {age} years old. {b} is {diff} years older. How old will {b} be in {yrs} years?",
                     f"{a} is {age} years old and {b} is {age + diff}. How many years ago was {b} exactly twice as old as {a}?"
                     if age > diff else f"{a} is {age} years old. How old was {a} {yrs} years ago?"])


def _t_time(r):
    h, m, dur = r.int(6, 20), r.choice([0, 10, 15, 20, 30, 45, 50]), r.int(20, 300)
    return (f"A movie starts at {h}:{m:02d} and lasts {dur} minutes. "
            f"At what time does it end?")


def _t_wage(r):
    name, wage, hours, days = r.choice(NAMES), r.int(9, 40), r.int(2, 9), r.int(2, 6)
    return f"{name} earns ${wage} per hour and works {hours} hours a day for {days} days. How much does {name} earn?"


def _t_units(r):
    return r.choice([f"How many centimeters are in {r.int(2, 90)} meters?",
                     f"Convert {r.int(2, 60) * 60} minutes to hours.",
                     f"How many grams are in {r.int(2, 25)}.{r.int(1, 9)} kilograms?",
                     f"How many seconds are there in {r.int(2, 12)} hours?",
                     f"Convert {r.int(2, 40) * 1000} meters to kilometers."])


def _t_powers(r):
    return r.choice([f"What is {r.int(2, 15)} squared?", f"What is {r.int(2, 9)} cubed?",
                     f"What is the square root of {r.int(2, 30) ** 2}?",
                     f"What is 2 to the power of {r.int(3, 16)}?"])


def _t_number_theory(r):
    a, b = r.int(4, 120), r.int(4, 120)
    return r.choice([f"What is the greatest common divisor of {a} and {b}?",
                     f"Find the least common multiple of {a} and {b}.",
                     f"Is {r.int(20, 500)} a prime number? Explain why.",
                     f"List all the factors of {r.int(12, 100)}.",
                     f"What is the remainder when {r.int(100, 999)} is divided by {r.int(3, 13)}?"])


def _t_sequence(r):
    a, d, k = r.int(1, 20), r.int(2, 9), r.int(6, 30)
    seq = ", ".join(str(a + i * d) for i in range(4))
    return r.choice([f"What is the next number in the sequence {seq}, ...?",
                     f"What is the {k}th term of the sequence {seq}, ...?",
                     f"Find the sum of the first {k} terms of {seq}, ..."])


def _t_ratio(r):
    (a, b), k = r.choice(RATIOS), r.int(2, 15)
    x, y = r.choice([("boys", "girls"), ("red cars", "blue cars"), ("cats", "dogs"), ("flour", "sugar (in cups)")])
    return f"The ratio of {x} to {y} is {a}:{b}. If there are {(a + b) * k} in total, how many {x} are there?"


def _t_interest(r):
    p, rate, yrs = r.int(1, 50) * 100, r.choice([2, 3, 4, 5, 6, 8, 10]), r.int(1, 6)
    return r.choice([f"How much simple interest does ${p} earn at {rate}% per year over {yrs} years?",
                     f"${p} is invested at {rate}% interest compounded yearly. How much is it worth after {yrs} years?"])


def _t_probability(r):
    red, blue, green = r.int(1, 12), r.int(1, 12), r.int(0, 8)
    return r.choice([f"A bag has {red} red, {blue} blue and {green} green marbles. What is the probability of drawing a blue one?",
                     f"If you roll two dice, what is the probability that the sum is {r.int(2, 12)}?",
                     f"A coin is flipped {r.int(2, 5)} times. What is the probability of getting heads every time?"])


def _t_word_two_step(r):
    name = r.choice(NAMES)
    pages, per_day, read = r.int(120, 600), r.int(10, 40), r.int(2, 6)
    return (f"{name}'s book has {pages} pages. {name} reads {per_day} pages a day for {read} days. "
            f"How many pages are left?")


TEMPLATES = [_t_add, _t_sub, _t_mul, _t_div, _t_order_ops, _t_percent, _t_discount, _t_shopping,
             _t_share, _t_give_get, _t_containers, _t_speed, _t_rect, _t_average, _t_linear,
             _t_fraction, _t_fraction_add, _t_ages, _t_time, _t_wage, _t_units, _t_powers,
             _t_number_theory, _t_sequence, _t_ratio, _t_interest, _t_probability,
             _t_word_two_step]

# Some prompts ask for the working, as users do; it also makes the target
# write the longer step-by-step answers that math chat consists of.
SUFFIXES = ["", "", "", " Show your work.", " Explain your reasoning step by step.",
            " Give only the final answer."]


def math_prompts(n, seed, accept):
    """n distinct prompts for which accept(prompt) holds."""
    r = Rng(seed)
    seen, out = set(), []
    while len(out) < n:
        p = TEMPLATES[len(out) % len(TEMPLATES)](r)
        suffix = r.choice(SUFFIXES)
        if "xplain" not in p and "step" not in p:  # no contradictory asks
            p += suffix
        if p not in seen and accept(p):
            seen.add(p)
            out.append(p)
    return out  # the templates already take turns
