"""Train the demo pair in edge_specdec/data/demo_bundle (package data): a small Qwen2 target and a much smaller
Llama draft with DIFFERENT tokenizers, both trained here from scratch on the Python standard library's own source.

    python models/train_demo_pair.py                       # ~40 + ~10 + ~40 minutes on one thread, export, measure
    python models/train_demo_pair.py --target-minutes 0.5 --draft-minutes 0.3 --distill-minutes 0.2 \
        --distill-train-minutes 0.2 --out /tmp/demo-smoke --bundle /tmp/demo-smoke/bundle --facts /tmp/demo-smoke/training.json   # smoke test

Steps (each logged to stdout):
1. corpus: every *.py under sysconfig's stdlib folder (no test/tests/idlelib/site-packages folders), sorted;
   every 64th file is held out for the validation loss;
2. tokenizers (the `tokenizers` library, saved as Hugging Face tokenizer folders, both with an
   <|endoftext|> EOS): target = GPT-2 style byte-level BPE, 4096 tokens; draft = Llama-2 style BPE, 2048 tokens
   (2048 rather than 1024 so that a draft token spells about as many characters as a target token: 3.2 vs 3.5;
   SLEM proposes the draft's text), (U+2581 space marker,
   prepended space, <0xNN> byte fallback, <s> BOS); both must round-trip every held-out file exactly;
3. models (plain PyTorch: AdamW, warm-up + cosine, sequence length 256, one thread): target Qwen2 128 x 32 layers
   (deep and thin: on CPU OpenVINO a tiny model's per-token cost is mostly per-layer overhead, so depth is what
   makes the target several times costlier than the 2-layer Llama draft); the step count is
   calibrated from the first steps' speed to fit the --*-minutes budget (or fixed with --*-steps, which makes a
   run reproducible step for step; training.json records the steps each run took);
4. export with `edge-specdec export` into --bundle (target int4, group size 32, to stay under 10 MB; draft int8);
5. sequence-level distillation of the draft (--distill-minutes, default 16; 0 skips it): greedy continuations
   (128 tokens) by the exported int4 target, through edge_specdec.runtime.Pipeline with one OpenVINO thread, of
   seeded stdlib prefixes (a random line start in a training file, 32-96 characters); the draft trained in 3.
   moves to --out/draft-base-hf and a copy is fine-tuned (--distill-train-minutes, default 22; peak lr 1e-3; 90%
   distilled windows with the loss on the target's continuation only, 10% stdlib windows; the weights with the
   best held-out distilled loss are kept) into --out/draft-hf; the bundle is exported again, same settings;
6. measure with `edge-specdec run --compare` (the defaults, then the target alone; identical token ids?) on
   five prompts, three times each; facts go to --facts.

    python models/train_demo_pair.py --skip-train          # distill, re-export and measure the pair in --out (~40 min)

The Hugging Face folders stay in --out (default ~/.cache/edge-specdec/demo-train), outside the repository.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXCLUDED_DIRS = {"test", "tests", "idlelib", "site-packages"}
EOS = "<|endoftext|>"
# the bundle's recorded default (export --generation-default): greedy, the tiny target otherwise repeats one run
REPETITION_PENALTY = 1.2
PROMPTS = ["def parse_args(", "class LRUCache:", "import os\n\ndef walk(", "def _read_config(path):\n    ",
           "    for line in "]
# The demo's chat template (Hugging Face's Jinja format, rendered by edge_specdec/runtime/chat.py). The pair is a
# Python code model that never saw a conversation, so a turn is put the way its training text reads: a user's (or
# the system's) message as a comment, then a blank line, and the assistant's answer as the code that follows;
# answers end with two blank lines. An answer is rendered as the model wrote it (not trimmed), so that the next
# turn's prompt starts with the tokens the model already has in its cache. Written beside the target's tokenizer
# before export, so that the exporter copies it into the bundle (target/chat_template.jinja, checksummed in the
# manifest like every file).
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_TEMPLATE = """\
{#- The edge-specdec demo is a Python code model: a message is a comment, the assistant's answer the code after it.
    With tools, the functions come first, as comments, with how to call one: a JSON object between <tool_call> and
    </tool_call> (the format of Qwen2.5's template, which the runtime reads back as OpenAI tool calls). -#}
{%- if tools -%}
{{ '# Functions you may call, one JSON object per call:\\n' }}
{%- for tool in tools -%}
{{ '# ' + (tool['function'] | tojson) + '\\n' }}
{%- endfor -%}
{{ '# <tool_call>\\n# {"name": <function-name>, "arguments": <arguments-object>}\\n# </tool_call>\\n\\n' }}
{%- endif -%}
{%- for message in messages -%}
{%- if message['role'] == 'assistant' -%}
{{ message['content'] or '' }}
{%- for call in message['tool_calls'] or [] -%}
{{ '<tool_call>\\n' + ({'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson) + '\\n</tool_call>\\n' }}
{%- endfor -%}
{{ '\\n\\n\\n' }}
{%- elif message['role'] == 'tool' -%}
{{ '# returned: ' + (message['content'] | trim | replace('\\n', '\\n# ')) + '\\n\\n' }}
{%- else -%}
{{ '# ' + (message['content'] | trim | replace('\\n', '\\n# ')) + '\\n\\n' }}
{%- endif -%}
{%- endfor -%}
"""


def warmup_cosine_lr(step: int, peak: float, warmup: int, total: int, floor: float = 0.1) -> float:
    """Linear warm-up to peak, then cosine decay to floor * peak at the last step."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def log(*parts) -> None:
    print(time.strftime("%H:%M:%S"), *parts, flush=True)


# ----------------------------------------------------------------------------------------------- corpus

def corpus_files(holdout_every: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(relative path, text) of the stdlib's *.py files, sorted; every holdout_every-th file is validation."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py")
                   if not EXCLUDED_DIRS.intersection(p.relative_to(root).parts[:-1]))
    train, val = [], []
    for i, p in enumerate(paths):
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip():
            continue
        (val if i % holdout_every == holdout_every // 2 else train).append((str(p.relative_to(root)), text))
    return train, val


# ----------------------------------------------------------------------------------------------- tokenizers

def train_bytelevel(texts: list[str], vocab_size: int):
    """GPT-2 style: byte-level BPE, bytes mapped to printable characters, no BOS added, <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)  # whole files: merges may join a newline with the indentation after it
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS)


def train_metaspace(texts: list[str], vocab_size: int):
    """Llama-2 style: U+2581 for spaces, one prepended to the text, <s> BOS, <0x00>..<0xFF> byte fallback
    (a newline, as in Llama-2, is the byte token <0x0A>), EOS <|endoftext|> in the </s> slot."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", EOS]
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.normalizer = normalizers.Replace(" ", "\u2581")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=specials, show_progress=False,
                                  max_token_length=16)
    # one word per line (there is no pre-tokenizer, as in Llama-2: a piece may hold spaces inside it)
    base.train_from_iterator((line for t in texts for line in t.splitlines() if line.strip()), trainer)
    trained = json.loads(base.to_str())["model"]
    vocab = {s: i for i, s in enumerate(specials)}
    for i in range(256):
        vocab[f"<0x{i:02X}>"] = len(vocab)
    for t, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(specials)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token=EOS, unk_token="<unk>",
                                   pad_token="<unk>")


def check_round_trip(tok, texts: list[str], name: str) -> None:
    samples = list(texts) + ["def f(x):\n    return x\n", "\n\n    \tx = 1  # two  spaces\r\n", " leading",
                             "trailing \n", "naïve café ✓ 漢字 🙂", ""]
    for text in samples:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        back = tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if back != text:
            i = next((k for k, (a, b) in enumerate(zip(back, text)) if a != b), min(len(back), len(text)))
            raise SystemExit(f"{name} tokenizer does not round-trip: at char {i}: {text[i:i + 40]!r} -> "
                             f"{back[i:i + 40]!r}")
    log(f"{name} tokenizer round-trips {len(samples)} texts exactly")


def encode_stream(tok, texts: list[str]):
    """One token stream: each file encoded as the tokenizer does for a prompt (the draft's adds <s>), then EOS."""
    import torch
    ids: list[int] = []
    for enc in tok(texts, add_special_tokens=True)["input_ids"]:
        ids.extend(enc)
        ids.append(tok.eos_token_id)
    return torch.tensor(ids, dtype=torch.long)


# ----------------------------------------------------------------------------------------------- models

def build_model(arch: str, tok, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, intermediate_size=intermediate, max_position_embeddings=1024,
                  tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.pad_token_id)
    if arch == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common))
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**common))
    raise ValueError(arch)



def evaluate(model, stream, seq_len: int, windows: int) -> float:
    """Mean next-token loss over `windows` windows spread evenly over a token stream (all of a short one)."""
    import torch
    n = min(windows, (len(stream) - 1) // seq_len)
    stride = ((len(stream) - 1) // n) if n else 0
    starts = [j * max(stride, seq_len) for j in range(n)]
    model.eval()
    total = 0.0
    with torch.no_grad():
        for i in range(0, n, 8):
            rows = [stream[s:s + seq_len + 1] for s in starts[i:i + 8]]
            total += _loss(model, torch.stack(rows)) * len(rows)
    model.train()
    return total / n


def _loss(model, x) -> float:
    import torch.nn.functional as F
    logits = model(input_ids=x[:, :-1]).logits
    return float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1)))


def train_model(name: str, model, train_stream, val_stream, args, minutes: float, steps: int | None,
                batch: int, lr: float, seed: int) -> dict:
    """AdamW + linear warm-up + cosine decay to 10%, random windows of seq_len+1 tokens, one thread."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    T = args.seq_len
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    n_params = sum(p.numel() for p in model.parameters())
    budget = minutes * 60.0
    calibrate = steps is None
    total_steps = steps if steps else 10 ** 9  # fixed after the calibration steps
    warmup = args.warmup_steps
    log(f"[{name}] {n_params / 1e6:.2f}M parameters, batch {batch} x {T} tokens, peak lr {lr}, "
        + (f"{steps} steps" if steps else f"budget {minutes} min (step count calibrated after {args.calibration_steps} steps)"))
    val_loss = evaluate(model, val_stream, T, args.val_windows)
    log(f"[{name}] step 0 val loss {val_loss:.3f}")
    model.train()
    t0 = time.perf_counter()
    last_log, ema, tokens = t0, None, 0
    history = []
    step = 0
    eval_seconds = 0.0
    eval_cost = 0.0
    replans: list[dict] = []
    next_eval = t0 + args.eval_every_minutes * 60
    stopped_early = False
    while step < total_steps:
        cur = warmup_cosine_lr(step, lr, warmup, total_steps)
        for g in opt.param_groups:
            g["lr"] = cur
        starts = torch.randint(0, len(train_stream) - T - 1, (batch,), generator=gen)
        x = torch.stack([train_stream[s:s + T + 1] for s in starts.tolist()])
        logits = model(input_ids=x[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += batch * T
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        now = time.perf_counter()
        if calibrate and step == args.calibration_steps:
            per_step = (now - t0) / step
            total_steps = max(step + 1, int(budget / per_step))
            calibrate = False
            log(f"[{name}] {per_step:.2f} s/step -> {total_steps} steps for the {minutes} min budget")
        elif steps is None and not calibrate and now - last_log >= args.log_every_seconds \
                and step < 0.8 * total_steps:
            # re-plan while in the first 80% (the machine is shared: its speed drifts); the cosine follows
            per_step = (now - t0 - eval_seconds) / step
            evals_left = (budget - (now - t0)) / (args.eval_every_minutes * 60)
            new_total = step + int((budget - (now - t0) - evals_left * eval_cost) / per_step)
            if abs(new_total - total_steps) > 0.02 * total_steps:
                log(f"[{name}] re-planned: {per_step:.2f} s/step -> {new_total} steps (was {total_steps})")
                replans.append({"at_step": step, "from": total_steps, "to": new_total})
                total_steps = max(step + 1, new_total)
        if now - last_log >= args.log_every_seconds or step == total_steps:
            el = now - t0
            log(f"[{name}] step {step}/{total_steps if total_steps < 10 ** 9 else '?'} loss {lv:.3f} (avg {ema:.3f}) "
                f"lr {cur:.2e} tokens {tokens / 1e6:.2f}M {tokens / el:.0f} tok/s elapsed {el / 60:.1f} min")
            last_log = now
        if now >= next_eval and step < total_steps:
            te = time.perf_counter()
            val_loss = evaluate(model, val_stream, T, args.val_windows)
            eval_cost = time.perf_counter() - te
            eval_seconds += eval_cost
            history.append({"step": step, "tokens": tokens, "train_loss_avg": round(ema, 4), "val_loss": round(val_loss, 4)})
            log(f"[{name}] step {step} val loss {val_loss:.3f}")
            next_eval = time.perf_counter() + args.eval_every_minutes * 60
        if steps is None and now - t0 > budget * args.overrun and step < total_steps:
            log(f"[{name}] stopping at step {step}: {args.overrun:.2f}x the time budget (the machine got slower)")
            stopped_early = True
            break
    train_seconds = time.perf_counter() - t0
    # final losses: as many windows of the training stream as of the held-out one, spread evenly over it
    val_loss = evaluate(model, val_stream, T, args.val_windows)
    train_loss = evaluate(model, train_stream, T, args.val_windows)
    history.append({"step": step, "tokens": tokens, "train_loss_avg": round(ema, 4), "val_loss": round(val_loss, 4)})
    log(f"[{name}] done: {step} steps, {tokens / 1e6:.2f}M tokens in {train_seconds / 60:.1f} min; "
        f"loss train {train_loss:.3f} val {val_loss:.3f} (nats/token)")
    model.eval()
    return {"parameters": n_params, "steps": step, "planned_steps": total_steps, "stopped_early": stopped_early,
            "batch_size": batch, "seq_len": T, "peak_lr": lr, "warmup_steps": warmup, "min_lr_ratio": 0.1,
            "replans": replans, "weight_decay": 0.1, "betas": [0.9, 0.95], "grad_clip": 1.0, "budget_minutes": minutes,
            "training_minutes": round(train_seconds / 60, 2), "tokens_seen": tokens,
            "tokens_per_second": round(tokens / train_seconds, 1), "final_train_loss_avg": round(ema, 4),
            "final_train_loss": round(train_loss, 4), "final_val_loss": round(val_loss, 4), "history": history}


def save_hf(model, tok, out_dir: Path) -> None:
    from transformers import GenerationConfig
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id, do_sample=False)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)


# ----------------------------------------------------------------------------------------------- distillation

def distill_prefixes(train_texts: list[str], seed: int, min_chars: int, max_chars: int):
    """An endless, seeded sequence of prompts: a training file picked in proportion to its length, a random line
    start in it (a line with some code on it), then min_chars..max_chars characters from there."""
    rng = random.Random(seed)
    sizes = [len(t) for t in train_texts]
    cum = list(itertools.accumulate(sizes))
    while True:
        text = rng.choices(train_texts, cum_weights=cum)[0]
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n" and i + 1 < len(text)]
        s = rng.choice(starts)
        length = rng.randint(min_chars, max_chars)
        prefix = text[s:s + length]
        if len(prefix.strip()) < 8:
            continue  # a blank or nearly empty window
        yield prefix


def generate_distill_corpus(bundle: Path, train_texts: list[str], args, path: Path) -> dict:
    """The exported (int4) target's own greedy continuations of stdlib prefixes, through the project's runtime,
    one OpenVINO thread; written to `path` as JSON lines (prefix, continuation, stop_reason, new_tokens)."""
    import openvino
    from edge_specdec.runtime import GenerationConfig, Pipeline

    core = openvino.Core()
    core.set_property("CPU", {"INFERENCE_NUM_THREADS": 1})
    pipe = Pipeline(bundle, core=core, cache_dir="off")
    config = GenerationConfig(max_new_tokens=args.distill_new_tokens)
    prefixes = distill_prefixes(train_texts, args.seed + 2, args.distill_min_chars, args.distill_max_chars)
    budget = args.distill_minutes * 60.0
    t0 = time.perf_counter()
    n = tokens = 0
    gen_seconds = 0.0
    stops: dict[str, int] = {}
    last_log = t0
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        while (n < args.distill_texts) if args.distill_texts else (time.perf_counter() - t0 < budget):
            prefix = next(prefixes)
            res = pipe.generate(prefix, config, algorithm="none")
            n += 1
            tokens += res.stats.new_tokens
            gen_seconds += res.stats.seconds
            stops[res.stop_reason] = stops.get(res.stop_reason, 0) + 1
            f.write(json.dumps({"prefix": prefix, "continuation": res.text, "stop_reason": res.stop_reason,
                                "new_tokens": res.stats.new_tokens}) + "\n")
            now = time.perf_counter()
            if now - last_log >= args.log_every_seconds:
                log(f"[distill] {n} texts, {tokens} target tokens, {tokens / gen_seconds:.0f} tok/s, "
                    f"elapsed {(now - t0) / 60:.1f} min")
                last_log = now
    seconds = time.perf_counter() - t0
    log(f"[distill] generated {n} continuations, {tokens} target tokens in {seconds / 60:.1f} min "
        f"({tokens / gen_seconds:.0f} tok/s while generating); stop reasons {stops}")
    del pipe
    return {"texts": n, "target_tokens": tokens, "minutes": round(seconds / 60, 2),
            "target_tokens_per_second": round(tokens / gen_seconds, 1), "stop_reasons": stops}


def distill_stream(tok, records: list[dict]):
    """One packed token stream of the distilled texts for the draft (<s> prefix continuation [EOS]) and a loss
    mask over it: 1 on the continuation's tokens (and on EOS when the target itself ended there), else 0."""
    import torch
    ids: list[int] = []
    mask: list[int] = []
    for r in records:
        full = tok(r["prefix"] + r["continuation"], add_special_tokens=True)["input_ids"]
        n_prefix = len(tok(r["prefix"], add_special_tokens=True)["input_ids"])
        # the boundary token may merge across prefix and continuation: count it as prefix (not learned)
        ids.extend(full)
        mask.extend([0] * min(n_prefix, len(full)) + [1] * max(0, len(full) - n_prefix))
        ids.append(tok.eos_token_id)
        mask.append(1 if r["stop_reason"] == "eos" else 0)
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.float32)


def masked_eval(model, stream, mask, seq_len: int) -> float:
    """Mean loss over the masked-in next tokens of a (short) stream, in consecutive windows."""
    import torch
    import torch.nn.functional as F
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        starts = list(range(0, max(1, len(stream) - 1), seq_len))
        for i in range(0, len(starts), 8):
            for s in starts[i:i + 8]:
                x = stream[s:s + seq_len + 1]
                m = mask[s + 1:s + seq_len + 1]
                if len(x) < 2 or float(m.sum()) == 0:
                    continue
                logits = model(input_ids=x[None, :-1]).logits[0]
                loss = F.cross_entropy(logits.float(), x[1:], reduction="none")
                total += float((loss * m).sum())
                count += float(m.sum())
    model.train()
    return total / max(count, 1.0)


def finetune_draft(model, d_train, m_train, d_val, m_val, s_train, s_val, args) -> dict:
    """Warm-started fine-tune: each batch holds round(mix * batch) windows of the distilled stream (loss on the
    target's continuations only) and the rest windows of the stdlib stream; AdamW, warm-up + cosine to 10%,
    a calibrated step count for --distill-train-minutes; keeps the weights with the best held-out distilled loss."""
    import copy
    import torch
    import torch.nn.functional as F

    seed = args.seed + 3
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    T, batch, lr = args.seq_len, args.draft_batch, args.distill_lr
    n_d = round(args.distill_mix * batch)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = args.distill_warmup_steps
    budget = args.distill_train_minutes * 60.0
    total_steps = args.distill_train_steps or 10 ** 9
    calibrate = not args.distill_train_steps

    def evaluate_all():
        return (masked_eval(model, d_val, m_val, T), evaluate(model, s_val, T, args.val_windows))

    before = evaluate_all()
    log(f"[draft-distill] {n_d}/{batch} rows distilled, peak lr {lr}; before: distilled held-out loss "
        f"{before[0]:.3f}, stdlib val loss {before[1]:.3f}")
    best = (before[0], 0, copy.deepcopy(model.state_dict()))
    history = [{"step": 0, "distill_val_loss": round(before[0], 4), "stdlib_val_loss": round(before[1], 4)}]
    model.train()
    t0 = time.perf_counter()
    last_log, next_eval, ema, step, eval_seconds = t0, t0 + args.distill_eval_every_seconds, None, 0, 0.0
    while step < total_steps:
        cur = warmup_cosine_lr(step, lr, warmup, total_steps)
        for g in opt.param_groups:
            g["lr"] = cur
        ds = torch.randint(0, len(d_train) - T - 1, (n_d,), generator=gen).tolist()
        ss = torch.randint(0, len(s_train) - T - 1, (batch - n_d,), generator=gen).tolist()
        x = torch.stack([d_train[s:s + T + 1] for s in ds] + [s_train[s:s + T + 1] for s in ss])
        m = torch.stack([m_train[s + 1:s + T + 1] for s in ds] + [torch.ones(T) for _ in ss])
        logits = model(input_ids=x[:, :-1]).logits
        loss_tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="none")
        loss = (loss_tok * m.reshape(-1)).sum() / m.sum().clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        now = time.perf_counter()
        if calibrate and step == args.calibration_steps:
            per_step = (now - t0) / step
            # leave room for the periodic held-out evaluations (about 3% of the time)
            total_steps = max(step + 1, int(0.97 * budget / per_step))
            calibrate = False
            log(f"[draft-distill] {per_step:.2f} s/step -> {total_steps} steps for the "
                f"{args.distill_train_minutes} min budget")
        if now - last_log >= args.log_every_seconds:
            log(f"[draft-distill] step {step}/{total_steps if total_steps < 10 ** 9 else '?'} loss {lv:.3f} "
                f"(avg {ema:.3f}) lr {cur:.2e} elapsed {(now - t0) / 60:.1f} min")
            last_log = now
        if now >= next_eval or step == total_steps:
            te = time.perf_counter()
            dv, sv = evaluate_all()
            eval_seconds += time.perf_counter() - te
            history.append({"step": step, "train_loss_avg": round(ema, 4), "distill_val_loss": round(dv, 4),
                            "stdlib_val_loss": round(sv, 4)})
            log(f"[draft-distill] step {step}: distilled held-out loss {dv:.3f}, stdlib val loss {sv:.3f}")
            if dv < best[0]:
                best = (dv, step, copy.deepcopy(model.state_dict()))
            next_eval = time.perf_counter() + args.distill_eval_every_seconds
        if not args.distill_train_steps and now - t0 > budget * args.overrun:
            log(f"[draft-distill] stopping at step {step}: {args.overrun:.2f}x the time budget")
            break
    seconds = time.perf_counter() - t0
    model.load_state_dict(best[2])
    after = evaluate_all()
    s_train_loss = evaluate(model, s_train, T, args.val_windows)
    log(f"[draft-distill] done: {step} steps in {seconds / 60:.1f} min; kept step {best[1]}: distilled held-out "
        f"loss {before[0]:.3f} -> {after[0]:.3f}, stdlib val loss {before[1]:.3f} -> {after[1]:.3f}")
    model.eval()
    return {"warm_start": "draft-base-hf (the draft trained above)", "steps": step, "planned_steps": total_steps,
            "kept_step": best[1], "batch_size": batch, "distilled_rows_per_batch": n_d, "seq_len": T,
            "peak_lr": lr, "warmup_steps": warmup, "min_lr_ratio": 0.1, "weight_decay": 0.1,
            "loss_on": "distilled rows: the target's continuation tokens only (prefix masked); stdlib rows: all",
            "budget_minutes": args.distill_train_minutes, "training_minutes": round(seconds / 60, 2),
            "tokens_seen": step * batch * T, "final_train_loss_avg": round(ema, 4),
            "distill_val_loss_before": round(before[0], 4), "distill_val_loss_after": round(after[0], 4),
            "stdlib_val_loss_before": round(before[1], 4), "stdlib_val_loss_after": round(after[1], 4),
            "stdlib_train_loss_after": round(s_train_loss, 4), "history": history}


# ----------------------------------------------------------------------------------------------- export, measure

def write_chat_template(model_folder: Path) -> None:
    """CHAT_TEMPLATE into a Hugging Face model folder, where the exporter picks it up with the tokenizer files."""
    (model_folder / CHAT_TEMPLATE_FILE).write_text(CHAT_TEMPLATE, encoding="utf-8")


def add_chat_template_to_bundle(bundle: Path) -> None:
    """CHAT_TEMPLATE into an exported bundle, as an export from a target folder holding it would have written it:
    target/chat_template.jinja, the files' sha256 and sizes and the target's size in the manifest. Nothing else
    changes (weights, tokenizers, the rest of the manifest)."""
    from edge_specdec.bundle import MANIFEST_FILE, file_records

    write_chat_template(bundle / "target")
    manifest = json.loads((bundle / MANIFEST_FILE).read_text(encoding="utf-8"))
    manifest["files"] = file_records(bundle)
    manifest["target"]["size_bytes"] = dir_bytes(bundle / "target")
    (bundle / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def edge_specdec() -> list[str]:
    exe = Path(sys.executable).with_name("edge-specdec")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "edge_specdec.cli"]


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(bundle: Path, max_new_tokens: int, repeats: int, cpus: set[int] | None = None) -> dict:
    """`edge-specdec run --compare --json` with the runtime's defaults on every prompt, `repeats` times: the
    speculative run (SLEM here) and then the target alone on the same prompt in the same process, after an
    untimed warm-up of each; medians over the repeats. cpus: the CPU affinity of the processes (OpenVINO then
    uses that many threads); None: unrestricted, as a user runs it."""
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    rows = []
    for prompt in PROMPTS:
        runs = []
        for _ in range(repeats):
            # --repetition-penalty 1.0: the model's own speed, not the demo's default penalty (edge_specdec/demo.py)
            cmd = edge_specdec() + ["run", str(bundle), "--prompt", prompt, "--max-new-tokens", str(max_new_tokens),
                                    "--repetition-penalty", "1.0", "--compare", "--json"]
            runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                                  preexec_fn=pin).stdout))
        med = lambda get: round(statistics.median(get(r) for r in runs), 3)  # noqa: E731
        row = {"prompt": prompt, "algorithm": runs[0]["algorithm"], "new_tokens": runs[0]["stats"]["new_tokens"],
               "speedup": med(lambda r: r["compare"]["speedup"]),
               "tokens_per_s": med(lambda r: r["stats"]["tokens_per_s"]),
               "target_alone_tokens_per_s": med(lambda r: r["compare"]["target_alone_tokens_per_s"]),
               "mean_tokens_per_target_pass": med(lambda r: r["stats"]["mean_tokens_per_target_pass"]),
               "acceptance": med(lambda r: r["stats"]["acceptance"]),
               "identical_to_target_alone": all(r["compare"]["identical"] for r in runs),
               "speedup_runs": [r["compare"]["speedup"] for r in runs]}
        rows.append(row)
        log(f"measure {prompt!r:32} {row['tokens_per_s']:7.1f} tok/s, the target alone "
            f"{row['target_alone_tokens_per_s']:7.1f}: x{row['speedup']:.2f} (runs {row['speedup_runs']}); "
            f"tokens/pass {row['mean_tokens_per_target_pass']:.2f}, acceptance {row['acceptance']:.2f}, "
            f"identical {row['identical_to_target_alone']}")
    summary = {"median_speedup": round(statistics.median(r["speedup"] for r in rows), 3),
               "median_tokens_per_target_pass": round(statistics.median(r["mean_tokens_per_target_pass"]
                                                                        for r in rows), 3),
               "median_acceptance": round(statistics.median(r["acceptance"] for r in rows), 3),
               "all_identical_to_target_alone": all(r["identical_to_target_alone"] for r in rows)}
    return {"command": f"edge-specdec run BUNDLE --prompt P --max-new-tokens {max_new_tokens} --repetition-penalty 1.0 "
                       f"--compare --json",
            "max_new_tokens": max_new_tokens, "repeats_per_prompt": repeats,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, shared with other work (noisy)",
            "cpu_affinity": sorted(cpus) if cpus else "unrestricted", "rows": rows, "summary": summary}


def run_distillation(args, out: Path) -> dict:
    """Sequence-level distillation of the draft (as in DistillSpec): the exported target's greedy continuations of
    stdlib prefixes, then a warm-started fine-tune of the draft on mostly those; the draft trained from scratch
    moves to --out/draft-base-hf (kept), the fine-tuned one is saved as --out/draft-hf."""
    import shutil
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t_start = time.time()
    train_files, val_files = corpus_files(args.holdout_every)
    train_texts = [t for _, t in train_files]
    val_texts = [t for _, t in val_files]
    corpus_path = out / "distill" / "corpus.jsonl"
    if args.reuse_distill_corpus and corpus_path.exists():
        gen_facts = json.loads((out / "distill" / "generation.json").read_text())
        log(f"[distill] reusing {corpus_path} ({gen_facts['texts']} texts)")
    else:
        gen_facts = generate_distill_corpus(args.bundle, train_texts, args, corpus_path)
        gen_facts.update({"bundle_target": f"{args.target_weights} (the exported bundle's target)",
                          "runtime": "edge_specdec.runtime.Pipeline, algorithm none, greedy, 1 OpenVINO thread",
                          "max_new_tokens": args.distill_new_tokens, "prefix_seed": args.seed + 2,
                          "prefixes": f"a training file picked in proportion to its length, a random line start, "
                                      f"{args.distill_min_chars}-{args.distill_max_chars} characters"})
        (out / "distill" / "generation.json").write_text(json.dumps(gen_facts, indent=2) + "\n")
    records = [json.loads(line) for line in corpus_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    held = [r for i, r in enumerate(records) if i % args.distill_holdout_every == args.distill_holdout_every - 1]
    kept = [r for i, r in enumerate(records) if i % args.distill_holdout_every != args.distill_holdout_every - 1]

    base, final = out / "draft-base-hf", out / "draft-hf"
    if not base.exists():
        shutil.move(str(final), str(base))
        log(f"[distill] the draft trained from scratch is kept in {base}")
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    t = time.time()
    d_train, m_train = distill_stream(tok, kept)
    d_val, m_val = distill_stream(tok, held)
    s_train, s_val = encode_stream(tok, train_texts), encode_stream(tok, val_texts)
    log(f"[distill] draft tokens: distilled {len(d_train)} ({int(m_train.sum())} learned) + {len(d_val)} held out "
        f"({len(held)} texts); stdlib {len(s_train) / 1e6:.2f}M; encoded in {time.time() - t:.0f} s")
    res = finetune_draft(model, d_train, m_train, d_val, m_val, s_train, s_val, args)
    save_hf(model, tok, final)
    log(f"[distill] fine-tuned draft saved to {final}")
    return {"method": "sequence-level distillation (the target's greedy outputs as the draft's training text)",
            "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
            "generation": gen_facts,
            "draft_tokens": {"distilled_train": len(d_train), "distilled_train_learned": int(m_train.sum()),
                             "distilled_heldout": len(d_val), "distilled_heldout_texts": len(held),
                             "mix": f"{args.distill_mix:.0%} distilled windows, the rest stdlib windows"},
            "finetune": res, "total_minutes": round((time.time() - t_start) / 60, 2)}


# ----------------------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "edge-specdec" / "demo-train",
                    help="work folder for the tokenizers and Hugging Face models (default %(default)s)")
    ap.add_argument("--bundle", type=Path, default=REPO / "edge_specdec" / "data" / "demo_bundle",
                    help="the bundle to write (default: the demo that ships inside the package, %(default)s)")
    ap.add_argument("--facts", type=Path, default=REPO / "models" / "demo" / "training.json")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-minutes", type=float, default=40.0)
    ap.add_argument("--draft-minutes", type=float, default=10.0)
    ap.add_argument("--target-steps", type=int, help="fixed step count (reproducible; overrides --target-minutes)")
    ap.add_argument("--draft-steps", type=int, help="fixed step count (reproducible; overrides --draft-minutes)")
    ap.add_argument("--target-vocab", type=int, default=4096)
    ap.add_argument("--draft-vocab", type=int, default=2048)
    ap.add_argument("--target-size", default="128x32x384",
                    help="hidden x layers x intermediate of the Qwen2 target (4 heads, 2 KV heads)")
    ap.add_argument("--draft-size", default="128x2x384",
                    help="hidden x layers x intermediate of the Llama draft (4 heads, 2 KV heads)")
    ap.add_argument("--target-batch", type=int, default=8)
    ap.add_argument("--draft-batch", type=int, default=16)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--warmup-steps", type=int, default=60)
    ap.add_argument("--calibration-steps", type=int, default=20)
    ap.add_argument("--overrun", type=float, default=1.25, help="stop a budgeted run at this multiple of its budget")
    ap.add_argument("--holdout-every", type=int, default=64)
    ap.add_argument("--val-windows", type=int, default=48)
    ap.add_argument("--eval-every-minutes", type=float, default=5.0)
    ap.add_argument("--log-every-seconds", type=float, default=30.0)
    ap.add_argument("--target-weights", default="int4")
    ap.add_argument("--target-group-size", type=int, default=32)
    ap.add_argument("--draft-weights", default="int8")
    ap.add_argument("--skip-train", action="store_true", help="reuse the models in --out (export and measure only)")
    ap.add_argument("--skip-export", action="store_true")
    ap.add_argument("--distill-minutes", type=float, default=16.0,
                    help="sequence-level distillation: minutes of the exported target's greedy continuations to "
                         "fine-tune the draft on (0 = no distillation stage)")
    ap.add_argument("--distill-texts", type=int, help="generate exactly this many continuations (reproducible; "
                                                       "overrides --distill-minutes)")
    ap.add_argument("--distill-new-tokens", type=int, default=128)
    ap.add_argument("--distill-min-chars", type=int, default=32)
    ap.add_argument("--distill-max-chars", type=int, default=96)
    ap.add_argument("--distill-train-minutes", type=float, default=22.0)
    ap.add_argument("--distill-train-steps", type=int, help="fixed step count (overrides --distill-train-minutes)")
    ap.add_argument("--distill-lr", type=float, default=1e-3)
    ap.add_argument("--distill-warmup-steps", type=int, default=30)
    ap.add_argument("--distill-mix", type=float, default=0.9, help="share of each batch from the distilled texts")
    ap.add_argument("--distill-holdout-every", type=int, default=20,
                    help="every n-th distilled text is held out for the fine-tune's validation loss")
    ap.add_argument("--distill-eval-every-seconds", type=float, default=60.0)
    ap.add_argument("--reuse-distill-corpus", action="store_true",
                    help="fine-tune on the continuations already in --out/distill/corpus.jsonl")
    ap.add_argument("--measure-cpus", default="all",
                    help="CPU ids the measured `edge-specdec run` processes may use (one = one OpenVINO thread); "
                         "auto: the last CPU this process may use; all: unrestricted, as a user runs it "
                         "(default %(default)s)")
    ap.add_argument("--measure-repeats", type=int, default=3)
    ap.add_argument("--measure-tokens", type=int, default=128)
    ap.add_argument("--no-measure", action="store_true")
    ap.add_argument("--chat-template-only", action="store_true",
                    help="only write the chat template into --bundle and update its manifest (no training, export or "
                         "measurement): how the packaged demo got its template without a rebuild")
    args = ap.parse_args()
    if args.chat_template_only:
        add_chat_template_to_bundle(args.bundle)
        log(f"wrote {args.bundle / 'target' / CHAT_TEMPLATE_FILE} and updated {args.bundle / 'manifest.json'}")
        return

    import torch
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    from transformers import AutoTokenizer
    import tokenizers
    import transformers

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    facts_path = out / "training-facts.json"
    if args.skip_train:
        facts = json.loads(facts_path.read_text())
    else:
        t_start = time.time()
        train_files, val_files = corpus_files(args.holdout_every)
        train_texts = [t for _, t in train_files]
        val_texts = [t for _, t in val_files]
        log(f"corpus: {len(train_files)} training files ({sum(map(len, train_texts)) / 1e6:.2f}M chars), "
            f"{len(val_files)} held out ({sum(map(len, val_texts)) / 1e6:.2f}M chars) from {sysconfig.get_paths()['stdlib']}")
        toks = {}
        for role, style, fn, size in (("target", "bytelevel", train_bytelevel, args.target_vocab),
                                      ("draft", "metaspace", train_metaspace, args.draft_vocab)):
            t = time.time()
            tok = fn(train_texts, size)
            tok.save_pretrained(out / f"tok-{role}")
            tok = AutoTokenizer.from_pretrained(out / f"tok-{role}")  # check the saved folder, not the object
            log(f"{role} tokenizer ({style}): {len(tok)} tokens, trained in {time.time() - t:.0f} s")
            check_round_trip(tok, val_texts, role)
            toks[role] = tok

        sizes = {"target": tuple(map(int, args.target_size.split("x"))), "draft": tuple(map(int, args.draft_size.split("x")))}
        facts = {"seed": args.seed, "command": " ".join(shlex.quote(a) for a in ["python", *sys.argv]),
                 "versions": {"python": platform.python_version(), "torch": torch.__version__,
                              "transformers": transformers.__version__, "tokenizers": tokenizers.__version__},
                 "torch_threads": torch.get_num_threads(),
                 "corpus": {"source": "Python standard library *.py (no test/tests/idlelib/site-packages folders), sorted",
                            "python": platform.python_version(), "train_files": len(train_files),
                            "val_files": len(val_files), "holdout_rule": f"file index % {args.holdout_every} == {args.holdout_every // 2}",
                            "val_file_names": [n for n, _ in val_files],
                            "train_chars": sum(map(len, train_texts)), "val_chars": sum(map(len, val_texts))}}
        for role, arch, seed_off in (("target", "qwen2", 0), ("draft", "llama", 1)):
            tok = toks[role]
            t = time.time()
            train_stream, val_stream = encode_stream(tok, train_texts), encode_stream(tok, val_texts)
            log(f"{role}: {len(train_stream) / 1e6:.2f}M training tokens, {len(val_stream) / 1e6:.3f}M held-out tokens "
                f"({sum(map(len, train_texts)) / len(train_stream):.2f} chars/token), encoded in {time.time() - t:.0f} s")
            hidden, layers, inter = sizes[role]
            model = build_model(arch, tok, hidden, layers, 4, 2, inter, args.seed + seed_off)
            res = train_model(role, model, train_stream, val_stream, args,
                              args.target_minutes if role == "target" else args.draft_minutes,
                              args.target_steps if role == "target" else args.draft_steps,
                              args.target_batch if role == "target" else args.draft_batch,
                              args.target_lr if role == "target" else args.draft_lr, args.seed + seed_off)
            save_hf(model, tok, out / f"{role}-hf")
            cfg = model.config
            facts[role] = {"architecture": type(model).__name__, "hidden_size": cfg.hidden_size,
                           "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
                           "num_key_value_heads": cfg.num_key_value_heads, "intermediate_size": cfg.intermediate_size,
                           "tie_word_embeddings": True, "max_position_embeddings": cfg.max_position_embeddings,
                           "tokenizer": {"style": "GPT-2 byte-level BPE" if role == "target" else
                                         "Llama-2 style BPE (U+2581, prepended space, <0xNN> byte fallback, <s> BOS)",
                                         "vocab_size": len(tok), "bos": tok.bos_token, "eos": tok.eos_token,
                                         "pad": tok.pad_token, "round_trip_checked_on_val_files": True},
                           "train_tokens_per_epoch": len(train_stream), "val_tokens": len(val_stream),
                           "epochs_seen": None, **res}
            facts[role]["epochs_seen"] = round(res["tokens_seen"] / len(train_stream), 3)
            del model
        facts["total_minutes_tokenizers_and_training"] = round((time.time() - t_start) / 60, 2)
        facts_path.write_text(json.dumps(facts, indent=2) + "\n")

    def export() -> None:
        write_chat_template(out / "target-hf")
        cmd = edge_specdec() + ["export", "--target", str(out / "target-hf"), "--draft", str(out / "draft-hf"),
                                "--out", str(args.bundle), "--force", "--target-weights", args.target_weights,
                                "--draft-weights", args.draft_weights, "--generation-default",
                                f"repetition_penalty={REPETITION_PENALTY}", "--quiet"]
        if args.target_weights == "int4":
            cmd[-1:-1] = ["--target-group-size", str(args.target_group_size)]
        log("export: " + " ".join(shlex.quote(c) for c in cmd))
        t = time.time()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        facts["export"] = {"command": "edge-specdec " + " ".join(shlex.quote(c) for c in cmd[len(edge_specdec()):]),
                           "seconds": round(time.time() - t, 1)}
        facts_path.write_text(json.dumps(facts, indent=2) + "\n")

    distill = args.distill_minutes > 0 or bool(args.distill_texts)
    # the distillation generates with the bundle's (quantized) target: export first unless that bundle is
    # already the export of the models in --out (--skip-train with an existing bundle)
    if not args.skip_export and (not args.skip_train or not (args.bundle / "manifest.json").exists()):
        export()
    if distill:
        facts["distillation"] = run_distillation(args, out)
        facts_path.write_text(json.dumps(facts, indent=2) + "\n")
        if not args.skip_export:
            export()  # the same settings: the target is unchanged, the draft is the fine-tuned one
    if args.bundle.exists():
        facts["bundle"] = {"path": os.path.relpath(args.bundle, REPO) if args.bundle.resolve().is_relative_to(REPO) else str(args.bundle),
                           "bytes": dir_bytes(args.bundle), "target_bytes": dir_bytes(args.bundle / "target"),
                           "draft_bytes": dir_bytes(args.bundle / "draft")}
        manifest = json.loads((args.bundle / "manifest.json").read_text())
        facts["bundle"]["vocabulary"] = manifest.get("vocabulary")
        log(f"bundle {args.bundle}: {facts['bundle']['bytes'] / 1e6:.2f} MB")
    if not args.no_measure:
        if args.measure_cpus == "all":
            cpus = None
        elif args.measure_cpus == "auto":
            cpus = {max(os.sched_getaffinity(0))}
        else:
            cpus = {int(c) for c in args.measure_cpus.split(",")}
        facts["measured"] = measure(args.bundle, args.measure_tokens, args.measure_repeats, cpus)
        log(f"summary: {facts['measured']['summary']}")
    facts_path.write_text(json.dumps(facts, indent=2) + "\n")
    args.facts.parent.mkdir(parents=True, exist_ok=True)
    args.facts.write_text(json.dumps(facts, indent=2) + "\n")
    log(f"wrote {args.facts}")


if __name__ == "__main__":
    main()
