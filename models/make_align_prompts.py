"""Write edge_specdec/data/align_prompts.jsonl: the prompts `edge-specdec align` generates training text from.

    python models/make_align_prompts.py          # rewrites the file; deterministic

The set covers the seven categories of the benchmark's prompts (edge_specdec/benchmark/prompts.json), weighted
towards code, but none of its prompts: the benchmark is where the speedup of an aligned bundle is measured, so
align must not have seen those prompts. Prompts are templates crossed with topics, written for this project.
The script refuses to write a prompt whose text is one of the benchmark's.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "edge_specdec" / "data" / "align_prompts.jsonl"
BENCH = ROOT / "edge_specdec" / "benchmark" / "prompts.json"

# --- code generation: (function name, signature, what it does) ---------------------------------------------------
FUNCTIONS = [
    ("chunk", "items: list, size: int", "splits a list into consecutive chunks of the given size"),
    ("flatten", "nested: list", "flattens an arbitrarily nested list of lists into one flat list"),
    ("word_count", "text: str", "returns a dictionary mapping each lower-cased word to how often it occurs"),
    ("is_prime", "n: int", "tells whether n is a prime number, using trial division up to the square root"),
    ("primes_below", "limit: int", "returns every prime below the limit with the sieve of Eratosthenes"),
    ("gcd", "a: int, b: int", "computes the greatest common divisor with Euclid's algorithm"),
    ("binary_search", "items: list[int], target: int", "returns the index of target in a sorted list, or -1"),
    ("merge_sorted", "a: list[int], b: list[int]", "merges two sorted lists into one sorted list in linear time"),
    ("rotate_matrix", "matrix: list[list[int]]", "rotates a square matrix by 90 degrees clockwise"),
    ("roman_to_int", "s: str", "converts a Roman numeral such as 'MCMXCIV' to an integer"),
    ("int_to_roman", "n: int", "converts an integer between 1 and 3999 to a Roman numeral"),
    ("slugify", "title: str", "turns a title into a lower-case URL slug with hyphens between words"),
    ("parse_duration", "text: str", "parses strings such as '1h30m' or '45s' into a number of seconds"),
    ("moving_average", "values: list[float], window: int", "returns the moving averages over a sliding window"),
    ("dedupe", "items: list", "removes duplicates from a list while keeping the first occurrence's order"),
    ("transpose", "rows: list[list]", "transposes a list of rows into a list of columns"),
    ("fizzbuzz", "n: int", "returns the FizzBuzz sequence from 1 to n as a list of strings"),
    ("camel_to_snake", "name: str", "converts a camelCase or PascalCase identifier to snake_case"),
    ("validate_email", "address: str", "checks with a regular expression whether a string looks like an email address"),
    ("read_json_file", "path: str", "loads a JSON file and returns an empty dict when the file does not exist"),
    ("group_by", "items: list[dict], key: str", "groups a list of dictionaries by the value of one key"),
    ("top_k_frequent", "words: list[str], k: int", "returns the k most frequent words, ties broken alphabetically"),
    ("balanced_brackets", "text: str", "checks whether the brackets (), [] and {} in a string are balanced"),
    ("matrix_multiply", "a: list[list[float]], b: list[list[float]]", "multiplies two matrices given as lists"),
    ("fibonacci_memo", "n: int", "computes the n-th Fibonacci number with memoization"),
    ("levenshtein", "a: str, b: str", "computes the edit distance between two strings with dynamic programming"),
    ("retry", "func, attempts: int, delay: float", "calls a function again after a delay when it raises, up to a limit"),
    ("count_lines", "path: str", "counts the non-empty lines of a text file without reading it all into memory"),
    ("largest_files", "folder: str, n: int", "lists the n largest files below a folder with their sizes"),
    ("hex_to_rgb", "color: str", "converts a colour such as '#1a2b3c' into an (r, g, b) tuple"),
    ("median", "values: list[float]", "returns the median of a list of numbers without modifying the list"),
    ("anagrams", "words: list[str]", "groups words that are anagrams of each other"),
    ("run_length_encode", "text: str", "compresses a string with run-length encoding, e.g. 'aaab' -> 'a3b1'"),
    ("run_length_decode", "encoded: str", "decodes a run-length encoded string such as 'a3b1' back to 'aaab'"),
    ("parse_query_string", "query: str", "parses a URL query string into a dictionary of lists"),
    ("days_between", "start: str, end: str", "returns the number of days between two ISO dates"),
    ("next_weekday", "day: str", "returns the date of the next Monday to Friday after an ISO date"),
    ("normalize_whitespace", "text: str", "collapses runs of whitespace into single spaces and strips the ends"),
    ("caesar_cipher", "text: str, shift: int", "shifts every letter by a fixed amount, keeping case and punctuation"),
    ("find_duplicates", "paths: list[str]", "finds files with identical content by hashing them"),
    ("tokenize_expression", "expr: str", "splits an arithmetic expression into numbers, operators and parentheses"),
    ("evaluate_rpn", "tokens: list[str]", "evaluates an expression in reverse Polish notation"),
    ("bfs_shortest_path", "graph: dict, start, goal", "finds the shortest path in an unweighted graph"),
    ("topological_sort", "graph: dict[str, list[str]]", "orders the nodes of a directed acyclic graph"),
    ("dijkstra", "graph: dict, source", "computes the shortest distances from a source with Dijkstra's algorithm"),
    ("count_islands", "grid: list[list[int]]", "counts the islands of 1s in a grid of 0s and 1s"),
    ("pascal_triangle", "rows: int", "returns the first rows of Pascal's triangle"),
    ("to_binary", "n: int", "converts a non-negative integer to its binary representation without bin()"),
    ("chunked_reader", "path: str, size: int", "yields a file's bytes in chunks of the given size"),
    ("safe_divide", "a: float, b: float", "divides two numbers and returns None instead of raising on zero"),
    ("merge_intervals", "intervals: list[tuple[int, int]]", "merges overlapping intervals"),
    ("max_subarray", "values: list[int]", "returns the largest sum of a contiguous subarray (Kadane's algorithm)"),
    ("password_strength", "password: str", "rates a password as weak, medium or strong from simple rules"),
    ("format_bytes", "n: int", "formats a number of bytes as a human-readable string such as '1.5 MB'"),
    ("parse_log_line", "line: str", "extracts the timestamp, level and message from a log line"),
    ("debounce", "wait: float", "is a decorator that delays a function until it has not been called for a while"),
    ("timed", "func", "is a decorator that prints how long each call of a function takes"),
    ("flatten_dict", "data: dict, sep: str = '.'", "flattens nested dictionaries into dotted keys"),
    ("unflatten_dict", "data: dict, sep: str = '.'", "turns dotted keys back into nested dictionaries"),
    ("sample_without_replacement", "items: list, k: int", "picks k random items without replacement"),
]
GEN_TEMPLATES = [
    "Write a Python function `{name}({sig})` that {what}. Add a short docstring.",
    "Implement `{name}({sig})` in Python: it {what}. Include type hints and two usage examples.",
    "Write a Python function named {name} that {what}. Explain how it works in two or three sentences.",
    "Create a Python function `{name}` that {what}, and write a few pytest tests for it.",
    "I need a Python helper `{name}({sig})` that {what}. Keep it short and handle edge cases.",
]
OTHER_LANGUAGE_TASKS = [
    ("JavaScript", "a function that debounces another function"),
    ("JavaScript", "a function that deep-clones a plain object without using JSON"),
    ("JavaScript", "a function that fetches a URL and retries up to three times on network errors"),
    ("JavaScript", "a function that groups an array of objects by a property name"),
    ("TypeScript", "an interface for a user record and a function that validates one"),
    ("TypeScript", "a generic function that returns the first element of an array, or undefined"),
    ("TypeScript", "a typed event emitter class with on, off and emit methods"),
    ("Go", "a function that reads a file line by line and counts the words"),
    ("Go", "an HTTP handler that returns the current time as JSON"),
    ("Go", "a function that runs several tasks concurrently with goroutines and waits for them"),
    ("Rust", "a function that returns the longest word in a string slice"),
    ("Rust", "a struct for a 2D point with a method that computes the distance to another point"),
    ("Rust", "a function that parses a comma-separated list of integers and reports bad entries"),
    ("C", "a function that reverses a string in place"),
    ("C", "a function that counts the set bits of an unsigned integer"),
    ("C++", "a class for a fixed-size ring buffer with push and pop"),
    ("C++", "a function that removes duplicates from a std::vector while keeping the order"),
    ("Java", "a method that checks whether two strings are anagrams"),
    ("Java", "a class for a bank account with deposit, withdraw and a balance that cannot go negative"),
    ("SQL", "a query that lists the five customers with the highest total order amount"),
    ("SQL", "a query that counts the orders per month in 2024 from a table orders(id, created_at, amount)"),
    ("SQL", "a CREATE TABLE statement for a blog with posts, authors and comments, with foreign keys"),
    ("Bash", "a script that backs up a folder into a dated tar.gz archive and keeps only the last seven"),
    ("Bash", "a script that prints the ten largest files in the current folder"),
    ("Python", "a command-line tool with argparse that renames files in a folder by a pattern"),
    ("Python", "a small Flask app with one endpoint that returns a JSON list of items"),
    ("Python", "a dataclass for a 2D vector with addition, scaling and length"),
    ("Python", "a context manager that changes the working directory and restores it"),
    ("Python", "a generator that yields the lines of several files one after another"),
    ("Python", "a class that implements a stack with push, pop, peek and is_empty"),
    ("Python", "a class for a queue built from two stacks"),
    ("Python", "a thread-safe counter class using threading.Lock"),
    ("Python", "an asyncio function that downloads several URLs concurrently with aiohttp"),
    ("Python", "a script that reads a JSON lines file and writes the records with a given field to a CSV file"),
    ("Python", "a function that walks a folder and returns the total size of the .py files"),
    ("Python", "a simple tokenizer class that splits text into words and punctuation"),
    ("Python", "a binary search tree class with insert, search and in-order traversal"),
    ("Python", "a trie class with insert, search and starts_with"),
    ("Python", "a min-heap based priority queue class using heapq"),
    ("Python", "a function that plots a histogram of a list of numbers with matplotlib"),
]
OTHER_LANGUAGE_TEMPLATES = ["Write {what} in {lang}.", "Show me {what} in {lang}, with brief comments."]

# --- code editing: snippets and what to do with them ---------------------------------------------------------------
SNIPPETS = [
    ("max_value", "def find_max(numbers):\n    m = 0\n    for n in numbers:\n        if n > m:\n            m = n\n    return m"),
    ("count_vowels", "def count_vowels(s):\n    count = 0\n    for c in s:\n        if c in 'aeiou':\n            count = count + 1\n    return count"),
    ("read_config", "def read_config(path):\n    f = open(path)\n    lines = f.readlines()\n    config = {}\n    for line in lines:\n        key, value = line.split('=')\n        config[key] = value\n    return config"),
    ("factorial", "def factorial(n):\n    if n == 0:\n        return 1\n    return n * factorial(n - 1)"),
    ("filter_even", "result = []\nfor i in range(100):\n    if i % 2 == 0:\n        result.append(i * i)\nprint(result)"),
    ("user_class", "class User:\n    def __init__(self, name, email, age):\n        self.name = name\n        self.email = email\n        self.age = age\n\n    def describe(self):\n        return self.name + ' <' + self.email + '> ' + str(self.age)"),
    ("fetch", "import requests\n\ndef fetch(url):\n    r = requests.get(url)\n    return r.json()"),
    ("celsius", "def to_fahrenheit(c):\n    return c * 9 / 5 + 32\n\ntemps = [12, 18, 25]\nfor t in temps:\n    print(to_fahrenheit(t))"),
    ("unique_words", "def unique_words(text):\n    words = text.split(' ')\n    unique = []\n    for w in words:\n        if w not in unique:\n            unique.append(w)\n    return unique"),
    ("grade", "def grade(score):\n    if score >= 90:\n        return 'A'\n    if score >= 80:\n        return 'B'\n    if score >= 70:\n        return 'C'\n    return 'F'"),
    ("js_sum", "function sum(arr) {\n  var total = 0;\n  for (var i = 0; i <= arr.length; i++) {\n    total += arr[i];\n  }\n  return total;\n}"),
    ("js_fetch", "function getUser(id, callback) {\n  fetch('/api/users/' + id)\n    .then(function (res) { return res.json(); })\n    .then(function (data) { callback(data); });\n}"),
    ("bubble", "def bubble_sort(a):\n    for i in range(len(a)):\n        for j in range(len(a) - 1):\n            if a[j] > a[j + 1]:\n                a[j], a[j + 1] = a[j + 1], a[j]\n    return a"),
    ("inventory", "stock = {}\n\ndef add(item, qty):\n    if item in stock:\n        stock[item] = stock[item] + qty\n    else:\n        stock[item] = qty\n\ndef remove(item, qty):\n    stock[item] = stock[item] - qty"),
    ("mutable_default", "def append_item(item, items=[]):\n    items.append(item)\n    return items"),
    ("string_concat", "def build_report(rows):\n    report = ''\n    for row in rows:\n        report = report + str(row[0]) + ': ' + str(row[1]) + '\\n'\n    return report"),
    ("nested_loops", "def common(a, b):\n    out = []\n    for x in a:\n        for y in b:\n            if x == y and x not in out:\n                out.append(x)\n    return out"),
    ("timestamp", "import time\n\ndef log(msg):\n    print(str(time.time()) + ' ' + msg)"),
    ("sql_injection", "def find_user(cursor, name):\n    cursor.execute(\"SELECT * FROM users WHERE name = '\" + name + \"'\")\n    return cursor.fetchone()"),
    ("go_div", "func divide(a, b int) int {\n\treturn a / b\n}"),
    ("counter_dict", "counts = {}\nfor word in words:\n    if word in counts:\n        counts[word] += 1\n    else:\n        counts[word] = 1"),
    ("file_copy", "def copy_file(src, dst):\n    data = open(src, 'rb').read()\n    out = open(dst, 'wb')\n    out.write(data)"),
    ("average_age", "def average_age(people):\n    ages = [p['age'] for p in people]\n    return sum(ages) / len(ages)"),
    ("first_negative", "def first_negative(values):\n    for i in range(len(values)):\n        if values[i] < 0:\n            return values[i]"),
]
EDITS = [
    "Add type hints and a docstring to this code. Return only the new code.",
    "Find the bug or the weak spot in this code, explain it in one sentence, and fix it.",
    "Refactor this code to be more idiomatic, without changing its behaviour.",
    "Write three unit tests with pytest for this code.",
    "Add error handling to this code, with clear error messages.",
    "Explain what this code does, line by line.",
    "Rewrite this code in another language of your choice and say which one.",
    "Make this code faster or more memory-efficient, and explain the change.",
]

# --- chat ------------------------------------------------------------------------------------------------------
CHAT = [
    "Explain what an API is to someone who has never programmed.",
    "What is the difference between a list and a tuple in Python? Keep it short.",
    "How do I start learning to program if I have one hour a day?",
    "What is recursion? Give an everyday analogy and a tiny code example.",
    "Can you explain what Git branches are and why teams use them?",
    "I have a job interview for a junior developer position tomorrow. How should I prepare tonight?",
    "What are some good habits for writing readable code?",
    "Explain the difference between a process and a thread.",
    "Why do people say premature optimization is the root of all evil?",
    "What is a virtual environment in Python and why should I use one?",
    "Explain Big O notation with two simple examples.",
    "How can I stay focused when working from home?",
    "Give me three ideas for a small weekend programming project.",
    "What is the difference between unit tests and integration tests?",
    "How does a hash table work? Explain it simply.",
    "What is the difference between HTTP GET and POST requests?",
    "What should I consider when choosing a database for a small web app?",
    "Explain what Docker containers are in plain words.",
    "Why is my Python script slow when I append to a string in a loop?",
    "What are Python generators, and when are they useful?",
    "Explain the difference between `==` and `is` in Python.",
    "How do I write a good commit message?",
    "What is functional programming? Explain the main ideas briefly.",
    "Explain what a race condition is and how to avoid one.",
    "What are environment variables and how do programs use them?",
    "How should I name variables and functions?",
    "Explain what JSON is and show a small example.",
    "What is the difference between compiled and interpreted languages?",
    "How can I get better at reading other people's code?",
    "Explain how public-key cryptography works, without math.",
    "What is the difference between machine learning and traditional programming?",
    "Give me a simple weekly plan to learn SQL basics.",
    "I keep procrastinating on a big project. Any practical advice?",
    "How do I politely disagree with a colleague in a code review?",
    "Explain what a regular expression is and give three useful examples.",
    "What is technical debt, and how do teams manage it?",
    "Suggest a healthy lunch I can prepare in ten minutes.",
    "How do I explain to my manager that a deadline is unrealistic?",
    "What are the pros and cons of learning Rust as a first language?",
    "Explain what an operating system does, for a beginner.",
    "Write a short, friendly message to welcome a new member to our programming club.",
    "Tell me a short story about a robot who learns to paint.",
    "What is the best way to keep notes while learning a new technology?",
    "Explain the difference between RAM and disk storage.",
    "How does garbage collection work in Python, briefly?",
    "What is continuous integration and why does it help?",
    "Explain the idea of dependency injection with a small example.",
    "Why do websites use cookies?",
    "What are type hints in Python good for, if Python does not enforce them?",
    "How do I choose between a for loop and a list comprehension?",
]

# --- summarization: passages and instructions -----------------------------------------------------------------
PASSAGES = [
    "The town's bicycle-sharing scheme completed its first year with 48,000 rides, twice the number the council had "
    "hoped for. Most trips were shorter than three kilometres and started near the railway station. The operator "
    "plans to add twenty new stations in the northern districts next spring, and the council will review the prices "
    "for students in June.",
    "Researchers at a coastal university tracked the migration of 300 sea turtles with small satellite tags. They "
    "found that the animals followed warm currents more closely than expected and rested near three underwater "
    "mountains. The team believes that protecting these areas could help the population recover, and it has shared "
    "the data with the regional fisheries agency.",
    "Our software team moved its test suite from a single build server to a cloud service. The full run now takes 11 "
    "minutes instead of 42, and failed tests are reported directly in the pull request. The monthly cost rose by "
    "about 300 euros, which the team considers worth it because developers wait less and merge more often.",
    "The museum's new exhibition presents two hundred everyday objects from the 1950s, from radios and kitchen "
    "tools to school books. Visitors can handle copies of some items and listen to recorded interviews with people "
    "who used them. The exhibition runs until October, and entry is free for children under twelve.",
    "After a dry summer, the regional water authority asked households to reduce their use by ten percent. It "
    "banned the watering of lawns during the day and offered free water-saving shower heads. Reservoir levels have "
    "stabilised since September, but the authority says the restrictions will stay until the winter rains arrive.",
    "The startup released version 2.0 of its note-taking app. The update adds offline editing, end-to-end encryption "
    "for shared notebooks and a faster search. Users of the free plan keep all their existing features, while the "
    "paid plan now includes more storage. The company says the next release will focus on collaboration tools.",
    "A study of 2,000 office workers found that people who took short walking breaks every hour reported less back "
    "pain and felt more focused in the afternoon. The effect was strongest for those who worked at a desk for more "
    "than six hours a day. The authors recommend that employers encourage breaks rather than longer lunch hours.",
    "The local football club will renovate its stadium over the next two summers. The work includes a new roof for "
    "the east stand, better access for wheelchair users and solar panels that should cover half of the club's "
    "electricity. During the works, home matches will be played at the university's ground.",
    "The city's public transport company introduced contactless payment on all buses. Passengers can now tap a bank "
    "card or phone instead of buying a paper ticket, and the daily price is capped automatically. In the first "
    "month, boarding times fell by a third and the number of paper tickets sold dropped sharply.",
    "Engineers discovered that a memory leak in the image processing service caused the nightly crashes. Each "
    "request kept a reference to a large buffer, so memory grew until the process was killed. The fix releases the "
    "buffer after each request, and a new alert now warns when memory use rises for more than an hour.",
    "The library's coding club for teenagers met every Saturday this term. Twenty-five students built small games in "
    "Python, and six of them presented their projects at the regional science fair, where one team won a prize for "
    "the best use of sound. The club will continue next term with a course on building websites.",
    "A bakery chain reduced its food waste by forty percent in six months. It now bakes smaller batches throughout "
    "the day, sells yesterday's bread at half price in the morning and donates what is left to a food bank. Staff "
    "say customers like the fresher bread, and the chain plans to use the same approach in all its shops.",
    "The open-source project announced that it will drop support for Python 3.8 in its next major release. The "
    "maintainers explained that newer versions allow simpler type hints and faster code, and that fewer than two "
    "percent of downloads still use 3.8. Users who cannot upgrade can keep using the current release, which will "
    "receive security fixes for one more year.",
    "Volunteers planted 5,000 trees along the river last weekend as part of a project to reduce flooding and give "
    "shade to the walking path. The species were chosen with local ecologists and include willows and alders. The "
    "organisers will water the young trees through the summer and are looking for more volunteers.",
    "The company's customer survey showed that most users like the product but find the setup process confusing. "
    "Forty percent of new users contacted support in their first week, mostly about connecting their accounts. The "
    "product team will redesign the setup screens and add a short video guide before the end of the quarter.",
]
SUMMARY_INSTRUCTIONS = [
    "Summarize this text in two sentences.",
    "Summarize the main points of this text as a short bullet list.",
    "Write a one-sentence headline-style summary of this text.",
]

# --- question answering ------------------------------------------------------------------------------------------
QUESTIONS = [
    "Why do we have seasons on Earth?", "How does a vaccine train the immune system?",
    "What causes the tides?", "How do airplanes stay in the air?", "What is the greenhouse effect?",
    "Why does ice float on water?", "What is DNA and what does it do?", "How does a rainbow form?",
    "What is the difference between weather and climate?", "How do batteries store energy?",
    "What is inflation in economics?", "Why did the Roman Empire split into east and west?",
    "What was the Industrial Revolution, and why did it start in Britain?", "How do volcanoes form?",
    "What is the speed of light, and why is it important in physics?", "What is a black hole?",
    "How does the heart pump blood through the body?", "Why is the ocean salty?",
    "What is the difference between a virus and a bacterium?", "How does GPS determine your location?",
    "What is an algorithm? Give a simple example.", "What is the difference between RAM and ROM?",
    "How does a compiler differ from an interpreter?", "What is a REST API?",
    "What does HTTPS protect against?", "What is the difference between IPv4 and IPv6?",
    "How does a search engine rank pages, roughly?", "What is a database index and why does it speed up queries?",
    "What is the CAP theorem?", "What is the difference between SQL and NoSQL databases?",
    "What is a neural network, in simple terms?", "What does a CPU cache do?",
    "What is the difference between concurrency and parallelism?", "How does DNS work?",
    "What is a deadlock, and how can it be prevented?", "What is version control?",
    "Why is Python called a dynamically typed language?", "What is the Global Interpreter Lock in Python?",
    "What is the difference between a stack and a queue?", "What is a linked list and when is it useful?",
    "How does public transport reduce pollution in cities?", "Why do leaves change colour in autumn?",
    "Who wrote 'Pride and Prejudice', and what is it about?", "What is the tallest mountain in Africa?",
    "What is the largest desert in the world?", "How many bones are in the adult human body?",
    "What is the difference between an atom and a molecule?", "Why is biodiversity important?",
    "What is the purpose of the United Nations?", "How does recycling plastic work?",
    "What is the Pythagorean theorem used for?", "What is a prime number?",
    "What is the difference between mean, median and mode?", "What is compound interest?",
    "What does an electrician mean by voltage, current and resistance?", "How do solar panels make electricity?",
    "What is the difference between a meteor, a meteorite and an asteroid?", "Why do cats purr?",
    "What is machine translation, and why is it hard?", "What is open-source software?",
]

# --- math: word problems with numbers ---------------------------------------------------------------------------
def math_prompts(rng: random.Random) -> list[str]:
    out = []
    for _ in range(10):
        d, h = rng.randint(120, 480), rng.randint(2, 6)
        m = rng.choice([10, 15, 20, 30, 45])
        out.append(f"A car drives {d} km in {h} hours and {m} minutes. What is its average speed in km/h? "
                   "Show your steps.")
    for _ in range(8):
        price, pct = rng.randint(20, 400), rng.choice([10, 15, 20, 30, 35])
        out.append(f"A jacket costs {price} euros and is reduced by {pct} percent. How much do you save, and what is "
                   "the new price? Explain each step.")
    for _ in range(10):
        a, b, c = rng.randint(2, 9), rng.randint(1, 20), rng.randint(20, 90)
        out.append(f"Solve for y: {a}y + {b} = {c}. Check your answer.")
    for _ in range(6):
        p, r, y = rng.choice([1000, 2500, 5000, 8000]), rng.choice([2, 3, 4, 5]), rng.randint(2, 6)
        out.append(f"You put {p} dollars in a savings account at {r} percent interest per year, compounded yearly. "
                   f"How much is in the account after {y} years? Show the calculation.")
    for _ in range(6):
        w, h = rng.randint(3, 20), rng.randint(3, 20)
        out.append(f"A rectangular garden is {w} m long and {h} m wide. What are its area and its perimeter? A path "
                   "1 m wide runs around it; what is the area of the path?")
    for _ in range(6):
        scores = [rng.randint(50, 100) for _ in range(rng.randint(4, 7))]
        out.append(f"A student's test scores are {', '.join(map(str, scores))}. What are the mean and the median? "
                   "What score on the next test would raise the mean to a whole number above it?")
    for _ in range(4):
        n, k = rng.randint(5, 10), rng.randint(2, 3)
        out.append(f"In how many ways can you choose {k} people from a group of {n}? Explain the formula you use.")
    return out


# --- translation -------------------------------------------------------------------------------------------------
SENTENCES = [
    "The train to the airport leaves every twenty minutes from platform four.",
    "Could you please send me the report before Friday? I need it for the meeting.",
    "We are looking for a quiet hotel near the old town with breakfast included.",
    "The software update fixes several bugs and makes the application start faster.",
    "My sister is learning to play the piano and practises every evening.",
    "Please remember to turn off the lights and lock the door when you leave.",
    "The museum is closed on Mondays, but it stays open late on Thursdays.",
    "I would like to book a table for four people at seven o'clock tonight.",
    "The weather forecast says it will rain tomorrow, so bring an umbrella.",
    "Our team finished the project two weeks early and under budget.",
    "Where is the nearest pharmacy? I need something for a headache.",
    "The children planted tomatoes and beans in the school garden this spring.",
    "Thank you for your help yesterday; the presentation went very well.",
]
LANGUAGES = ["French", "German", "Spanish", "Italian", "Portuguese", "Dutch"]
FOREIGN = [
    ("French", "La réunion commence à neuf heures, mais il faut arriver un peu plus tôt pour s'installer."),
    ("German", "Ich habe das Buch gestern Abend zu Ende gelesen und fand das Ende sehr überraschend."),
    ("Spanish", "Mañana vamos a visitar a mis abuelos, que viven en un pueblo cerca de la costa."),
    ("Italian", "Il ristorante in fondo alla strada prepara la migliore pizza della città."),
    ("Portuguese", "Precisamos de comprar pão, leite e fruta antes de o supermercado fechar."),
    ("German", "Die neue Version der Software ist schneller und braucht weniger Speicher."),
    ("French", "Nous avons décidé de passer nos vacances à la montagne cette année."),
]


def build(bench_texts: set[str]) -> list[dict[str, str]]:
    rng = random.Random(2026)
    rows: list[dict[str, str]] = []

    def add(category: str, pid: str, text: str) -> None:
        if text in bench_texts:
            raise SystemExit(f"{pid} is a benchmark prompt: the align set must not contain it")
        rows.append({"id": pid, "category": category, "text": text})

    for i, (name, sig, what) in enumerate(FUNCTIONS):  # each function in two framings
        for j, template in enumerate(rng.sample(GEN_TEMPLATES, 2)):
            add("code_generation", f"gen-{name}-{j}", template.format(name=name, sig=sig, what=what))
    for i, (lang, what) in enumerate(OTHER_LANGUAGE_TASKS):
        template = OTHER_LANGUAGE_TEMPLATES[i % len(OTHER_LANGUAGE_TEMPLATES)]
        add("code_generation", f"gen-other-{i}", template.format(lang=lang, what=what))
    for name, code in SNIPPETS:  # each snippet with four of the edits
        lang = "javascript" if name.startswith("js_") else "go" if name.startswith("go_") else "python"
        for j, edit in enumerate(rng.sample(EDITS, 4)):
            add("code_editing", f"edit-{name}-{j}", f"{edit}\n\n```{lang}\n{code}\n```")
    for i, text in enumerate(CHAT):
        add("chat", f"chat-{i}", text)
    for i, passage in enumerate(PASSAGES):
        for j, instruction in enumerate(SUMMARY_INSTRUCTIONS):
            add("summarization", f"sum-{i}-{j}", f"{instruction}\n\n{passage}")
    for i, text in enumerate(QUESTIONS):
        add("question_answering", f"qa-{i}", text)
    for i, text in enumerate(math_prompts(rng)):
        add("math", f"math-{i}", text)
    for i, sentence in enumerate(SENTENCES):
        for j, lang in enumerate(rng.sample(LANGUAGES, 3)):
            add("translation", f"tr-{i}-{j}", f'Translate into {lang}: "{sentence}"')
    for i, (lang, sentence) in enumerate(FOREIGN):
        add("translation", f"tr-en-{i}", f'Translate from {lang} into English: "{sentence}"')
    return rows


def main() -> None:
    bench = json.loads(BENCH.read_text(encoding="utf-8"))["categories"]
    bench_texts = {item["text"] for items in bench.values() for item in items}
    rows = build(bench_texts)
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["category"]] = counts.get(r["category"], 0) + 1
    print(f"{OUT}: {len(rows)} prompts, {counts}")


if __name__ == "__main__":
    main()
