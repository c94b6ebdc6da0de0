"""The demo pair that ships inside the package (edge_specdec/data/demo_bundle): `edge-specdec run` without a
bundle runs it. It was trained by models/train_demo_pair.py; models/demo/README.md has its figures."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

DATA = Path(__file__).resolve().parent / "data"
DEMO_BUNDLE = DATA / "demo_bundle"

# The demo's target has 6.8M parameters: greedy, it soon repeats one token run (`**kwargs,` forty times after
# `def parse_args(`). A repetition penalty turns that into varied Python. It is lossless here (penalize() treats
# every verified row exactly as one-token-at-a-time decoding would), so the output stays the target's own. It
# is the demo's default only: other bundles keep 1.0 unless --repetition-penalty says otherwise.
DEMO_REPETITION_PENALTY = 1.2


def is_demo(bundle: str | Path) -> bool:
    return Path(bundle).resolve() == DEMO_BUNDLE


def run_defaults(bundle: Optional[str], repetition_penalty: Optional[float]) -> tuple[str, float]:
    """`run`'s bundle and repetition penalty: no bundle means the demo; no penalty means the demo's own
    default for the demo, else 1.0 (off). Values given on the command line are kept as they are."""
    bundle = str(DEMO_BUNDLE) if bundle is None else bundle
    if repetition_penalty is None:
        repetition_penalty = DEMO_REPETITION_PENALTY if is_demo(bundle) else 1.0
    return bundle, repetition_penalty
