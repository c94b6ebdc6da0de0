"""Conversations and shared prefixes side by side: ours with prefix reuse, ours without, OpenVINO GenAI's chat mode.

    python benchmarks/conversation.py BUNDLE [--turns 6] [--answer-tokens 160] [--service 8] [--no-genai]

Two patterns, rows interleaved turn by turn in one process (each row keeps its own conversation):
- a chat: `--turns` user turns (coding questions that build on each other), greedy answers of up to
  `--answer-tokens`; ours through `Engine.start_chat` (one session, its caches kept), ours with
  `Engine(prefix_reuse=False)` (every turn prefilled whole, the baseline), and GenAI's `LLMPipeline` on the
  bundle's target folder in chat mode (`start_chat`, which keeps its KV cache between turns);
- a service: `--service` requests that share a system prompt of about 600 tokens, each with its own short
  question (32 tokens each); ours on one session (as a server slot), the baseline, and GenAI's plain `generate`
  on the same rendered prompts (its stateful pipeline keeps a shared prefix between calls).
Prints the time to the first token of every turn and request, each conversation's wall time, the medians from
turn 2 on and the ratios, and checks that ours with reuse writes what ours without it writes, turn by turn.
"""
from __future__ import annotations

import argparse
import statistics
import time

from edge_specdec.runtime import Engine, GenerationConfig

TURNS = [
    "Write a Python function that parses a line of a CSV file into a list of fields, with quoted fields.",
    "Now make it handle escaped quotes inside quoted fields.",
    "Add type hints and a docstring with two examples.",
    "Write three pytest tests for it.",
    "Now write a function that uses it to read a whole file into a list of dicts keyed by the header.",
    "Make that one a generator, and explain the change in one sentence.",
    "Add error handling for a row with the wrong number of fields.",
    "Summarize what the code does in three bullet points.",
]
SYSTEM = ("You are a senior Python engineer who reviews code for a team that builds data pipelines. "
          "House rules: " + " ".join(f"Rule {i}: prefer the standard library, name things for what they do, "
                                         f"write a docstring for every public function, keep functions short, "
                                         f"and test edge cases such as empty input and unicode text."
                                         for i in range(1, 13)))
QUESTIONS = ["How should I name a function that loads a config file?", "Is a dataclass right for a settings object?",
             "When should I use a generator instead of a list?", "How do I test code that reads the clock?",
             "What is a good way to log errors in a CLI?", "Should I catch Exception in a worker thread?",
             "How do I make a script's output stable across runs?", "When is a global constant fine?"]


class Ours:
    """Our conversation on one engine: the time to the first token and the text of each turn."""

    def __init__(self, engine: Engine, max_new_tokens: int):
        self.engine, self.config = engine, GenerationConfig(max_new_tokens=max_new_tokens)
        self.chat = engine.start_chat()
        self.session = engine.session()

    def turn(self, text: str) -> tuple[float, str, int, int]:
        first, start = [], time.perf_counter()
        result = self.chat.ask(text, self.config, on_text=lambda _: first or first.append(time.perf_counter()))
        return (first[0] if first else time.perf_counter()) - start, result.text, result.stats.prompt_tokens_reused, \
            len(self.chat.ids)

    def request(self, prompt_ids: list[int], config: GenerationConfig) -> tuple[float, str, int, int]:
        first, start = [], time.perf_counter()
        result = self.session.generate(prompt_ids, config, on_text=lambda _: first or first.append(time.perf_counter()))
        return (first[0] if first else time.perf_counter()) - start, result.text, result.stats.prompt_tokens_reused, \
            len(prompt_ids)


class GenAI:
    """OpenVINO GenAI's LLMPipeline on the bundle's target folder: chat mode, or plain generate calls."""

    def __init__(self, folder: str, max_new_tokens: int):
        import openvino_genai as og

        self.pipe = og.LLMPipeline(folder, "CPU")
        self.config = og.GenerationConfig(max_new_tokens=max_new_tokens)
        self.pipe.start_chat()

    def _timed(self, prompt: str, config) -> tuple[float, str]:
        first, start = [], time.perf_counter()

        def streamer(piece: str) -> bool:
            if not first:
                first.append(time.perf_counter())
            return False
        text = str(self.pipe.generate(prompt, config, streamer))
        return (first[0] if first else time.perf_counter()) - start, text

    def turn(self, text: str) -> tuple[float, str, int, int]:
        ttft, answer = self._timed(text, self.config)
        return ttft, answer, -1, -1

    def request(self, prompt_text: str, max_new_tokens: int) -> tuple[float, str, int, int]:
        import openvino_genai as og

        config = og.GenerationConfig(max_new_tokens=max_new_tokens)
        config.apply_chat_template = False  # the prompt is rendered already, as ours is
        ttft, answer = self._timed(prompt_text, config)
        return ttft, answer, -1, -1


def show(rows: dict[str, list], label: str) -> None:
    print(f"\n{label}: time to first token (s) per turn, prompt tokens reused / in the prompt")
    for name, results in rows.items():
        cells = " ".join(f"{t:6.2f}" + (f"({r}/{n})" if r >= 0 else "") for t, _, r, n in results)
        print(f"  {name:<20} {cells}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--answer-tokens", type=int, default=160)
    ap.add_argument("--service", type=int, default=8, help="requests sharing the system prompt (0: none)")
    ap.add_argument("--no-genai", action="store_true")
    a = ap.parse_args()
    t = time.perf_counter()
    reuse, baseline = Engine(a.bundle), Engine(a.bundle, prefix_reuse=False)
    print(f"loaded our two engines in {time.perf_counter() - t:.1f} s")
    genai = None if a.no_genai else GenAI(str(reuse.bundle.target.folder), a.answer_tokens)

    rows = {"ours, reuse": Ours(reuse, a.answer_tokens), "ours, no reuse": Ours(baseline, a.answer_tokens)}
    if genai:
        rows["GenAI chat mode"] = genai
    chat = {name: [] for name in rows}
    walls = {name: 0.0 for name in rows}
    for text in TURNS[:a.turns]:
        for name, row in rows.items():  # interleaved: every row's turn i before any row's turn i + 1
            start = time.perf_counter()
            chat[name].append(row.turn(text))
            walls[name] += time.perf_counter() - start
    show(chat, f"a {a.turns}-turn chat, answers of up to {a.answer_tokens} tokens")
    same = sum(x[1] == y[1] for x, y in zip(chat["ours, reuse"], chat["ours, no reuse"]))
    print(f"  ours with reuse wrote what ours without it wrote in {same} of {a.turns} turns")
    later = {name: statistics.median(r[0] for r in results[1:]) for name, results in chat.items()}
    for name in rows:
        print(f"  {name:<20} median time to first token from turn 2: {later[name]:.2f} s; "
              f"the whole conversation {walls[name]:.1f} s")
    if genai:
        print(f"  ours with reuse against GenAI chat mode: time to first token {later['ours, reuse'] / later['GenAI chat mode']:.2f}x, "
              f"wall time {walls['ours, reuse'] / walls['GenAI chat mode']:.2f}x")
    print(f"  ours with reuse against ours without: time to first token "
          f"{later['ours, reuse'] / later['ours, no reuse']:.2f}x, wall time {walls['ours, reuse'] / walls['ours, no reuse']:.2f}x")

    if a.service:
        config = GenerationConfig(max_new_tokens=32)
        service_rows = {"ours, reuse": rows["ours, reuse"], "ours, no reuse": rows["ours, no reuse"]}
        service = {name: [] for name in list(service_rows) + (["GenAI generate"] if genai else [])}
        if genai:
            genai.pipe.finish_chat()
        for question in QUESTIONS[:a.service]:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            ids = reuse.chat_prompt(messages)
            for name, row in service_rows.items():
                service[name].append(row.request(ids, config))
            if genai:
                service["GenAI generate"].append(genai.request(reuse.chat_template.render(messages), 32))
        show(service, f"a service: {a.service} requests sharing a system prompt of "
                      f"{len(reuse.chat_prompt([{'role': 'system', 'content': SYSTEM}]))} tokens")
        for name, results in service.items():
            print(f"  {name:<20} median time to first token from request 2: "
                  f"{statistics.median(r[0] for r in results[1:]):.2f} s")
        same = sum(x[1] == y[1] for x, y in zip(service["ours, reuse"], service["ours, no reuse"]))
        print(f"  ours with reuse wrote what ours without it wrote in {same} of {a.service} requests")


if __name__ == "__main__":
    main()
