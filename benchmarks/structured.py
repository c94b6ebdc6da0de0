"""Structured output on a real pair: the constrained target alone, the constrained default algorithm, and OpenVINO
GenAI's LLMPipeline with a StructuredOutputConfig on the same target folder, one interleaved run.

The task set is written for this project: extraction of fields from short texts into a JSON schema, classification
into an enum, and function calls for a small set of tools (the call as a JSON object {"name", "arguments"}, so that
GenAI's JSON-schema constraint expresses it too). Every answer is validated against its schema; our two rows must
write identical token ids (the lossless contract under a grammar).

    python benchmarks/structured.py ~/.cache/edge-specdec/bundles/qwen1.5b-int4+smollm2-135m-int8 [--limit N]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema

from edge_specdec.runtime import Engine, GenerationConfig
from edge_specdec.runtime.grammar import Constraint

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0,
                                                                                "maximum": 120},
                         "city": {"type": "string", "maxLength": 40}}}
EVENT = {"type": "object", "additionalProperties": False, "required": ["title", "date", "attendees"],
         "properties": {"title": {"type": "string", "maxLength": 60},
                        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
                        "attendees": {"type": "array", "maxItems": 6, "items": {"type": "string", "maxLength": 30}}}}
PRODUCT = {"type": "object", "additionalProperties": False, "required": ["product", "price", "currency", "in_stock"],
           "properties": {"product": {"type": "string", "maxLength": 40}, "price": {"type": "number"},
                          "currency": {"enum": ["EUR", "USD", "GBP"]}, "in_stock": {"type": "boolean"}}}
SENTIMENT = {"type": "object", "additionalProperties": False, "required": ["sentiment"],
             "properties": {"sentiment": {"enum": ["positive", "negative", "neutral"]}}}
TOPIC = {"type": "object", "additionalProperties": False, "required": ["topic", "urgent"],
         "properties": {"topic": {"enum": ["billing", "shipping", "account", "technical", "other"]},
                        "urgent": {"type": "boolean"}}}
TOOLS = {
    "get_weather": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                    "properties": {"city": {"type": "string", "maxLength": 40},
                                   "unit": {"enum": ["celsius", "fahrenheit"]}}},
    "send_email": {"type": "object", "additionalProperties": False, "required": ["to", "subject"],
                   "properties": {"to": {"type": "string", "maxLength": 60}, "subject": {"type": "string",
                                                                                        "maxLength": 60}}},
    "create_reminder": {"type": "object", "additionalProperties": False, "required": ["text", "minutes"],
                        "properties": {"text": {"type": "string", "maxLength": 60},
                                       "minutes": {"type": "integer", "minimum": 1, "maximum": 1440}}},
}
CALL = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                   "properties": {"name": {"const": name}, "arguments": schema}} for name, schema in TOOLS.items()]}
TOOL_HELP = ("Answer with one function call as JSON {\"name\": ..., \"arguments\": {...}}. Functions: "
             "get_weather(city, unit: celsius|fahrenheit), send_email(to, subject), create_reminder(text, minutes).")

TASKS = [
    (PERSON, "Extract the person as JSON (name, age, city): Maria Lopez, 34, moved to Valencia last spring."),
    (PERSON, "Extract the person as JSON (name, age, city): Our new intern is Tom Becker (22) from Hamburg."),
    (PERSON, "Extract the person as JSON (name, age, city): At 67, retired teacher Ahmed Karimi still lives in Lyon."),
    (PERSON, "Extract the person as JSON (name, age, city): Kenji Sato, aged 45, is the mayor of Sapporo."),
    (EVENT, "Extract the event as JSON (title, date as YYYY-MM-DD, attendees): The design review is on 14 March "
            "2025 with Ana, Ben and Chloe."),
    (EVENT, "Extract the event as JSON (title, date as YYYY-MM-DD, attendees): Quarterly planning, 2 June 2026; "
            "invited: Priya, Omar."),
    (EVENT, "Extract the event as JSON (title, date as YYYY-MM-DD, attendees): Launch party on 1 December 2025 for "
            "the whole team: Lea, Max, Noor, Ivan."),
    (PRODUCT, "Extract the product as JSON (product, price, currency, in_stock): The ThinkPad X1 costs 1899 EUR "
              "and ships today."),
    (PRODUCT, "Extract the product as JSON (product, price, currency, in_stock): Sorry, the Aeron chair (USD 1450) "
              "is sold out."),
    (PRODUCT, "Extract the product as JSON (product, price, currency, in_stock): Kindle Paperwhite, 149.99 GBP, "
              "available."),
    (SENTIMENT, "Classify the sentiment of this review as JSON: 'The battery died after two days. Never again.'"),
    (SENTIMENT, "Classify the sentiment of this review as JSON: 'Arrived on time, works exactly as described.'"),
    (SENTIMENT, "Classify the sentiment of this review as JSON: 'It is a cable. It transmits data.'"),
    (SENTIMENT, "Classify the sentiment of this review as JSON: 'Best purchase I made this year, my kids love it!'"),
    (TOPIC, "Classify this support ticket as JSON (topic, urgent): 'I was charged twice for my subscription.'"),
    (TOPIC, "Classify this support ticket as JSON (topic, urgent): 'The app crashes on start, our shop is down!'"),
    (TOPIC, "Classify this support ticket as JSON (topic, urgent): 'Where is my parcel? It has been three weeks.'"),
    (TOPIC, "Classify this support ticket as JSON (topic, urgent): 'How do I change the email on my account?'"),
    (CALL, TOOL_HELP + " Request: What's the weather like in Oslo, in celsius?"),
    (CALL, TOOL_HELP + " Request: Email bob@example.com that the meeting moved to Friday."),
    (CALL, TOOL_HELP + " Request: Remind me to stretch in 45 minutes."),
    (CALL, TOOL_HELP + " Request: Is it hot in Phoenix right now? Use fahrenheit."),
    (CALL, TOOL_HELP + " Request: Send a note to hr@example.com with the subject 'Vacation request'."),
    (CALL, TOOL_HELP + " Request: In two hours, remind me to call the dentist."),
]


class Ours:
    def __init__(self, engine: Engine, algorithm: str, max_new_tokens: int):
        self.engine, self.algorithm, self.max_new_tokens = engine, algorithm, max_new_tokens
        self.session = engine.session()

    def run(self, schema: dict, messages: list[dict]) -> dict:
        config = GenerationConfig(max_new_tokens=self.max_new_tokens, constraint=Constraint.json_schema(schema))
        start = time.perf_counter()
        result = self.session.generate(self.engine.chat_prompt(messages), config, algorithm=self.algorithm)
        return {"seconds": time.perf_counter() - start, "text": result.text, "ids": result.token_ids,
                "tokens": len(result.token_ids), "grammar": result.stats.grammar_tokens_accepted,
                "passes": result.stats.target_passes}


class GenAI:
    """GenAI's LLMPipeline on the bundle's target folder, with its structured output (JSON schema)."""

    def __init__(self, engine: Engine, max_new_tokens: int, draft: str = None):
        import openvino_genai as og

        self.og, self.engine, self.max_new_tokens, self.draft = og, engine, max_new_tokens, draft
        extra = {"draft_model": og.draft_model(draft, "CPU")} if draft else {}
        self.pipe = og.LLMPipeline(str(engine.bundle.target.folder), "CPU", **extra)

    def run(self, schema: dict, messages: list[dict]) -> dict:
        config = self.og.GenerationConfig()
        config.max_new_tokens = self.max_new_tokens
        config.structured_output_config = self.og.StructuredOutputConfig(json_schema=json.dumps(schema))
        config.apply_chat_template = False  # the same rendered prompt as ours
        if self.draft:
            config.num_assistant_tokens = 5
        prompt = self.engine.chat_template.render(messages)
        start = time.perf_counter()
        out = self.pipe.generate(prompt, config)
        text = out if isinstance(out, str) else str(out)
        return {"seconds": time.perf_counter() - start, "text": text, "tokens": len(self.engine.tokenizer.encode(text)),
                "grammar": 0, "passes": None}


def valid(schema: dict, text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bundle")
    parser.add_argument("--limit", type=int, default=len(TASKS), help="the first N tasks (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--no-genai", action="store_true")
    parser.add_argument("--genai-draft", metavar="DIR", help="also GenAI's speculative pipeline with this draft "
                        "folder (a model of the target's vocabulary, e.g. another bundle's draft/)")
    args = parser.parse_args()
    engine = Engine(args.bundle)
    rows = {"target alone": Ours(engine, "none", args.max_new_tokens),
            "default (auto)": Ours(engine, "auto", args.max_new_tokens)}
    if not args.no_genai:
        rows["GenAI LLMPipeline"] = GenAI(engine, args.max_new_tokens)
    if args.genai_draft:
        rows["GenAI speculative"] = GenAI(engine, args.max_new_tokens, args.genai_draft)
    tasks = TASKS[:args.limit]
    for row in rows.values():  # one untimed run each: first-inference costs out of the figures
        row.run(tasks[0][0], [{"role": "user", "content": tasks[0][1]}])
    results = {name: [] for name in rows}
    for i, (schema, text) in enumerate(tasks):
        messages = [{"role": "user", "content": text}]
        names = list(rows)
        for name in names[i % len(names):] + names[:i % len(names)]:  # a rotating order
            results[name].append(rows[name].run(schema, messages))
        line = "  ".join(f"{n}: {results[n][-1]['seconds']:.2f} s" for n in rows)
        print(f"task {i + 1}/{len(tasks)}: {line}  {results['default (auto)'][-1]['text'][:70]!r}", flush=True)
    alone = results["target alone"]
    print(f"\n{len(tasks)} tasks, max_new_tokens {args.max_new_tokens}, {args.bundle}")
    print("| row | total s | tokens | tokens/s | median ratio to target alone | schema-valid | grammar tokens |")
    print("|---|---|---|---|---|---|---|")
    for name, out in results.items():
        seconds, tokens = sum(r["seconds"] for r in out), sum(r["tokens"] for r in out)
        ratio = statistics.median(a["seconds"] / r["seconds"] for a, r in zip(alone, out))
        ok = sum(valid(schema, r["text"]) for (schema, _), r in zip(tasks, out))
        grammar = sum(r["grammar"] for r in out)
        print(f"| {name} | {seconds:.1f} | {tokens} | {tokens / seconds:.2f} | {ratio:.2f}x | {ok}/{len(out)} | "
              f"{grammar} ({100 * grammar / max(tokens, 1):.0f}%) |")
    same = sum(a["ids"] == b["ids"] for a, b in zip(alone, results["default (auto)"]))
    print(f"default (auto) identical to the constrained target alone: {same}/{len(tasks)}")
    if "GenAI LLMPipeline" in results:
        agree = sum(a["text"] == g["text"] for a, g in zip(alone, results["GenAI LLMPipeline"]))
        print(f"GenAI's text equal to ours (its grammar engine and JSON layout differ): {agree}/{len(tasks)}")


if __name__ == "__main__":
    main()
