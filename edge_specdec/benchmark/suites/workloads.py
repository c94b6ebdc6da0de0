"""The workloads suite: requests whose answers repeat text the target has seen (code edits, answers quoting a
document, a revised answer, a tool-call loop) and plain chat, each against the same engine's target alone, with a
cold draft pool per run; the share of tokens each source proposed that the target kept, and what the rounds that
did not copy cost on their own (the speed the request would reach if every copy round after the first cost
nothing: how far better copying alone could take it)."""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from ..suite_runs import Cell, Figure, Measured, Suite, SuiteRow

SUMMARY = "code edits, quoted documents, revised answers, tool-call loops, plain chat: free drafts at work"

_CODE = '''def load_users(path):
    users = []
    with open(path) as f:
        for line in f:
            name, email, age = line.strip().split(",")
            users.append({"name": name, "email": email, "age": int(age)})
    return users


def adults(users):
    return [u for u in users if u["age"] >= 18]
'''
_CONFIG = '''class RetryPolicy:
    def __init__(self, attempts=3, delay=0.5, backoff=2.0):
        self.attempts = attempts
        self.delay = delay
        self.backoff = backoff

    def delays(self):
        delay = self.delay
        for _ in range(self.attempts):
            yield delay
            delay *= self.backoff
'''
_DOC = ("The Harbor Street library opens at nine on weekdays and at ten on Saturdays; it is closed on Sundays. "
        "Members may borrow up to eight books at a time for three weeks, and renew each loan twice online. "
        "Late returns cost twenty cents a day per book, capped at five dollars. The reading room on the second "
        "floor is reserved for quiet study, and the children's corner hosts a story hour every Wednesday at four. "
        "Printing costs ten cents a page in black and white and fifty cents in color.")
_TOOLS = ("You call tools by answering with one JSON object {\"tool\": NAME, \"arguments\": {...}} and nothing "
          "else. Tools: get_weather(city), get_forecast(city, days), convert(amount, from, to).")
_ANSWER = ("Here is a function that counts the words in a file:\n\n```python\ndef count_words(path):\n    counts = {}\n"
           "    with open(path) as f:\n        for line in f:\n            for word in line.split():\n"
           "                counts[word] = counts.get(word, 0) + 1\n    return counts\n```\n\nIt reads the file line "
           "by line, splits each line on whitespace and counts each word in a dictionary.")

# category -> requests, each a list of chat messages (plain text for a bundle without a chat template)
WORKLOADS: dict[str, list[list[dict]]] = {
    "code_edit": [
        [{"role": "user", "content": f"Rename `users` to `people` everywhere and reply with the whole code:"
                                     f"\n\n{_CODE}"}],
        [{"role": "user", "content": f"Add a `max_delay=10.0` argument that caps each delay, and reply with the whole "
                                     f"class:\n\n{_CONFIG}"}],
    ],
    "quote": [
        [{"role": "user", "content": f"{_DOC}\n\nQuote, word for word, the sentences about borrowing and late "
                                     f"returns."}],
        [{"role": "user", "content": f"{_DOC}\n\nWhat does the notice say about the reading room and the children's "
                                     f"corner? Quote it exactly."}],
    ],
    "revise": [
        [{"role": "user", "content": "Write a Python function that counts the words in a file."},
         {"role": "assistant", "content": _ANSWER},
         {"role": "user", "content": "Make it ignore case, and show the whole answer again."}],
        [{"role": "user", "content": "Write a Python function that counts the words in a file."},
         {"role": "assistant", "content": _ANSWER},
         {"role": "user", "content": "Rename the function to word_counts and repeat the answer with that change."}],
    ],
    "tool_loop": [
        [{"role": "system", "content": _TOOLS},
         {"role": "user", "content": "Weather in Paris, then in Lyon, then in Nice."},
         {"role": "assistant", "content": '{"tool": "get_weather", "arguments": {"city": "Paris"}}'},
         {"role": "user", "content": 'Result: {"city": "Paris", "temperature": 14, "sky": "cloudy"}'},
         {"role": "assistant", "content": '{"tool": "get_weather", "arguments": {"city": "Lyon"}}'},
         {"role": "user", "content": 'Result: {"city": "Lyon", "temperature": 16, "sky": "clear"}'}],
        [{"role": "system", "content": _TOOLS},
         {"role": "user", "content": "Convert 100 EUR to USD, then 250 EUR to GBP, then 80 EUR to JPY."},
         {"role": "assistant", "content": '{"tool": "convert", "arguments": {"amount": 100, "from": "EUR", '
                                          '"to": "USD"}}'},
         {"role": "user", "content": 'Result: {"amount": 108.4, "currency": "USD"}'}],
    ],
    "chat": [
        [{"role": "user", "content": "Explain in a short paragraph why the sky is blue."}],
        [{"role": "user", "content": "Give three tips for writing readable Python code."}],
    ],
}

FIGURES = [Figure("tokens_per_s", "tok/s"),
           Figure("tokens_per_pass", "tokens per target pass"),
           Figure("suffix_share", "share copied from the request", ".2f"),
           Figure("pool_share", "share copied from the pool", ".2f"),
           Figure("model_share", "share drafted by the model", ".2f"),
           Figure("copy_time_share", "share of time in copy rounds", ".2f"),
           Figure("copies_free_tokens_per_s", "tok/s if copy rounds cost nothing"),
           Figure("tokens", "tokens", ".0f"),
           Figure("prompt_reused", "prompt tokens reused", ".0f")]

METHOD = ("Each request is a chat in the target's template (its own prompts, or --prompts FILE), greedy with the "
          "bundle's default settings, `max_new_tokens` tokens. The rows run on one engine, interleaved request by "
          "request. The draft pool is emptied before every run, so no run copies an answer an earlier run (another "
          "row, or the same row's earlier repeat) wrote; the warm-pool row (--warm-pool) runs instead with a pool "
          "that holds the target alone's answers to the other requests of its category (the service pattern: many "
          "requests of one shape), and is labelled as such; the ceiling row (--ceiling) is not a real setup: its "
          "pool holds the target alone's answer to the very request, so it shows the most copying can give on this "
          "machine (the last turn's prefill and one block per copied run). A conversation's earlier turns (a request with more "
          "than one user message) are in the session's KV cache before its run is timed, as its previous turn left "
          "them in a chat app or a tool loop, for every row alike: the timed run prefills only the last turn, in the "
          "target and, where a row drafts with the draft model, in the draft (whose cache holds the earlier turns, "
          "as drafting the previous answer left it). A share is the part of the run's "
          "tokens that came from that source and that the target kept. \"If copy rounds cost nothing\": the run's "
          "tokens over its seconds without those of the rounds after the first that verified a copy (the draft "
          "model's rounds, the target's own steps and the prompt's round left): how far cheaper copies could take "
          "the request, not a real setup.")


def _prompt(engine, messages: list[dict]) -> list[int]:
    if engine.chat_template is not None:
        return engine.chat_prompt(messages)
    return engine.tokenizer.encode("\n\n".join(m["content"] for m in messages))


def earlier_turns(engine, messages: list[dict], ids: list[int]) -> list[int]:
    """The tokens a conversation's previous turn left in the KV cache: the prompt of the messages before its last
    user message, as far as it is a prefix of the whole request's prompt `ids` (empty for a single-turn request)."""
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    if last_user == 0 or not any(m["role"] == "user" for m in messages[:last_user]):
        return []
    earlier = _prompt(engine, messages[:last_user])
    common = next((i for i, (a, b) in enumerate(zip(earlier, ids)) if a != b), min(len(earlier), len(ids)))
    return ids[:common]


def runner(engine, max_new_tokens: int, algorithm: str, lookup: bool = True, warm: dict = None,
           known: bool = False):
    """A row's run: the cell's request on a session of the engine whose KV cache holds the conversation's earlier
    turns; the pool emptied first (cold), or holding the other requests' answers of its category (warm), or
    holding this request's own answer (`known`, with `warm` the answers: the ceiling of free drafts)."""
    from ...runtime import GenerationConfig

    session = engine.session()
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0).with_defaults(engine.default_config)
    # the previous turn's run: two tokens, so that its one round drafts with the draft model, which then holds the
    # conversation as it would after drafting that turn's answer in a chat app
    previous_turn = GenerationConfig(max_new_tokens=2, temperature=0.0).with_defaults(engine.default_config)

    def run(c: Cell, repeat: int) -> Measured:
        category, index, ids, earlier = c.value
        if earlier:  # the previous turn, untimed: both models' KV stays in the session for the timed run to reuse
            session.generate(earlier, previous_turn, algorithm=algorithm, lookup=False, pool_scope=None)
        engine.forget()
        if warm is not None:
            for other, answer in warm[category].items():
                if (other == index) == known:
                    engine.draft_pool.add(answer)
        start = time.perf_counter()
        result = session.generate(ids, config, algorithm=algorithm, lookup=lookup,
                                  pool_scope="" if algorithm != "none" else None)
        seconds = time.perf_counter() - start
        st, n = result.stats, max(1, len(result.token_ids))
        without_copies = max(seconds - st.copy_round_seconds, 1e-9)
        return Measured({"tokens_per_s": len(result.token_ids) / seconds, "tokens_per_pass": st.tokens_per_target_pass,
                         "prompt_reused": st.prompt_tokens_reused,
                         "copy_time_share": st.copy_round_seconds / seconds,
                         "copies_free_tokens_per_s": len(result.token_ids) / without_copies,
                         "suffix_share": st.suffix_tokens_accepted / n, "pool_share": st.pool_tokens_accepted / n,
                         "model_share": st.draft_tokens_accepted / n, "tokens": len(result.token_ids)},
                        list(result.token_ids))
    return run


def warm_answers(engine, cells: list[Cell], max_new_tokens: int) -> dict:
    """The target alone's answer (prompt and output tokens) to every request, by category and index: what the warm
    pool holds of the requests other than the one it runs."""
    from ...runtime import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0).with_defaults(engine.default_config)
    session, answers = engine.session(), {}
    for c in cells:
        category, index, ids, _ = c.value
        result = session.generate(ids, config, algorithm="none", pool_scope=None)
        answers.setdefault(category, {})[index] = ids + result.token_ids
    return answers


COPIES_FREE = "ours-auto if its copy rounds cost nothing (not a real setup)"


def per_category(report: dict, row: str, baseline: str = "ours-none", figure: str = "") -> dict[str, float]:
    """The median over each category's requests of the row's tokens/s (or its per-cell `figure`) over the
    baseline's tokens/s."""
    rows = {r["setup"]: r for r in report["setups"]}
    if row not in rows or baseline not in rows:
        return {}
    ratios: dict[str, list[float]] = {}
    for key in report["cells"]:
        ours = rows[row]["per_cell_figures"].get(figure, {}) if figure else rows[row]["per_cell"]
        mine, theirs = ours.get(key), rows[baseline]["per_cell"].get(key)
        if mine and theirs:
            ratios.setdefault(key.split("/")[0], []).append(mine / theirs)
    return {category: statistics.median(values) for category, values in ratios.items()}


def category_table(report: dict) -> str:
    """report.md's table of each row's speedup per category."""
    rows = [r["setup"] for r in report["setups"] if r["setup"] != "ours-none"]
    tables = {row: per_category(report, row) for row in rows}
    columns = list(rows)
    if "ours-auto" in rows:  # how far cheaper copies could take the default (COPIES_FREE)
        columns.append(COPIES_FREE)
        tables[COPIES_FREE] = per_category(report, "ours-auto", figure="copies_free_tokens_per_s")
    categories = list(dict.fromkeys(key.split("/")[0] for key in report["cells"]))
    lines = ["## tok/s vs ours-none per category (median over its requests)", "",
             "| category | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for category in categories:
        cells = [f"{tables[row][category]:.2f}x" if category in tables[row] else "-" for row in columns]
        lines.append(f"| {category} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def read_workloads(prompts_file) -> dict[str, list[list[dict]]]:
    """The requests by category: ours, or a user's file (prompt_file.read_prompt_file: one user message per
    prompt)."""
    if not prompts_file:
        return WORKLOADS
    from ..prompt_file import read_prompt_file

    return {category: [[{"role": "user", "content": item["text"]}] for item in items]
            for category, items in read_prompt_file(Path(prompts_file)).items()}


def load_cells(engine, prompts_file) -> list[Cell]:
    """The requests as cells: each one's prompt ids and those of its earlier turns."""
    workloads = read_workloads(prompts_file)
    cells = []
    for category, requests in workloads.items():
        for i, messages in enumerate(requests):
            ids = _prompt(engine, messages)
            cells.append(Cell(f"{category}/{i + 1}", (category, i, ids, earlier_turns(engine, messages, ids))))
    return cells


def main(args: argparse.Namespace) -> int:
    from ...errors import EdgeSpecdecError
    from ...runtime import Engine
    from ..suite_runs import check_out, finish, run_suite

    if args.max_new_tokens < 1 or args.repeats < 1:
        raise EdgeSpecdecError("--max-new-tokens and --repeats must be at least 1.")
    categories = list(read_workloads(args.prompts))
    unknown = sorted(set(args.categories or ()) - set(categories))
    if unknown:  # before the engine loads
        raise EdgeSpecdecError(f"--categories: no request of {', '.join(unknown)}; the categories are "
                               f"{', '.join(categories)}.")
    out = Path(args.out) if args.out else None
    check_out(out)
    engine = Engine(args.bundle)
    engine.compile_static_copies()  # timed as a server runs once its copies serve, not while they compile
    if engine.draft_pool is None:
        raise EdgeSpecdecError("the engine keeps no draft pool: the workloads suite measures it.")
    cells = [c for c in load_cells(engine, args.prompts) if not args.categories or c.value[0] in args.categories]
    auto = engine.resolve_algorithm("auto")
    rows = [SuiteRow("ours-none", "ours, the target alone", runner(engine, args.max_new_tokens, "none")),
            SuiteRow("ours-auto", f"ours, the default ({auto}, free drafts first), the draft pool cold",
                     runner(engine, args.max_new_tokens, "auto"), reference="ours-none")]
    if engine.draft_model is not None:
        rows.append(SuiteRow("ours-auto-no-free", f"ours, {auto} with the draft model every round (no free drafts)",
                             runner(engine, args.max_new_tokens, "auto", lookup=False), reference="ours-none"))
    answers = warm_answers(engine, cells, args.max_new_tokens) if args.warm_pool or args.ceiling else None
    if args.warm_pool:
        rows.append(SuiteRow("ours-auto-warm-pool", "ours, the default with a WARM pool: the target alone's answers "
                             "to the other requests of the category", runner(engine, args.max_new_tokens, "auto",
                                                                             warm=answers), reference="ours-none"))
    if args.ceiling:
        rows.append(SuiteRow("ours-ceiling", "NOT a real setup: the default with the target alone's answer to this "
                             "very request in the pool, copied whole; what no drafter beats here",
                             runner(engine, args.max_new_tokens, "auto", warm=answers, known=True),
                             reference="ours-none"))
    suite = Suite("workloads", engine.bundle, rows, cells, FIGURES, headline="tokens_per_s", baseline="ours-none",
                  cell_figures=("copies_free_tokens_per_s",),
                  method=METHOD, repeats=args.repeats, warm_ups=cells[:1],
                  settings={"requests": len(cells), "max_new_tokens": args.max_new_tokens,
                            "prompts": args.prompts or "built in", "warm_pool": args.warm_pool,
                            "ceiling": args.ceiling},
                  extra_markdown=category_table)
    return finish(run_suite(suite, out, args.command_line))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.epilog = ("example:\n  edge-specdec bench workloads bundles/qwen+smollm --max-new-tokens 128 --repeats 3 "
                "--warm-pool\nthe requests: edge_specdec/benchmark/suites/workloads.py (WORKLOADS)")
    p.add_argument("--max-new-tokens", type=int, default=128, metavar="N", help="tokens per answer (default 128)")
    p.add_argument("--repeats", type=int, default=1, metavar="N", help="timed runs per request and row (default 1)")
    p.add_argument("--prompts", metavar="FILE",
                   help="your own requests instead (the general suite's --prompts formats; each one user message)")
    p.add_argument("--warm-pool", action="store_true",
                   help="add a row whose draft pool holds the other requests' answers (many requests of one shape)")
    p.add_argument("--ceiling", action="store_true",
                   help="add a row whose draft pool holds the request's own answer (not a real setup: the most "
                        "that copying can give on this machine, the prefill and one block per copied run)")
    p.add_argument("--categories", nargs="+", metavar="CAT",
                   help="run only these categories (default: all)")
