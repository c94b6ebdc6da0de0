"""Benchmark a bundle: our decoders against the target alone and against the peers, side by side in one run.

The named suites of `edge-specdec bench` are in suites/ (its docstring lists them and says how to add one); this
docstring describes the general one, the default:

    edge-specdec bench BUNDLE [--setups NAME|PATTERN ...] [--max-new-tokens 64] [--repeats 2] [--ks 3 5]
                              [--categories CAT ...] [--prompts FILE] [--out DIR] [--hf] [--genai-ours]
                              [--concurrent]

    from edge_specdec.benchmark import run_benchmark
    report = run_benchmark("bundles/qwen", categories=["code_generation"], max_new_tokens=32, repeats=1)

The rows (`setups.py` lists the names): our Pipeline alone (ours-none), each algorithm that applies to the bundle
(standard for a same-vocabulary draft; slem and tli for a different vocabulary; suffix always) with each
fixed draft length of --ks and with each adaptive draft policy of the runtime (schedule, cost), OpenVINO
GenAI's own target-only and speculative pipelines on the bundle folders (same vocabulary; optional rows with
our CPU properties), and transformers on CPU (the target alone and assisted generation, Universal Assisted
Generation for a different vocabulary; --hf).

Method. One Pipeline serves all our rows (a second one with concurrent=True serves the concurrent rows). The
prompts (`prompts.json`: code generation, code editing, chat, summarization, question answering, math,
translation; or the user's own with --prompts, read by `prompt_file.py`) go through the target's chat template
when it has one; every engine gets the same rendered text (GenAI with apply_chat_template=False). Greedy
decoding throughout. Every row gets one uncounted warm-up run;
then for each (repeat, prompt) all rows run back to back, the order rotated from one prompt to the next, so
that drift in machine speed (other jobs, thermal limits) hits all rows alike. GenAI's pipelines run with the
prefix cache off, so that each run pays its own prefill as ours does.

What it reports per row: tokens/s (median, IQR, min-max), the speedup over the target alone of the same engine
(median of paired per-run ratios), TTFT and TPOT, acceptance and tokens per target pass, the whole process's
peak RSS during the row's runs (and the growth within a run), our time split (draft / target / loop), and
whether the output equals the same engine's target alone for the same prompt (token ids for ours, text for
the peers): under greedy decoding a lossless decoder never changes it. Per prompt category: the speedups.
Ours against GenAI: ours-none vs genai-none and ours-standard-kK vs genai-sd-kK. GenAI's default CPU
properties are not exact for speculation, so --genai-ours adds GenAI with exactly our properties: the
loop-against-loop comparison. The figures measured with it: benchmarks/RESULTS.md.
"""
from .prompt_set import CATEGORIES, load_prompt_set
from .runner import DEFAULT_KS, run_benchmark
from .setups import ENGINES, candidate_specs

__all__ = ["CATEGORIES", "DEFAULT_KS", "ENGINES", "candidate_specs", "load_prompt_set", "run_benchmark"]
