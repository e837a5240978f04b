"""prompts_code.py - programming prompts: write-a-function requests built
from real docstrings, explain/test/refactor requests on real functions from
the fetched Python sources, and task templates across a few languages."""
import ast
import re
import textwrap

from rng import Rng

# Imperative first words of docstrings ("Return the ...") that read well
# after "that": "that returns the ...".
VERBS = set("""return convert check get create make compute build find parse read write
remove add split join encode decode format load save open close set update generate
yield raise print copy move register determine calculate escape quote normalize validate
wrap strip replace extract search match compare sort filter count translate expand
resolve send run call apply initialize construct test decide handle list fetch reset
start stop clear append insert delete merge render emit collect""".split())

SNIPPET_TEMPLATES = [
    "Explain this code:\n\n```python\n{c}\n```",
    "What does this Python function do?\n\n```python\n{c}\n```",
    "Explain step by step what happens when this function runs:\n\n```python\n{c}\n```",
    "Add comments to this Python function:\n\n```python\n{c}\n```",
    "Write unit tests for this function using pytest:\n\n```python\n{c}\n```",
    "Can this function be written more simply? Show an improved version.\n\n```python\n{c}\n```",
    "Add type hints and a docstring to this function:\n\n```python\n{c}\n```",
]
DOC_TEMPLATES = [
    "Write a Python function `{sig}` that {d}",
    "Implement `{sig}` in Python. It {d}",
    "In Python, write `{sig}`, a function that {d}",
]
DOC_TEMPLATES_PLAIN = [
    "Write a Python function `{sig}`. Its docstring says: \"{d}\"",
    "Implement this Python function: `{sig}` - {d}",
]

TASKS = [
    "checks whether a string is a palindrome", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "counts the words in a sentence",
    "reverses the words in a sentence", "removes duplicates from a list while keeping the order",
    "finds the second largest number in a list", "merges two sorted lists into one sorted list",
    "computes the factorial of n recursively", "computes the factorial of n without recursion",
    "converts Celsius to Fahrenheit", "converts a Roman numeral to an integer",
    "converts an integer to its binary representation", "converts snake_case to camelCase",
    "flattens a nested list", "checks whether a number is prime",
    "returns all prime numbers below n", "sorts a list of dictionaries by their 'age' key",
    "groups words by their first letter", "checks whether an email address looks valid",
    "computes the mean, median and mode of a list of numbers", "implements binary search",
    "implements bubble sort", "implements insertion sort", "implements merge sort",
    "implements quicksort", "returns the 10 most common words in a text",
    "checks whether two strings are anagrams", "computes the greatest common divisor of two numbers",
    "transposes a matrix", "splits a list into chunks of size n",
    "returns the common elements of two lists", "finds the longest word in a sentence",
    "capitalizes the first letter of every word", "generates a random password of a given length",
    "counts how many times each character appears in a string",
    "rotates a list by k positions", "checks whether parentheses in a string are balanced",
    "returns the sum of the digits of a number", "finds the missing number in a list from 1 to n",
    "removes all whitespace from a string", "checks whether a year is a leap year",
    "converts a number of seconds to hours, minutes and seconds",
    "returns the index of the first repeated element in a list",
    "computes the running total of a list", "finds all pairs in a list that add up to a target",
    "computes the dot product of two vectors", "returns the longest common prefix of a list of strings",
]
LANGS = ["Python"] * 10 + ["JavaScript"] * 3 + ["C"] * 2 + ["Java", "Go", "Rust", "C++", "TypeScript"]
CLASSES = [
    "a Stack class with push, pop, peek and is_empty methods",
    "a Queue class using two stacks", "a BankAccount class with deposit, withdraw and balance",
    "a Rectangle class with area and perimeter methods", "a simple LRU cache class",
    "a Temperature class that converts between Celsius and Fahrenheit",
    "a linked list class with append, remove and __iter__", "a Counter class that counts words",
    "a Matrix class that supports addition and multiplication", "a TodoList class",
    "a Timer context manager that prints how long a block took",
    "a class for a deck of cards with shuffle and deal methods",
]
HOWTO = [
    "read a file line by line", "sort a dictionary by its values", "merge two dictionaries",
    "check if a file exists", "parse command-line arguments", "make an HTTP GET request",
    "read a CSV file", "write JSON to a file", "remove an item from a list by value",
    "get the current date and time", "measure how long a function takes", "reverse a string",
    "convert a string to a number", "handle exceptions", "create a virtual environment",
    "iterate over two lists at the same time", "format a float with two decimals",
    "find the index of an item in a list", "run a shell command and capture its output",
    "use a list comprehension with a condition", "write a generator", "use a decorator",
]
SQL = [
    "selects all customers from Germany", "counts the orders of each customer",
    "finds the second highest salary in an employees table", "joins orders with customers and shows the customer name",
    "returns the 5 best-selling products", "deletes duplicate rows from a table",
    "finds customers who have never placed an order", "computes the average price per category",
    "lists employees hired in the last 30 days", "updates the price of all products in a category by 10%",
]
BASH = [
    "counts the lines in all .txt files in a directory", "backs up a directory into a dated tar.gz file",
    "renames all .jpeg files to .jpg", "prints the 10 largest files in a directory",
    "checks whether a website is reachable", "deletes log files older than 7 days",
    "loops over the lines of a file and prints their numbers", "finds all files containing the word TODO",
]


def _sig(node):
    args = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
    if node.args.vararg:
        args.append("*" + node.args.vararg.arg)
    args += [a.arg for a in node.args.kwonlyargs]
    if node.args.kwarg:
        args.append("**" + node.args.kwarg.arg)
    return f"{node.name}({', '.join(args)})"


def _first_sentence(doc):
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return m.group(1) if m else None


def functions(files):
    """(signature, first docstring sentence, source without the docstring)
    for top-level functions and methods of the given (path, text) files."""
    out = []
    for rel, text in files:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue  # a file for another Python version: skipped, not an error
        lines = text.splitlines()
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name.startswith("_") or node.end_lineno is None:
                continue
            doc = ast.get_docstring(node)
            body = lines[node.lineno - 1:node.end_lineno]
            if node.decorator_list:
                body = lines[node.decorator_list[0].lineno - 1:node.end_lineno]
                start = node.decorator_list[0].lineno
            else:
                start = node.lineno
            if doc and isinstance(node.body[0], ast.Expr):
                d0, d1 = node.body[0].lineno - start, node.body[0].end_lineno - start + 1
                body = body[:d0] + body[d1:]
            code = textwrap.dedent("\n".join(body)).strip("\n")
            out.append((rel, _sig(node), _first_sentence(doc) if doc else None, code))
    return out


def _doc_prompt(r, sig, sentence):
    first, rest = (sentence.split(" ", 1) + [""])[:2]
    word = first.lower()
    if rest and (word[:-1] in VERBS or word[:-2] in VERBS or word[:-3] + "y" in VERBS) \
            and word.endswith("s"):
        return r.choice(DOC_TEMPLATES).format(sig=sig, d=f"{word} {rest}")  # "Returns ..."
    if word in VERBS and rest:
        if word.endswith(("s", "sh", "ch", "x", "z")):
            verb = word + "es"
        elif word.endswith("y") and word[-2] not in "aeiou":
            verb = word[:-1] + "ies"
        else:
            verb = word + "s"
        return r.choice(DOC_TEMPLATES).format(sig=sig, d=f"{verb} {rest}")
    return r.choice(DOC_TEMPLATES_PLAIN).format(sig=sig, d=sentence)


def code_prompts(n, seed, files, accept):
    """n prompts for which accept(prompt) holds, in fixed shares per source."""
    r = Rng(seed)
    funcs = functions(files)
    with_doc = [(sig, d) for _, sig, d, _ in funcs
                if d and 25 <= len(d) <= 200 and "`" not in d and ">>>" not in d]
    snippets = [c for _, _, _, c in funcs
                if 4 <= c.count("\n") + 1 <= 25 and len(c) <= 900 and "\t" not in c]
    docs = [_doc_prompt(r, sig, d) for sig, d in r.shuffle(sorted(set(with_doc)))]
    snips = [r.choice(SNIPPET_TEMPLATES).format(c=c) for c in r.shuffle(sorted(set(snippets)))]
    tasks = []
    for t in TASKS:
        for lang in r.sample(sorted(set(LANGS)), 3) + ["Python"]:
            tasks.append(f"Write a {lang} function that {t}.")
    tasks += [f"Write {c} in Python." for c in CLASSES]
    tasks += [f"How do I {h} in Python?" for h in HOWTO]
    tasks += [f"Write an SQL query that {s}." for s in SQL]
    tasks += [f"Write a bash script that {b}." for b in BASH]
    tasks = r.shuffle(sorted(set(tasks)))
    plan = [(tasks, n * 25 // 100), (docs, n * 40 // 100), (snips, n * 35 // 100), (docs, n),
            (snips, n)]
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
