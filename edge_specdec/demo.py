"""The demo pair that ships inside the package (edge_specdec/data/demo_bundle): `edge-specdec run` without a
bundle runs it. It was trained by models/train_demo_pair.py; models/demo/README.md has its figures."""
from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
DEMO_BUNDLE = DATA / "demo_bundle"

# The demo's target has 6.8M parameters: greedy, it soon repeats one token run (`**kwargs,` forty times after
# `def parse_args(`). Its manifest therefore records a repetition penalty of 1.2 as its default
# (`generation_defaults`, which every front end applies to the fields a request leaves unset), which turns that
# into varied Python. It is lossless (penalize() treats every verified row exactly as one-token-at-a-time decoding
# would), so the output stays the target's own.


def is_demo(bundle: str | Path) -> bool:
    return Path(bundle).resolve() == DEMO_BUNDLE
