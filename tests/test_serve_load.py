"""The bounded load test (benchmarks/serve_load.py) in the suite: 64 greedy requests from 8 concurrent clients on
the demo (the script's 200 took 2 minutes of the suite; 64 still keeps every slot and the queue busy for many
rounds), through OpenAI's client on loopback; none lost, none failed, every output the target alone's."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("openai", reason="the server tests need the test extra: pip install -e '.[test,serve]'")
pytest.importorskip("uvicorn", reason="the server tests need the serve extra: pip install -e '.[test,serve]'")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from serve_helpers import serve_in_thread  # noqa: E402
from serve_load import PROMPTS, run_load  # noqa: E402

from edge_specdec.demo import DEMO_BUNDLE  # noqa: E402
from edge_specdec.runtime import Engine, GenerationConfig  # noqa: E402
from edge_specdec.serve import ServerSettings  # noqa: E402

pytestmark = pytest.mark.slow  # starts a server or a process: see pyproject.toml

MAX_TOKENS = 32
REQUESTS = 64  # 8 per client


def test_64_requests_from_8_clients_are_all_exact():
    engine = Engine(DEMO_BUNDLE)
    alone = engine.session()
    config = GenerationConfig(max_new_tokens=MAX_TOKENS, temperature=0)  # + the demo's recorded defaults
    references = {p: alone.generate(p, config, algorithm="none").text for p in PROMPTS}
    assert len(set(references.values())) > len(PROMPTS) // 2  # the prompts lead to different outputs
    with serve_in_thread(ServerSettings(slots=2, queue=8), engine) as running:
        report = run_load(running.api, references, requests=REQUESTS, clients=8, max_tokens=MAX_TOKENS)
        served = running.server.metrics
        assert not report.wrong, report.wrong[:5]
        assert len(report.latencies) == REQUESTS
        assert served.value("requests_total", endpoint="completion", outcome="ok") == REQUESTS
        assert served.value("draft_tokens_accepted_total") > 0  # the draft did take part
    print(report.summary())
