"""Fine-tune the draft on the target's text: sequence-level distillation, with torch (the export stage only).

What the draft learns is what it sees at run time. Each record of data.jsonl becomes one sequence in the draft's
own tokens, made as the runtime makes them: the prompt's text through the bundle's draft tokenizer, then the
target's continuation re-tokenized after it (Retokenizer.continuation, as DraftTextContext does), then the draft's
EOS when the target stopped there (a proposed EOS maps to the target's). The loss is the cross-entropy of the
continuation's tokens only: the draft never has to predict the prompt.

The target's distribution, where the two tokenizations agree (soft_weight > 0): at a position where a draft token
starts where a target token starts and spells the same bytes (a token both vocabularies share), the label becomes
a mix, (1 - soft_weight) of that token and soft_weight of the target's own most likely tokens there (recorded by
generation), those the draft's vocabulary shares, renormalized. The draft then learns how sure the target is, not
only its choice, which its confidence stop uses. Validation measures the plain cross-entropy either way, so that
losses compare across settings.

Cheap on a CPU: the logits are computed only at the positions that carry a loss (logits_to_keep), the forward pass
runs under bfloat16 autocast where the plan measured that faster, and a step accumulates whole sequences, one at
a time and unpadded, until it holds batch_tokens tokens. The whole model is trained by default; `train_layers`
trains only the top layers and the final norm (the embeddings and the output layer frozen), so that autograd
records nothing below them: cheaper per token, but on the real pair it learned less per minute than the whole
model (docs/align.md).

Early stopping: the validation split's loss is measured before training and `evals` times over the planned steps;
training stops after `patience` measurements without a new best, and the best weights are the ones kept.
The checkpoint (trainable weights, optimizer, position in the epoch, best weights when they are not the current
ones) is written at a measurement once CHECKPOINT_SECONDS have passed since the last one, and on Ctrl-C; a resume
continues from it.
"""
from __future__ import annotations

import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from ...bundle import Bundle
from ...errors import ExportError
from ...runtime.retokenize import Retokenizer
from ...runtime.text import PromptTokenizer
from ...vocab_map import NO_TOKEN, VocabMap
from .work import WorkFolder, data_totals

CHECKPOINT = "checkpoint.pt"
# the training state a checkpoint carries (see train_draft)
STATE_KEYS = ("step", "planned", "epoch", "position", "order", "best_loss", "best_step", "initial_loss", "since_best",
              "history", "train_tokens", "seconds")
PROGRESS_SECONDS = 60.0  # a progress line at least this often between validations
CHECKPOINT_SECONDS = 120.0  # a checkpoint of the whole draft with its optimizer is a few GB: not at every validation
PRECISIONS = ("fp32", "bf16")  # training arithmetic; the plan takes the faster on this machine
VALIDATION_MAX = 32     # validation sequences measured (the first ones): enough for a steady mean, cheap to run
VALIDATION_SHARE = 0.1  # of the training's time, at most this much goes to validation passes
# Training's time beyond its steps (loading, tokenizing, validation, checkpoints), as a share of the steps' time:
# the plan counts it when it turns seconds into steps, and generation (run.py) when it keeps time for training.
TRAINING_OVERHEAD = 1.15
REPLAN_MARGIN = 1.05  # a re-plan uses the measured rate, overheads included: a small margin only
WARMUP_SHARE = 0.05     # of the planned steps, the learning rate rises linearly; then a cosine decay
FINAL_LR_SHARE = 0.1    # the cosine ends at this share of the peak learning rate
# Files of the draft's source folder that a Hugging Face folder of the fine-tuned draft needs beside the weights
# (the tokenizer and chat template are unchanged by training).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "chat_template.json", "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt")


@dataclass(frozen=True)
class TrainSettings:
    epochs: float = 3.0                 # the most passes over the training split (the time or early stopping may end
                                        # training sooner; generation keeps time for one pass)
    train_layers: Optional[int] = None  # top decoder layers trained; None: all of them (the whole model)
    learning_rate: float = 1e-4
    batch_tokens: int = 2048            # tokens (prompt and continuation) per optimizer step
    patience: int = 3                   # validation measurements without a new best before stopping
    evals: int = 10                     # validation measurements over the planned steps
    seed: int = 0
    precision: Optional[str] = None     # fp32 or bf16 (autocast); None: the faster on this machine, measured
    soft_weight: float = 0.0            # the share of the target's distribution in the label (see above)

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


# --- the examples ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SoftLabels:
    """The target's distribution at some of an example's loss positions, in draft token ids."""
    positions: np.ndarray  # int64 [P]: indices into the continuation (the loss rows)
    ids: np.ndarray        # int64 [P, K]: draft token ids (padding: the position's own label, weight 0)
    weights: np.ndarray    # float32 [P, K]: the target's probabilities of them, renormalized to sum to 1


@dataclass(frozen=True)
class Example:
    ids: list[int]   # prompt + continuation (+ EOS), draft tokens
    n_loss: int      # the last n_loss tokens are the continuation: the ones with a loss
    soft: Optional[SoftLabels] = None


def make_examples(records: list[dict[str, Any]], bundle: Bundle, max_len: int) -> tuple[list[Example], list[Example]]:
    """(training, validation) examples in the draft's tokens, as the runtime tokenizes the draft's text, with the
    target's distribution where the records carry it."""
    encode = PromptTokenizer(bundle.draft.tokenizer_xml).encode
    vocab_map = bundle.load_vocab_map()
    retok = Retokenizer(encode, vocab_map.draft)
    eos = bundle.draft.special_tokens.get("eos_token_id")
    train, validation = [], []
    for record in records:
        prompt = encode(record["prompt"])
        continuation = retok.continuation(prompt, record["completion"].encode("utf-8"))
        if record["stop_reason"] == "eos" and eos is not None:
            continuation = continuation + [eos]
        if not continuation:
            continue
        ids = (prompt + continuation)[:max_len]
        n_loss = len(ids) - len(prompt)
        if n_loss < 1:
            continue
        soft = soft_labels(record, continuation[:n_loss], vocab_map)
        (train if record["split"] == "train" else validation).append(Example(ids, n_loss, soft))
    return train, validation


def soft_labels(record: dict[str, Any], continuation: list[int], vocab_map: VocabMap) -> Optional[SoftLabels]:
    """The target's recorded distribution at the positions where the draft's token is the target's own (it starts
    at the same byte of the text and spells the same bytes, or both are the EOS the vocabulary map pairs), over the
    recorded tokens the draft's vocabulary shares; None when the record has none (data from before it was
    recorded) or no position qualifies."""
    if "target_top" not in record:
        return None
    target_starts, offset = {}, 0
    for i, token in enumerate(record["target_ids"]):
        target_starts.setdefault(offset, i)
        piece = vocab_map.target.piece(token)
        offset += len(piece) if piece else 0
    positions, rows_ids, rows_weights, offset = [], [], [], 0
    for j, token in enumerate(continuation):
        i = target_starts.get(offset)
        piece = vocab_map.draft.piece(token)
        offset += len(piece) if piece else 0
        if i is None or vocab_map.target_to_draft[record["target_ids"][i]] != token:
            continue
        top_ids, top_logprobs = record["target_top"][i]
        mapped = vocab_map.target_to_draft[np.asarray(top_ids, dtype=np.int64)]
        probs = np.exp(np.asarray(top_logprobs, dtype=np.float64)) * (mapped != NO_TOKEN)
        if probs.sum() <= 0:
            continue
        positions.append(j)
        rows_ids.append(np.where(mapped != NO_TOKEN, mapped, token))
        rows_weights.append(probs / probs.sum())
    if not positions:
        return None
    width = max(len(row) for row in rows_ids)  # rows of fewer recorded tokens: padded with the label, weight 0
    ids = np.array([np.pad(row, (0, width - len(row)), constant_values=continuation[j])
                    for j, row in zip(positions, rows_ids)], dtype=np.int64)
    weights = np.array([np.pad(row, (0, width - len(row))) for row in rows_weights], dtype=np.float32)
    return SoftLabels(np.asarray(positions, dtype=np.int64), ids, weights)


# --- the model ------------------------------------------------------------------------------------------------

def import_torch():
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        from ...errors import MissingDependencyError
        raise MissingDependencyError(f"align trains the draft with torch and transformers ({exc}): install the "
                                     "export extra, `pip install 'edge-specdec[export]'`.") from None
    return torch, AutoModelForCausalLM


def decoder_layers(model):
    """The model's stack of decoder layers (the largest ModuleList of its base model)."""
    torch, _ = import_torch()
    lists = [m for m in model.base_model.children() if isinstance(m, torch.nn.ModuleList) and len(m)]
    if not lists:
        raise ExportError(f"align cannot find the decoder layers of {type(model).__name__}: it needs a model "
                          "whose base model holds its layers in one list (Llama, Qwen2, GPT-2, SmolLM, ...).")
    return max(lists, key=len)


def load_draft(source: Path, train_layers: Optional[int]):
    """The draft's original weights in float32, with all but the trained part frozen. Returns (model, the number of
    layers trained, the number of trainable parameters)."""
    torch, AutoModelForCausalLM = import_torch()
    torch.set_num_threads(os.cpu_count() or 1)
    from ..convert import quiet_libraries
    with quiet_libraries():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    layers = decoder_layers(model)
    n = len(layers)
    k = n if train_layers is None else min(max(1, train_layers), n)
    if k >= n:  # every layer: a full fine-tune, embeddings and output layer included
        for p in model.parameters():
            p.requires_grad_(True)
    else:
        for p in model.parameters():
            p.requires_grad_(False)
        in_layers = {id(p) for p in layers.parameters()}
        embeddings = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
        for layer in layers[n - k:]:
            for p in layer.parameters():
                p.requires_grad_(True)
        for p in model.base_model.parameters():  # the final norm: outside the layers, not an embedding
            if id(p) not in in_layers and id(p) not in embeddings:
                p.requires_grad_(True)
    model.train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return model, k, trainable


def sequence_loss(model, example: Example, precision: str = "fp32", soft_weight: float = 0.0):
    """Summed cross-entropy of the example's continuation tokens (logits only where there is a loss); with
    soft_weight, against the mixed labels where the example has the target's distribution (see above).

    precision "bf16": the forward pass under bfloat16 autocast (the weights and the optimizer stay float32)."""
    torch, _ = import_torch()
    ids = torch.tensor([example.ids[:-1]], dtype=torch.long)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(input_ids=ids, logits_to_keep=example.n_loss, use_cache=False).logits[0]
    labels = torch.tensor(example.ids[-example.n_loss:], dtype=torch.long)
    if not soft_weight or example.soft is None:
        return torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
    logp = torch.log_softmax(logits.float(), dim=-1)
    hard = -logp.gather(1, labels[:, None])[:, 0]
    soft = example.soft
    rows = torch.from_numpy(soft.positions)
    soft_ce = -(torch.from_numpy(soft.weights) * logp[rows].gather(1, torch.from_numpy(soft.ids))).sum(-1)
    return hard.sum() + soft_weight * (soft_ce - hard[rows]).sum()


def validation_loss(model, examples: list[Example], precision: str = "fp32") -> float:
    torch, _ = import_torch()
    total, count = 0.0, 0
    with torch.no_grad():
        for example in examples[:VALIDATION_MAX]:
            total += sequence_loss(model, example, precision).item()
            count += example.n_loss
    return total / max(1, count)


def probe_rate(source: Path, train_layers: Optional[int], sequence_tokens: int, vocab: int) -> dict[str, float]:
    """Training tokens per second on this machine, per precision (fp32, and bf16 autocast, which is faster only on
    CPUs with native bfloat16 arithmetic): a sequence of the expected length forward and backward with the layers
    that training will train, twice after one untimed pass (which prepares the kernels); the faster of the two."""
    torch, _ = import_torch()
    model, _, _ = load_draft(source, train_layers)
    rng = np.random.default_rng(0)
    example = Example(rng.integers(0, vocab, sequence_tokens).tolist(), max(1, sequence_tokens * 3 // 4))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.0)
    rates = {}
    for precision in PRECISIONS:
        times = []
        for _ in range(3):
            start = time.perf_counter()
            sequence_loss(model, example, precision).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - start)
        rates[precision] = sequence_tokens / min(times[1:])
    del model, optimizer
    return rates


# --- training -------------------------------------------------------------------------------------------------

def plan_steps(settings: TrainSettings, train: list[Example], seconds: float, rate: float) -> tuple[int, str]:
    """Optimizer steps: as many as the time for training allows at the measured rate, at most `epochs` passes.
    Returns (steps, what limited them)."""
    tokens = sum(len(e.ids) for e in train)
    by_epochs = epoch_steps(settings, tokens)
    by_time = max(1, int(seconds / TRAINING_OVERHEAD * rate / settings.batch_tokens))
    if by_time < by_epochs:
        return by_time, f"the time left ({seconds / 60:.1f} min at {rate:.0f} tokens/s)"
    return by_epochs, f"{settings.epochs:g} epochs of {tokens:,} tokens"


def replan(settings: TrainSettings, state: dict[str, Any], epoch_tokens: int, seconds_left: float) -> int:
    """The planned steps again, from the rate training has had so far (validation included), which can differ
    much from the probe's on a shared machine: as many more steps as the time left allows, at most `epochs`
    passes in all."""
    more = int(max(0.0, seconds_left) / REPLAN_MARGIN * measured_rate(state) / settings.batch_tokens)
    return max(state["step"], min(epoch_steps(settings, epoch_tokens), state["step"] + more))


def epoch_steps(settings: TrainSettings, epoch_tokens: int) -> int:
    """The optimizer steps of `epochs` passes over a training split of epoch_tokens tokens."""
    return max(1, math.ceil(settings.epochs * epoch_tokens / settings.batch_tokens))


def measured_rate(state: dict[str, Any]) -> float:
    """Training tokens per second so far in this align (validation included), from the training state."""
    return state["train_tokens"] / max(state["seconds"], 1e-9)


def validation_interval(settings: TrainSettings, planned: int, validation: list[Example]) -> int:
    """Steps between validation passes: `evals` over the planned steps, fewer when the passes would cost more
    than VALIDATION_SHARE of the training (a forward pass costs about a third of a training step per token)."""
    tokens = sum(len(e.ids) for e in validation[:VALIDATION_MAX])
    affordable = int(VALIDATION_SHARE * 3 * planned * settings.batch_tokens / max(1, tokens))
    evals = max(1, min(settings.evals, affordable, planned))
    return max(1, planned // evals)


def learning_rate(settings: TrainSettings, step: int, planned: int) -> float:
    warmup = max(1, int(WARMUP_SHARE * planned))
    if step < warmup:
        return settings.learning_rate * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, planned - warmup))
    floor = FINAL_LR_SHARE * settings.learning_rate
    return floor + (settings.learning_rate - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def train_draft(source: Path, bundle: Bundle, work: WorkFolder, settings: TrainSettings, rate: float,
                precision: str, deadline: Callable[[], float], say: Callable[[str], None],
                on_step: Optional[Callable[[int], None]] = None) -> dict[str, Any]:
    """Train, keep the best weights, and save the draft as a Hugging Face folder in work.draft_hf.

    rate: the probe's training tokens per second at `precision` (for the plan); deadline(): seconds left for
    training.
    on_step(step) is called after every optimizer step (the tests stop a run there)."""
    torch, _ = import_torch()
    start_time = time.monotonic()
    model, k, trainable = load_draft(source, settings.train_layers)
    max_len = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
    records, damaged = work.scan_data()
    if damaged:
        say(f"train: {damaged} damaged lines in {work.data_file.name} skipped; training on its {len(records)} intact "
            "records")
    train, validation = make_examples(records, bundle, max_len)
    if not train:
        raise ExportError(f"align has no training text: {work.data_file} holds no record of the training split "
                          f"({len(records)} records in all). Generation stops when the budget runs out: give more "
                          "--minutes, or more prompts with --prompts; if the file was deleted or moved, put it back "
                          "and run again with --resume.")
    if not validation:  # a tiny data set: measure on the training text rather than not at all
        validation = train[:VALIDATION_MAX]
    without = sum(e.soft is None for e in train)
    if settings.soft_weight > 0 and without:
        say(f"train: {without} of {len(train)} sequences have no recorded distribution of the target (text generated "
            "without --soft-weight, or no position where the tokenizations agree): those learn the tokens only")
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=0.0)
    work.train_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = work.train_dir / CHECKPOINT
    layers_total = len(decoder_layers(model))
    if ckpt_path.is_file():
        state, best_state = load_checkpoint(ckpt_path, model, optimizer, names)
        if len(state["order"] or ()) != len(train):  # the data changed since (damaged lines generated again)
            say(f"train: {len(train)} training sequences now against {len(state['order'])} at the checkpoint: the "
                "epoch goes on in a new order")
            state["order"], state["position"] = None, 0
        say(f"train: resuming at step {state['step']}/{state['planned']} (best validation loss "
            f"{state['best_loss']:.4f} at step {state['best_step']})")
    else:
        planned, limit = plan_steps(settings, train, deadline(), rate)
        initial = validation_loss(model, validation, precision)
        state = {"step": 0, "planned": planned, "epoch": 0, "position": 0, "order": None,
                 "best_loss": initial, "best_step": 0, "initial_loss": initial, "since_best": 0,
                 "history": [{"step": 0, "validation_loss": initial}], "train_tokens": 0, "seconds": 0.0}
        best_state = _trainable(model, names)
        say(f"train: {len(train)} sequences ({sum(len(e.ids) for e in train):,} draft tokens), {len(validation)} "
            f"for validation; the top {k} of {layers_total} layers ({trainable / 1e6:.1f}M parameters), {precision}; "
            f"{planned} steps of {settings.batch_tokens} tokens, limited by {limit}; validation loss "
            f"{initial:.4f} before training")
    every = validation_interval(settings, state["planned"], validation)
    epoch_tokens = sum(len(e.ids) for e in train)
    rng = random.Random(settings.seed + state["epoch"])
    if state["order"] is None:
        state["order"] = list(range(len(train)))
        rng.shuffle(state["order"])

    last_save = last_line = time.monotonic()

    def save_checkpoint() -> None:
        nonlocal last_save
        tmp = ckpt_path.with_suffix(".tmp")
        best = None if state["best_step"] == state["step"] else best_state  # the current weights: saved anyway
        current = {name: p.detach() for name, p in model.named_parameters() if p.requires_grad}
        torch.save({"trainable": current, "optimizer": optimizer.state_dict(), "state": state,
                    "best_state": best}, tmp)
        os.replace(tmp, ckpt_path)
        last_save = time.monotonic()

    stop_reason = "the planned steps"
    session_start = time.monotonic()
    train_loss, train_count = 0.0, 0
    step_seconds = None  # measured: the first step of a run is taken whatever the probe predicted
    try:
        while state["step"] < state["planned"]:
            if step_seconds is not None and deadline() < step_seconds:
                stop_reason = "the time budget"
                break
            t0 = time.perf_counter()
            batch, tokens = [], 0
            while tokens < settings.batch_tokens:
                if state["position"] >= len(state["order"]):  # the next epoch, in a new order
                    state["epoch"] += 1
                    state["position"] = 0
                    state["order"] = list(range(len(train)))
                    random.Random(settings.seed + state["epoch"]).shuffle(state["order"])
                example = train[state["order"][state["position"]]]
                state["position"] += 1
                batch.append(example)
                tokens += len(example.ids)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(settings, state["step"], state["planned"])
            n_loss = sum(e.n_loss for e in batch)
            for example in batch:
                loss = sequence_loss(model, example, precision, settings.soft_weight) / n_loss
                loss.backward()
                train_loss += loss.item() * n_loss
            train_count += n_loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            state["step"] += 1
            state["train_tokens"] += tokens
            step_seconds = time.perf_counter() - t0
            if on_step is not None:
                on_step(state["step"])
            validating = state["step"] % every == 0 or state["step"] == state["planned"]
            if not validating and time.monotonic() - last_line >= PROGRESS_SECONDS:
                last_line = time.monotonic()
                seconds = state["seconds"] + time.monotonic() - session_start
                say(f"train: step {state['step']}/{state['planned']}, train loss "
                    f"{train_loss / max(1, train_count):.4f} since the last validation, "
                    f"{state['train_tokens'] / max(seconds, 1e-9):.0f} tokens/s, eta "
                    f"{(state['planned'] - state['step']) * seconds / state['step'] / 60:.1f} min")
            if validating:
                val = validation_loss(model, validation, precision)
                mean_train = train_loss / max(1, train_count)
                train_loss, train_count = 0.0, 0
                state["history"].append({"step": state["step"], "train_loss": mean_train, "validation_loss": val})
                if val < state["best_loss"] - 1e-4:
                    state["best_loss"], state["best_step"], state["since_best"] = val, state["step"], 0
                    best_state = _trainable(model, names)
                else:
                    state["since_best"] += 1
                state["seconds"] += time.monotonic() - session_start
                session_start = time.monotonic()
                eta = (state["planned"] - state["step"]) * state["seconds"] / state["step"]
                last_line = time.monotonic()
                say(f"train: step {state['step']}/{state['planned']} (epoch {state['epoch'] + 1}), train loss "
                    f"{mean_train:.4f}, validation loss {val:.4f} (best {state['best_loss']:.4f}), "
                    f"{measured_rate(state):.0f} tokens/s, "
                    f"{state['seconds'] / 60:.1f} min so far, eta {eta / 60:.1f} min")
                planned = replan(settings, state, epoch_tokens, deadline())
                if planned != state["planned"]:
                    say(f"train: re-planned from {state['planned']} to {planned} steps at the measured "
                        f"{measured_rate(state):.0f} tokens/s")
                    state["planned"] = planned
                    every = validation_interval(settings, planned, validation)
                if time.monotonic() - last_save >= CHECKPOINT_SECONDS:
                    save_checkpoint()
                if state["since_best"] >= settings.patience:
                    stop_reason = f"early stopping ({settings.patience} validations without a better loss)"
                    break
    except KeyboardInterrupt:
        state["seconds"] += time.monotonic() - session_start
        save_checkpoint()
        raise
    state["seconds"] += time.monotonic() - session_start
    _set_trainable(model, best_state)
    save_draft(model, source, work.draft_hf)
    say(f"train: stopped by {stop_reason} at step {state['step']}; kept the weights of step {state['best_step']} "
        f"(validation loss {state['initial_loss']:.4f} -> {state['best_loss']:.4f})")
    return {"data": data_totals(records),  # what this training read of data.jsonl: the manifest's counts
            "steps": state["step"], "planned_steps": state["planned"], "best_step": state["best_step"],
            "stopped_by": stop_reason, "epochs": round(state["train_tokens"] / sum(len(e.ids) for e in train), 3),
            "train_sequences": len(train), "validation_sequences": min(len(validation), VALIDATION_MAX),
            "train_draft_tokens": sum(len(e.ids) for e in train), "trained_tokens": state["train_tokens"],
            "loss_positions": sum(e.n_loss for e in train),
            "positions_with_target_distribution": sum(len(e.soft.positions) for e in train if e.soft),
            "validation_loss_before": round(state["initial_loss"], 5),
            "validation_loss_after": round(state["best_loss"], 5),
            "history": state["history"], "layers_trained": k, "layers": layers_total,
            "trainable_parameters": trainable, "precision": precision, "settings": settings.to_record(),
            "seconds": round(time.monotonic() - start_time, 1)}


def load_checkpoint(path: Path, model, optimizer, names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore the weights and the optimizer from the checkpoint; (the training state, the best weights so far).
    A checkpoint that cannot be read whole (a crash or a full disk while it was written, or damage since) is one
    line that says how to go on, not torch's traceback."""
    torch, _ = import_torch()
    try:
        ckpt = torch.load(path, weights_only=False)
        _set_trainable(model, ckpt["trainable"])
        optimizer.load_state_dict(ckpt["optimizer"])
        state = ckpt["state"]
        missing = [key for key in STATE_KEYS if key not in state]
        if missing:
            raise KeyError(f"its training state has no {missing[0]!r}")
        best_state = ckpt["best_state"] if ckpt["best_state"] is not None else _trainable(model, names)
    except Exception as exc:  # noqa: BLE001 - whatever torch or pickle raise for a damaged file
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ExportError(f"train: the checkpoint {path} is damaged ({type(exc).__name__}: {reason}): delete it and "
                          "run again with --resume to train from the start (the generated text is kept).") from None
    return state, best_state


def _trainable(model, names: list[str]) -> dict[str, Any]:
    params = dict(model.named_parameters())
    return {name: params[name].detach().clone() for name in names}


def _set_trainable(model, state: dict[str, Any]) -> None:
    torch, _ = import_torch()
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def save_draft(model, source: Path, out: Path) -> None:
    """The fine-tuned draft as a Hugging Face folder: its weights and config, and the source's tokenizer files."""
    from ..convert import quiet_libraries
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with quiet_libraries():
        model.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        if (source / name).is_file() and not (tmp / name).exists():
            shutil.copy2(source / name, tmp / name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
