"""The rows of the clients benchmark (`edge-specdec bench clients`), how --setups chooses among them, and what
one round of a row records: each client's request, the round's wall time."""
from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Callable, Optional, Sequence

from ..errors import EdgeSpecdecError
from .prompt_set import Prompt


@dataclass(frozen=True)
class ClientSpec:
    """A row of the clients benchmark."""
    name: str
    engine: str  # "ours" or "genai"
    algorithm: str  # ours: "none" or "auto"; genai: "none" or "sd"
    concurrent: bool  # False: the N requests one after another
    description: str


CLIENT_SETUPS = (
    ClientSpec("ours-none-sequential", "ours", "none", False,
               "ours, the target alone, the N requests one after another (each one served alone: the reference "
               "of the identity checks)"),
    ClientSpec("ours-spec-sequential", "ours", "auto", False,
               "ours, speculative decoding (algorithm auto), the N requests one after another (the baseline of "
               "batching)"),
    ClientSpec("ours-none", "ours", "none", True,
               "ours, the target alone, N client threads at once on one Engine(batching=True)"),
    ClientSpec("ours-spec", "ours", "auto", True,
               "ours, speculative decoding (algorithm auto), N client threads at once on one Engine(batching=True)"),
    ClientSpec("genai-cb-none", "genai", "none", True,
               "OpenVINO GenAI ContinuousBatchingPipeline, the target alone, N requests at once"),
    ClientSpec("genai-cb-sd", "genai", "sd", True,
               "OpenVINO GenAI ContinuousBatchingPipeline with a same-vocabulary draft, N requests at once"),
)
SETUP_NAMES = tuple(s.name for s in CLIENT_SETUPS)
REFERENCE = "ours-none-sequential"
# each row's identity is checked against the first run of its reference on the same prompt
BASELINES = {"ours-none-sequential": REFERENCE, "ours-spec-sequential": REFERENCE, "ours-none": REFERENCE,
             "ours-spec": REFERENCE, "genai-cb-none": "genai-cb-none", "genai-cb-sd": "genai-cb-none"}


@dataclass
class ClientPrompt(Prompt):
    """A prompt with the token ids that both engines get."""
    ids: list[int] = field(default_factory=list)


@dataclass
class Request:
    """One client's request in one round."""
    prompt: str  # the prompt's key, category/id
    token_ids: list[int]
    text: str
    seconds: float  # concurrent rows: from the round's start to this client's end; sequential: its own duration
    ttft_ms: Optional[float]
    tpot_ms: Optional[float]
    proposed: Optional[int] = None  # ours: draft tokens proposed / accepted
    accepted: Optional[int] = None
    engine_ttft_ms: Optional[float] = None  # GenAI's own per-request perf metrics, for comparison
    engine_tpot_ms: Optional[float] = None

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Round:
    """One row serving N clients once."""
    setup: str
    clients: int
    repeat: int  # -1: the warm-up
    wall_seconds: float
    requests: list[Request]
    batched_calls: Optional[int] = None  # ours with batching: model calls that ran several sessions' blocks at once
    batched_sequences: Optional[int] = None  # and the sessions' blocks in them

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.requests)

    @property
    def aggregate_tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0


@dataclass
class Row:
    spec: ClientSpec
    run: Callable[[list[ClientPrompt]], Round]  # fills wall_seconds and requests; the caller sets setup/clients/repeat
    rounds: list[Round] = field(default_factory=list)
    failures: list[dict] = field(default_factory=list)  # {"clients", "repeat", "error"}


def select_client_setups(patterns: Optional[Sequence[str]]) -> tuple[list[ClientSpec], list[str]]:
    """Every row, or those --setups names (names or shell patterns); the references of the rows picked are added
    (ours-none-sequential for ours, genai-cb-none for genai-cb-sd): their identity check needs them."""
    if not patterns:
        return list(CLIENT_SETUPS), []
    chosen: set[str] = set()
    for pattern in patterns:
        hits = [n for n in SETUP_NAMES if fnmatchcase(n, pattern)]
        if not hits:
            raise EdgeSpecdecError(f"unknown setup {pattern!r} for --clients: choose from {', '.join(SETUP_NAMES)} "
                                   f"(or a pattern such as 'ours-*').")
        chosen.update(hits)
    notes = []
    for name in sorted(chosen):
        base = BASELINES[name]
        if base not in chosen:
            chosen.add(base)
            notes.append(f"added {base}: the reference of {name}'s identity check")
    return [s for s in CLIENT_SETUPS if s.name in chosen], notes

