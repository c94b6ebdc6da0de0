"""Generation options and the logits -> distribution transform, applied identically to target and draft."""
from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter
from dataclasses import dataclass, field, fields
from numbers import Integral, Real
from typing import Optional

import numpy as np

from ..errors import EdgeSpecdecError
from .constraint import Constraint


MAX_TOP_LOGPROBS = 20  # as in OpenAI's API
# Where the arithmetic stays sound. Logits (float32) are penalized in float32 and divided by the temperature in
# float64: a penalty of 1e-300 or a temperature of 1e-310 overflows them to inf, and inf - inf is NaN, which then
# picks the last token id every time. Six orders of magnitude either side of 1 keep any logit under 1e30 finite
# through both, and go far past any setting a user could want.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-6, 1e6
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 1e-6, 1e6
MAX_PRESENCE_PENALTY = MAX_FREQUENCY_PENALTY = 2.0  # OpenAI's range for both: -2 to 2
MAX_LOGIT_BIAS = 100.0  # OpenAI's range: -100 (the token never comes) to 100 (it always does)


def records_fields_set(cls):
    """A dataclass that records which of its fields the caller set (`fields_set`): those its constructor was given,
    by keyword or position, and those assigned later. The rest hold the class's defaults and may take a bundle's
    instead (GenerationConfig.with_defaults). It covers every field the class has, so a field added later needs
    nothing more. `dataclasses.replace` passes every field to the constructor: its copy has every field set."""
    init, names = cls.__init__, [f.name for f in fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.__dict__["_fields_set"] = set(names[:len(args)]) | set(kwargs)

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        if "_fields_set" in self.__dict__ and name in names:
            self._fields_set.add(name)

    cls.__init__, cls.__setattr__ = __init__, __setattr__
    return cls


@records_fields_set
@dataclass
class GenerationConfig:
    """The options users know from Hugging Face and OpenVINO GenAI.

    A field the caller does not set takes the bundle's default, which its manifest records (`edge-specdec info`
    shows it; export writes it only when told to, with --generation-default): `GenerationConfig(max_new_tokens=64)`
    on the demo keeps its repetition penalty, and `repetition_penalty=1.0` set explicitly switches it off. The
    defaults below hold where the bundle records none.

    temperature 0 means greedy decoding; top_k 0 and top_p 1.0 switch those filters off. eos_token_ids None
    takes the bundle's; stop_strings end generation once the text contains one of them (the text is cut
    before it). repetition_penalty (1.0 = off) works as in Hugging Face: the logit of every token already in
    the prompt or the output is divided by it when positive, multiplied when negative. presence_penalty and
    frequency_penalty (0 = off, -2 to 2) work as in OpenAI's API and count the output only, not the prompt: a token
    the output holds n times loses presence_penalty + n * frequency_penalty from its logit. logit_bias (empty =
    off): target token id -> a number from -100 to 100 added to that token's logit first. min_p (0 = off, up to 1)
    works as in vLLM and llama-server: a token is dropped when its probability (after the temperature, top-k and
    top-p) is under min_p times the most likely token's; like top-k and top-p, it changes sampled runs only.
    logprobs: put on the result the target's log-probability of each output token, from the logits that decided
    it (after logit_bias, the penalties and the temperature, before top-k, top-p and min-p); top_logprobs (at most
    MAX_TOP_LOGPROBS) adds that many most likely tokens per position and implies logprobs.
    constraint: the output must match it (a JSON schema, any JSON object, a regex or a grammar; see
    constraint.Constraint): the target's logits are masked to what it allows at every position, and the logprobs
    are those of the masked distribution.
    """
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: Optional[int] = None
    eos_token_ids: Optional[list[int]] = None
    stop_strings: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    logprobs: bool = False
    top_logprobs: int = 0
    constraint: Optional[Constraint] = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> "GenerationConfig":
        """Refuse what decoding cannot honour soundly: wrong types, NaN and infinities, and values out of bounds.

        Every way in (the Python API, `run`, the server) goes through here; each check is a comparison that NaN
        cannot slip through (`not low <= x <= high`), after the value is known to be a finite number."""
        for name in ("max_new_tokens", "top_k", "top_logprobs"):
            _integer(name, getattr(self, name))
        for name in ("logprobs", "ignore_eos"):
            if not isinstance(getattr(self, name), bool):
                raise EdgeSpecdecError(f"{name} must be True or False (got {getattr(self, name)!r})"
                                       + ("; top_logprobs=N asks for the N most likely tokens too."
                                          if name == "logprobs" else "."))
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, Integral)
                                      or self.seed < 0):
            raise EdgeSpecdecError(f"seed must be a whole number from 0, or None (got {self.seed!r}).")
        if isinstance(self.stop_strings, str) or not isinstance(self.stop_strings, (list, tuple)) \
                or not all(isinstance(stop, str) and stop for stop in self.stop_strings):
            raise EdgeSpecdecError(f"stop_strings must be a list of strings, not empty ones (got "
                                   f"{self.stop_strings!r}); one stop string is stop_strings=[text].")
        if self.eos_token_ids is not None and (
                not isinstance(self.eos_token_ids, (list, tuple))
                or not all(isinstance(t, Integral) and not isinstance(t, bool) and t >= 0 for t in self.eos_token_ids)):
            raise EdgeSpecdecError(f"eos_token_ids must be a list of token ids, or None for the bundle's (got "
                                   f"{self.eos_token_ids!r}); one id is eos_token_ids=[id].")
        for name in ("temperature", "top_p", "repetition_penalty", "min_p", "presence_penalty", "frequency_penalty"):
            _finite(name, getattr(self, name))
        if self.max_new_tokens < 1:
            raise EdgeSpecdecError(f"max_new_tokens must be at least 1 (got {self.max_new_tokens}).")
        if self.temperature != 0 and not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            raise EdgeSpecdecError(f"temperature must be 0 (greedy) or between {MIN_TEMPERATURE:g} and "
                                   f"{MAX_TEMPERATURE:g} (got {self.temperature!r}).")
        if self.top_k < 0:
            raise EdgeSpecdecError(f"top_k must be >= 0 (got {self.top_k}); 0 switches it off.")
        if not 0.0 < self.top_p <= 1.0:
            raise EdgeSpecdecError(f"top_p must be in (0, 1] (got {self.top_p}); 1.0 switches it off.")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise EdgeSpecdecError(f"repetition_penalty must be between {MIN_REPETITION_PENALTY:g} and "
                                   f"{MAX_REPETITION_PENALTY:g} (got {self.repetition_penalty!r}); 1.0 switches it "
                                   f"off.")
        if not 0.0 <= self.min_p <= 1.0:
            raise EdgeSpecdecError(f"min_p must be between 0 and 1 (got {self.min_p!r}); 0 switches it off.")
        for name, bound in (("presence_penalty", MAX_PRESENCE_PENALTY), ("frequency_penalty", MAX_FREQUENCY_PENALTY)):
            if not -bound <= getattr(self, name) <= bound:
                raise EdgeSpecdecError(f"{name} must be between {-bound:g} and {bound:g} (got "
                                       f"{getattr(self, name)!r}); 0 switches it off.")
        _logit_bias(self.logit_bias)
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise EdgeSpecdecError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS} (got "
                                   f"{self.top_logprobs}).")
        if self.constraint is not None:
            if not isinstance(self.constraint, Constraint):
                raise EdgeSpecdecError(f"constraint must be a Constraint (from edge_specdec.runtime.constraint), not "
                                       f"{self.constraint!r}.")
            self.constraint.check()
        return self

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0

    @property
    def fields_set(self) -> frozenset:
        """The names of the fields the caller set (see records_fields_set); the others may take a bundle's
        defaults."""
        return frozenset(self._fields_set)

    def with_defaults(self, defaults: "GenerationConfig") -> "GenerationConfig":
        """A copy in which every field the caller did not set takes its value in `defaults` (a bundle's); the copy
        has every field set."""
        return dataclasses.replace(defaults, **{name: getattr(self, name) for name in self.fields_set})

    def pinned(self) -> "GenerationConfig":
        """A copy with every field set, so that no bundle's defaults apply: what a benchmark or a check measures
        is then what its config says, on any bundle."""
        return dataclasses.replace(self)

    @property
    def adjusts_logits(self) -> bool:
        """Whether penalize() changes anything: a logit bias or a penalty is on."""
        return bool(self.logit_bias) or self.repetition_penalty != 1.0 or self.counts_output

    @property
    def counts_output(self) -> bool:
        """Whether a presence or frequency penalty is on (they count the output's tokens)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _logit_bias(bias) -> None:
    """logit_bias: a dict of token ids (whole numbers from 0) to numbers from -MAX_LOGIT_BIAS to MAX_LOGIT_BIAS."""
    if not isinstance(bias, dict):
        raise EdgeSpecdecError(f"logit_bias must be a dict of token ids to numbers (got {bias!r}).")
    for token, value in bias.items():
        if isinstance(token, bool) or not isinstance(token, Integral) or token < 0:
            raise EdgeSpecdecError(f"logit_bias keys must be token ids, whole numbers from 0 (got {token!r}).")
        _finite(f"logit_bias[{token}]", value)
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise EdgeSpecdecError(f"logit_bias[{token}] must be between {-MAX_LOGIT_BIAS:g} and "
                                   f"{MAX_LOGIT_BIAS:g} (got {value!r}).")


def _integer(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise EdgeSpecdecError(f"{name} must be an integer (got {value!r}).")


def _finite(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise EdgeSpecdecError(f"{name} must be a finite number (got {value!r}).")


def penalize(rows: np.ndarray, config: GenerationConfig, context: list[int], block: list[int],
             prompt_length: int = 0) -> np.ndarray:
    """Apply logit_bias, then the repetition penalty, then the presence and frequency penalties to logits rows for
    context + block[:i] (row i follows block[:i]); context[prompt_length:] is the output so far.

    The repetition penalty counts the tokens of the prompt and the output, the presence and frequency penalties
    those of the output only. Row by row the counts are exactly what one-token-at-a-time decoding would have seen,
    so a speculative round and the target alone compute the same distributions: the penalties stay lossless.
    """
    if not config.adjusts_logits:  # (the rows as they are: the caller's own copy, float32 as the models write them)
        return rows if rows.dtype == np.float32 else rows.astype(np.float32)
    rows = np.array(rows, dtype=np.float32)
    if config.logit_bias:
        ids = np.fromiter(config.logit_bias, dtype=np.int64, count=len(config.logit_bias))
        rows[:, ids] += np.array(list(config.logit_bias.values()), dtype=np.float32)
    seen = np.unique(np.asarray(context, dtype=np.int64))
    written = Counter(context[prompt_length:])
    for i in range(len(rows)):
        if config.repetition_penalty != 1.0:
            x = rows[i, seen]
            rows[i, seen] = np.where(x > 0, x / config.repetition_penalty, x * config.repetition_penalty)
        if config.counts_output and written:
            ids = np.fromiter(written, dtype=np.int64, count=len(written))
            counts = np.fromiter(written.values(), dtype=np.float64, count=len(written))
            rows[i, ids] -= (config.presence_penalty + config.frequency_penalty * counts).astype(np.float32)
        if i < len(block):
            seen = np.union1d(seen, [block[i]])
            written[block[i]] += 1
    return rows


def distribution(logits: np.ndarray, config: GenerationConfig) -> np.ndarray:
    """Rows of logits -> rows of probabilities (float64) after temperature, top-k, top-p and min-p."""
    x = np.asarray(logits, dtype=np.float64) / config.temperature
    if config.top_k and config.top_k < x.shape[-1]:
        kth = np.partition(x, -config.top_k, axis=-1)[..., -config.top_k, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if config.top_p < 1.0:
        order = np.argsort(-p, axis=-1)
        sorted_p = np.take_along_axis(p, order, axis=-1)
        # keep the smallest set whose mass reaches top_p: a token stays if the mass before it is < top_p
        keep_sorted = (np.cumsum(sorted_p, axis=-1) - sorted_p) < config.top_p
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    if config.min_p > 0.0:  # relative to the most likely token, which always stays
        p = np.where(p >= config.min_p * p.max(axis=-1, keepdims=True), p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from a probability vector (inverse CDF; robust to rounding)."""
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(p) - 1))


@dataclass
class TokenLogprob:
    """One output token with the target's log-probability of it, and the most likely tokens at its position
    (token id, log-probability; most likely first)."""
    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


def token_logprobs(rows: np.ndarray, tokens: list[int], config: GenerationConfig) -> list[TokenLogprob]:
    """The log-probabilities of tokens[i] under rows[i] (penalized logits), at the config's temperature.

    Each row is reduced on its own in float64, so equal logits bits give equal logprob bits, whichever
    algorithm produced the row."""
    out = []
    for row, token in zip(rows, tokens):
        x = np.asarray(row, dtype=np.float64) / (config.temperature or 1.0)
        top = x.max()
        logp = x - (top + np.log(np.exp(x - top).sum()))
        best = []
        if config.top_logprobs:
            ids = np.argpartition(-logp, config.top_logprobs - 1)[:config.top_logprobs]
            ids = sorted(ids.tolist(), key=lambda i: (-logp[i], i))
            best = [(int(i), float(logp[i])) for i in ids if np.isfinite(logp[i])]  # not ids a grammar forbids
        out.append(TokenLogprob(int(token), float(logp[token]), best))
    return out
