"""The named suites of `edge-specdec bench`: the help lists them, and each one runs on the demo pair (no BUNDLE), a
few tokens long, writing its report the way every suite does."""
from __future__ import annotations

import json
import sys
import time
import types

import pytest

from edge_specdec.benchmark.suites import SUITES, load_suite
from edge_specdec.benchmark.suites.long_prompts import SOURCE as PACKAGE_SOURCES
from edge_specdec.cli import main
from edge_specdec.demo import DEMO_BUNDLE
from support import spy_prompt_reuse


def run_suite(capsys, tmp_path, name: str, *args: str) -> dict:
    """`edge-specdec bench NAME ARGS --out DIR` on the demo pair; its report.json, once report.md was printed."""
    out = tmp_path / name
    assert main(["bench", name, *args, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"# edge-specdec bench {name}: demo_bundle")
    assert (out / "report.md").read_text().rstrip("\n") == printed.rstrip("\n")
    return json.loads((out / "report.json").read_text())


def rows_of(report: dict) -> dict[str, dict]:
    return {r["setup"]: r for r in report["setups"]}


def warm_caches(monkeypatch, tmp_path) -> None:
    """The suite's fresh processes share a cache folder of the test's own, as a user's runs share the default one:
    OpenVINO's compiled models and the engine's measurements, made by the first process that needs them, instead
    of each process compiling and probing again (the tests' default is no cache)."""
    monkeypatch.setenv("EDGE_SPECDEC_CACHE_DIR", str(tmp_path / "cache"))


def test_help_lists_every_suite(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: edge-specdec bench [SUITE] [BUNDLE]")
    for name in SUITES:
        assert f"  {name}  " in text, name
        assert " ".join(load_suite(name).SUMMARY.split()[:4]) in " ".join(text.split()), name


def test_a_suite_has_its_own_options(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "conversation", "--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: edge-specdec bench conversation") and "--turns" in text and "--ks" not in text
    with pytest.raises(SystemExit) as stop:  # an option of another suite is refused by argparse
        main(["bench", "conversation", "--ks", "3"])
    assert stop.value.code == 2 and "unrecognized arguments: --ks" in capsys.readouterr().err


@pytest.mark.parametrize("name", [name for name in SUITES if name != "general"])
def test_a_suite_s_bad_bundle_or_out_is_one_clear_line(capsys, tmp_path, name):
    (tmp_path / "a-file").write_text("not a folder")
    for args, message in (([str(tmp_path / "no-such-bundle"), "--out", str(tmp_path / "out")], "does not exist"),
                          (["--out", str(tmp_path / "a-file")], "is a file: give a folder")):
        assert main(["bench", name, *args]) == 1
        err = capsys.readouterr().err
        assert err.startswith("edge-specdec: error: ") and message in err, err
        assert err.strip().count("\n") == 0
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing ran, nothing was written


def test_structured_answers_are_checked_against_their_schema():
    from edge_specdec.benchmark.structured_tasks import SENTIMENT
    from edge_specdec.benchmark.suites.structured import schema_valid

    assert schema_valid(SENTIMENT, '{"sentiment": "positive"}') == 1
    assert schema_valid(SENTIMENT, '{"sentiment": "happy"}') == 0  # not in the enum
    assert schema_valid(SENTIMENT, '{"sentiment": "positive"') == 0  # cut short


@pytest.mark.slow
def test_startup_suite_runs_each_row_in_a_fresh_process(capsys, tmp_path, monkeypatch):
    from edge_specdec.benchmark import fresh_process

    started = []
    real = fresh_process.run_fresh
    def counted(function, **kwargs):
        started.append(function)
        return real(function, **kwargs)
    monkeypatch.setattr(fresh_process, "run_fresh", counted)
    warm_caches(monkeypatch, tmp_path)
    report = run_suite(capsys, tmp_path, "startup", "--repeats", "1", "--max-new-tokens", "4", "--no-genai")
    rows = rows_of(report)
    assert list(rows) == ["ours", "run-auto", "run-none"]
    assert len(started) == 2 * 3  # the uncounted round and the timed one, a process per row each time
    for name, row in rows.items():
        figures = row["figures"]
        assert row["runs"] == 1 and not row["failures"], (name, row["failures"])
        assert 0 < figures["load_s"] < figures["first_token_s"] < figures["process_wall_s"]
        assert figures["peak_rss_mib"] > 50 and figures["tokens_per_s"] > 0
    assert rows["ours"]["identical"] is True and rows["run-auto"]["identical"] is True  # run-none's token ids


@pytest.mark.slow
def test_long_prompts_suite_runs_each_row_in_a_fresh_process(capsys, tmp_path, monkeypatch):
    """One task on one document length (a process per row and cell), GenAI's row timed by its own perf_metrics
    (openvino_genai installed)."""
    pytest.importorskip("openvino_genai")
    warm_caches(monkeypatch, tmp_path)
    report = run_suite(capsys, tmp_path, "long-prompts", "--lengths", "700", "--tasks", "quote", "--max-new-tokens",
                       "4", "--repeats", "1", "--kv-caches", "u8", "--draft-windows", "64")
    rows = rows_of(report)
    assert list(rows) == ["ours-none", "ours-auto", "ours-auto-kv-u8", "ours-auto-window-64", "genai-none"]
    assert rows["ours-auto-window-64"]["identical"] is True  # the draft read 64 of the prompt's 700 tokens
    assert report["cells"] == ["700 tokens, quote"]
    assert report["settings"]["tasks"] == ["quote"] and report["settings"]["runs_per_process"] == 1
    for name, row in rows.items():
        assert row["runs"] == 1 and not row["failures"], (name, row["failures"])
        assert row["figures"]["ttft_s"] > 0 and row["figures"]["peak_rss_mib"] > 50, name
        assert row["figures"]["tokens_per_s_after_first"] > 0, name
    assert rows["ours-auto"]["identical"] is True and rows["ours-auto"]["identity_checked_runs"] == 1
    assert rows["ours-auto-kv-u8"]["identical"] is None  # u8 is exact only up to float noise: not compared
    assert rows["genai-none"]["identical"] is None  # other CPU properties: not compared
    # a u8 cache holds fewer bytes per token than the default f16 one
    assert rows["ours-auto-kv-u8"]["figures"]["kv_bytes_per_token"] < rows["ours-auto"]["figures"]["kv_bytes_per_token"]
    assert "| ours-auto-kv-u8 |" in (tmp_path / "long-prompts" / "report.md").read_text()
    # the rows with a draft say what it cost a run and how much of the run its guard ran the target alone
    auto = rows["ours-auto"]["figures"]
    assert auto["draft_s"] > 0 and 0 <= auto["alone_share"] <= 1
    assert rows["ours-none"]["figures"]["draft_s"] is None and rows["genai-none"]["figures"]["alone_share"] is None


def test_long_prompts_default_to_64_tokens_three_interleaved_repeats_and_both_tasks():
    from edge_specdec.benchmark.suites import suite_parser

    args = suite_parser("long-prompts").parse_args([])
    assert (args.max_new_tokens, args.repeats, args.runs_per_process) == (64, 3, 1)
    assert args.tasks == ["summarize", "quote"]


def test_a_long_prompt_row_computed_otherwise_is_checked_against_the_target_alone_computed_so():
    """A f32 cache rounds otherwise than the default f16 one, and a bf16 prefill computes the prompt otherwise, so
    their tokens may differ from the default target alone's and still be exact: the reference is the target alone
    on the same cache or with the same prefill. A u8 cache is not compared."""
    from edge_specdec.benchmark.suites import suite_parser
    from edge_specdec.benchmark.suites.long_prompts import long_prompt_rows

    args = suite_parser("long-prompts").parse_args(["--kv-caches", "f32", "u8", "--no-genai",
                                                    "--long-prompt-precisions", "bf16"])
    rows, skipped = long_prompt_rows(args, "BUNDLE", print)
    references = {row.name: row.reference for row in rows}
    assert references == {"ours-none": None, "ours-auto": "ours-none", "ours-none-kv-f32": None,
                          "ours-auto-kv-f32": "ours-none-kv-f32", "ours-auto-kv-u8": None,
                          # a prompt prefilled on the bf16 copy: the target alone with the same copy
                          "ours-none-prefill-bf16": None, "ours-auto-prefill-bf16": "ours-none-prefill-bf16"}
    assert not skipped


def test_a_long_prompt_row_of_the_target_alone_loads_no_draft(bundle_dir, monkeypatch):
    """GenAI's row holds the target alone, and so do ours' rows of the target alone (their peak memory is compared
    with its), writing the tokens the default's pipeline writes with the target alone; the default's pipeline has
    the static copies a Pipeline opened with its defaults has (as serve's); --profile profiles the same
    pipelines."""
    from edge_specdec.benchmark.suites import long_prompts
    from edge_specdec.runtime import Pipeline
    from support import SAME_VOCAB

    pipelines = []
    real = long_prompts.ours_pipeline
    monkeypatch.setattr(long_prompts, "ours_pipeline",
                        lambda *args, **kwargs: pipelines.append(real(*args, **kwargs)) or pipelines[-1])
    bundle = str(bundle_dir(*SAME_VOCAB))
    ids = list(range(3, 40))
    alone, auto = (long_prompts.ours_long(0, bundle, ids, 6, 1, None, algorithm) for algorithm in ("none", "auto"))
    assert pipelines[0].draft is None and pipelines[0].bundle.draft is None
    assert pipelines[1].draft is not None and pipelines[1].bundle.draft is not None
    assert pipelines[1]._static == Pipeline(bundle)._static == {"target": True, "draft": True}  # tiny models
    assert alone["token_ids"] == auto["token_ids"] and len(alone["token_ids"]) == 6
    for algorithm in ("none", "auto"):  # --profile profiles the pipeline the timed row runs
        assert long_prompts.profile_long(0, bundle, ids, 6, algorithm)["calls"]
        assert (pipelines[-1].draft is None) == (algorithm == "none")


def test_the_quote_task_asks_for_a_function_defined_once_near_the_middle():
    from edge_specdec.benchmark.suites.long_prompts import quoted_function

    text = "def first():\n    pass\n" + "x = 1\n" * 20 + "def middle(a):\n    return a\n" + "y = 2\n" * 20 + \
        "def twice():\n    twice()\n"
    assert quoted_function(text) == "middle"  # nearest the middle; `twice` is named twice
    with pytest.raises(RuntimeError, match="no function defined once"):
        quoted_function("x = 1\n")


def test_long_prompts_refuse_a_draft_window_no_run_could_take(capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["bench", "long-prompts", "--lengths", "700", "--draft-windows", "5", "--out", str(out)]) == 1
    assert "draft_window must be 0" in capsys.readouterr().err and not out.exists()


def test_workloads_refuse_an_unknown_category_before_the_engine_loads(capsys, tmp_path, monkeypatch):
    import edge_specdec.runtime

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine was opened")
    monkeypatch.setattr(edge_specdec.runtime, "Engine", no_engine)
    out = tmp_path / "out"
    assert main(["bench", "workloads", "--categories", "revise", "poems", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "--categories: no request of poems; the categories are code_edit, quote, revise" in err
    assert not out.exists()


def test_long_prompts_refuse_lengths_past_the_context(capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["bench", "long-prompts", "--lengths", "4096", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "go past the target's context of 1024 tokens" in err and not out.exists()


@pytest.mark.slow  # a suite on the demo's engines (the fast tier checks the suites' options and report)
def test_general_suite_is_the_default_and_runs_on_the_demo(capsys, tmp_path):
    out = tmp_path / "general"
    assert main(["bench", "--categories", "math", "--setups", "ours-none", "ours-slem-k3", "--max-new-tokens", "4",
                 "--repeats", "1", "--no-genai", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("# edge-specdec bench: demo_bundle")
    report = json.loads((out / "report.json").read_text())
    rows = rows_of(report)
    assert list(rows) == ["ours-none", "ours-slem-k3"] and rows["ours-slem-k3"]["identical"] is True
    assert report["command"].startswith("edge-specdec bench --categories math")  # as typed, then spelled out


@pytest.mark.slow  # a suite on the demo's engines (the fast tier checks the suites' options and report)
def test_clients_suite_on_the_demo(capsys, tmp_path):
    out = tmp_path / "clients"
    assert main(["bench", "clients", "--clients", "1", "2", "--setups", "ours-spec", "--categories",
                 "code_generation", "--max-new-tokens", "4", "--repeats", "1", "--no-genai", "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith("# edge-specdec bench clients: demo_bundle")
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["clients"] == [1, 2] and "ours-spec" in {r["setup"] for r in report["setups"]}
    assert not report["not_identical"]


# --- conversation and structured on the demo, GenAI's rows against a stand-in for openvino_genai ------------

PERSON_JSON = '{"name": "Ann", "age": 30, "city": "Oslo"}'


def fake_genai(calls: list) -> types.ModuleType:
    """A stand-in for openvino_genai: the calls the suites make, each recorded in calls; every answer PERSON_JSON,
    streamed as one piece (a streamer that returns True would stop GenAI: it is recorded too)."""
    og = types.ModuleType("openvino_genai")

    class Settings:
        def __init__(self, **kwargs):
            self.__dict__.update(kwargs)

    class LLMPipeline:
        def __init__(self, folder, device, **kwargs):
            calls.append(("load", str(folder), sorted(kwargs)))

        def start_chat(self):
            calls.append(("start_chat",))

        def finish_chat(self):
            calls.append(("finish_chat",))

        def generate(self, prompt, config, streamer=None):
            calls.append(("generate", prompt, config, streamer("{") if streamer else None))
            return PERSON_JSON

    og.GenerationConfig = og.StructuredOutputConfig = og.SchedulerConfig = Settings
    og.LLMPipeline = LLMPipeline
    og.draft_model = lambda folder, device, **kwargs: ("draft", str(folder))
    return og


def test_a_document_chat_holds_the_document_in_its_first_turn_then_asks_about_it():
    from edge_specdec.benchmark.suites.conversation import DOCUMENT_TURNS, TURNS, conversation_cells

    cells = conversation_cells(3, 1, "```python\nx = 1\n```\n\n")
    assert [c.key for c in cells] == ["turn 1", "turn 2", "turn 3", "request 1"]
    assert cells[0].value == ("chat", 0, "```python\nx = 1\n```\n\n" + DOCUMENT_TURNS[0])
    assert [c.value[2] for c in cells[1:3]] == DOCUMENT_TURNS[1:3]
    assert [c.value[2] for c in conversation_cells(2, 0)] == TURNS[:2]  # no document: the coding chat


def test_the_conversation_suite_refuses_a_negative_document_before_the_engine_loads(capsys, tmp_path, monkeypatch):
    import edge_specdec.runtime

    monkeypatch.setattr(edge_specdec.runtime, "Engine", lambda *a, **k: pytest.fail("the engine was opened"))
    out = tmp_path / "out"
    assert main(["bench", "conversation", "--document-tokens", "-1", "--out", str(out)]) == 1
    assert "--document-tokens at least 0" in capsys.readouterr().err and not out.exists()


def test_the_conversation_suite_has_the_store_row_only_with_prefix_store(monkeypatch):
    from edge_specdec.benchmark import suite_runs
    from edge_specdec.benchmark.suites import suite_parser
    from edge_specdec.benchmark.suites.conversation import conversation_rows

    engine = types.SimpleNamespace(session=lambda: None)  # the rows' runners open nothing until they run
    monkeypatch.setattr(suite_runs, "genai_or_reason", lambda: (None, "openvino_genai is not installed"))
    parser = suite_parser("conversation")
    for flags, names in ((["--no-genai"], ["ours-reuse", "ours-no-reuse"]),
                         (["--no-genai", "--prefix-store"], ["ours-reuse", "ours-store", "ours-no-reuse"])):
        rows, skipped = conversation_rows(parser.parse_args(flags), engine, engine)
        assert [row.name for row in rows] == names and skipped == []
    rows, skipped = conversation_rows(parser.parse_args([]), engine, engine)
    assert [row.name for row in rows] == ["ours-reuse", "ours-no-reuse"]
    assert skipped == [{"setup": "genai-chat", "reason": "openvino_genai is not installed"}]


@pytest.mark.slow  # opens the demo's engine
def test_a_document_is_a_fenced_cut_of_the_sources_of_about_the_tokens_asked():
    from edge_specdec.benchmark.suites.conversation import document_text
    from edge_specdec.runtime import Engine

    engine = Engine(DEMO_BUNDLE)
    text = document_text(engine, 200)
    assert text.startswith("```python\n") and text.endswith("\n```\n\n")
    inner = text[len("```python\n"):-len("\n```\n\n")]
    assert 190 <= len(engine.tokenizer.encode(inner, add_special=False)) <= 210
    assert inner in "\n\n".join(p.read_text() for p in sorted(PACKAGE_SOURCES.rglob("*.py")))


@pytest.mark.slow  # two engines, and a system prompt of about 600 tokens prefilled whole by the baseline
def test_conversation_suite_on_the_demo_with_the_prefix_store_and_genai_rows(capsys, tmp_path, monkeypatch):
    """--prefix-store: before each later turn another conversation takes the chat's session, and the store gives the
    chat's caches back: the turn reuses them as the slot that kept them does, and writes what no reuse writes."""
    from edge_specdec.serve.prefix_store import PrefixStore

    calls: list = []
    monkeypatch.setitem(sys.modules, "openvino_genai", fake_genai(calls))
    prepared = []
    real = PrefixStore.prepare
    monkeypatch.setattr(PrefixStore, "prepare", lambda self, *a: prepared.append(real(self, *a)) or prepared[-1])
    report = run_suite(capsys, tmp_path, "conversation", "--turns", "3", "--service", "2", "--answer-tokens", "4",
                       "--prefix-store")
    rows = rows_of(report)
    assert list(rows) == ["ours-reuse", "ours-store", "ours-no-reuse", "genai-chat"]
    assert report["cells"] == ["turn 1", "turn 2", "turn 3", "request 1", "request 2"]
    reuse, store, whole = rows["ours-reuse"], rows["ours-store"], rows["ours-no-reuse"]
    assert reuse["runs"] == store["runs"] == whole["runs"] == 5 and not reuse["failures"] and not store["failures"]
    assert reuse["identical"] is True and reuse["identity_checked_runs"] == 5
    # the later turns and the second request reuse the prefix the first one left; the baseline never does
    assert reuse["figures"]["reused_tokens"] > 0 and whole["figures"]["reused_tokens"] == 0
    assert reuse["per_cell"]["turn 1"] is None and reuse["per_cell"]["turn 2"] > 0  # TTFT from turn 2 on
    assert reuse["ratio_to_baseline"] > 0 and report["baseline"] == "ours-no-reuse"
    # the store row: turns 2 and 3 stored the chat's caches as the other request took the slot, then restored them
    assert store["identical"] is True and store["figures"]["reused_tokens"] == reuse["figures"]["reused_tokens"]
    assert len(prepared) == 4 and all(p.stored for p in prepared[0::2]) and all(p.restored for p in prepared[1::2])
    genai = rows["genai-chat"]
    assert genai["runs"] == 5 and not genai["failures"] and genai["identical"] is None  # its text is not compared
    events = [c[0] for c in calls]
    # the warm-up turn, then the timed chat in a new chat of its own, then the service outside the chat
    assert events == ["load", "start_chat", "generate", "finish_chat", "start_chat", "generate", "generate",
                      "generate", "finish_chat", "generate", "generate"]
    generated = [c for c in calls if c[0] == "generate"]
    assert all(stop is False for *_, stop in generated)  # the streamer never asks GenAI to stop
    service = generated[-1]
    assert service[2].apply_chat_template is False and "Rule 12" in service[1]  # the rendered system prompt


@pytest.mark.slow  # a suite on the demo's engines (the fast tier checks the suites' options and report)
def test_structured_suite_on_the_demo_with_a_genai_row(capsys, tmp_path, monkeypatch):
    from edge_specdec.benchmark.structured_tasks import PERSON

    calls: list = []
    monkeypatch.setitem(sys.modules, "openvino_genai", fake_genai(calls))
    reused = spy_prompt_reuse(monkeypatch)  # each run prefills its whole prompt (the warm-up ran the first task)
    report = run_suite(capsys, tmp_path, "structured", "--limit", "2", "--max-new-tokens", "8")
    rows = rows_of(report)
    assert list(rows) == ["ours-none", "ours-auto", "genai"] and report["cells"] == ["person-1", "person-2"]
    assert len(reused) >= 4 and reused == [0] * len(reused)
    auto = rows["ours-auto"]
    assert auto["runs"] == 2 and not auto["failures"]
    assert auto["identical"] is True and auto["identity_checked_runs"] == 2  # lossless under the grammar too
    assert rows["ours-none"]["figures"]["tokens"] == 8 and auto["figures"]["tokens_per_s"] > 0
    assert auto["figures"]["valid"] is not None  # counted (8 tokens may cut the JSON short: 0 is a count too)
    genai = rows["genai"]
    assert genai["runs"] == 2 and genai["figures"]["valid"] == 2 and genai["identical"] is None
    config = next(c[2] for c in calls if c[0] == "generate")
    assert json.loads(config.structured_output_config.json_schema) == PERSON
    assert config.apply_chat_template is False and config.max_new_tokens == 8


def test_startup_and_long_prompts_genai_runs_time_their_first_token(monkeypatch):
    from edge_specdec.benchmark.suites import long_prompts, startup

    calls: list = []
    monkeypatch.setitem(sys.modules, "openvino_genai", fake_genai(calls))
    got = startup.genai(started=time.perf_counter(), target="t", draft="d", prompt="p", max_new_tokens=4)
    assert 0 <= got["load_s"] <= got["first_token_s"] and got["tokens_per_s"] > 0
    assert calls[0] == ("load", "t", ["CACHE_DIR", "draft_model"]) and calls[1][2].num_assistant_tokens == 3
    assert calls[1][3] is False
    calls.clear()
    timed = types.SimpleNamespace(mean=25.0)  # milliseconds, as GenAI's perf_metrics give them
    metrics = types.SimpleNamespace(get_ttft=lambda: types.SimpleNamespace(mean=400.0), get_tpot=lambda: timed)
    pipeline = sys.modules["openvino_genai"].LLMPipeline

    class Timed(pipeline):
        def generate(self, prompt, config, streamer=None):
            super().generate(prompt, config, streamer)
            return types.SimpleNamespace(tokens=[[5, 6, 7, 8]], perf_metrics=metrics)
    monkeypatch.setattr(sys.modules["openvino_genai"], "LLMPipeline", Timed)
    got = long_prompts.genai_long(started=0.0, bundle=str(DEMO_BUNDLE), ids=[1, 2, 3], max_new_tokens=4, repeats=2,
                                  properties="f16")
    # GenAI's own clock, not a streamer's: its first-token time and its time per output token after it
    assert got["ttft_s"] == 0.4 and got["tokens_per_s_after_first"] == 40.0 and got["token_ids"] == [5, 6, 7, 8]
    assert calls[0][2] == ["KV_CACHE_PRECISION", "scheduler_config"] and len(calls) == 1 + 3  # a warm-up, 2 timed
    assert all(streamer is None for *_, streamer in calls[1:])  # no streamer


# --- the shared report, from known runs -------------------------------------------------------------------------

def test_suite_report_from_known_runs(tmp_path):
    from edge_specdec.benchmark.suite_report import build_suite_report, render_suite_markdown, write_suite_report
    from edge_specdec.benchmark.suite_runs import Cell, Figure, Measured, Suite, SuiteRow

    def row(name, reference, runs):
        r = SuiteRow(name, f"the row {name}", run=None, reference=reference)
        r.measured = {key: Measured({"tps": tps, "valid": valid}, ids) for key, (tps, valid, ids) in runs.items()}
        return r
    base = row("base", None, {("a", 0): (10.0, 1, [1, 2, 3]), ("b", 0): (20.0, 0, [4, 5])})
    fast = row("fast", "base", {("a", 0): (30.0, 1, [1, 2, 3]), ("b", 0): (20.0, 1, [4, 9])})
    peer = row("peer", None, {("a", 0): (5.0, None, None)})
    peer.failures.append({"cell": "b", "repeat": 0, "error": "RuntimeError: no"})
    bundle = types.SimpleNamespace(path=tmp_path / "pair", vocabulary={"relation": "identical"}, manifest={})
    suite = Suite("known", bundle, [base, fast, peer], [Cell("a"), Cell("b")],
                  [Figure("tps", "tok/s"), Figure("valid", "valid", ".0f", total=True)], headline="tps",
                  baseline="base", settings={"max_new_tokens": 4}, method="Known runs.")
    report = build_suite_report(suite, {"cpu": "x", "cores": 2, "platform": "p", "python": "3", "date": "d"},
                                "edge-specdec bench known", interrupted=False)
    rows = {r["setup"]: r for r in report["setups"]}
    assert rows["fast"]["ratio_to_baseline"] == 2.0  # the median of 30/10 and 20/20
    assert rows["fast"]["figures"] == {"tps": 25.0, "valid": 2.0} and rows["base"]["figures"]["valid"] == 1.0
    assert rows["fast"]["identical"] is False and rows["fast"]["mismatches"][0]["first_difference"] == 1
    assert rows["base"]["identical"] is None and rows["base"]["is_reference"] and not rows["peer"]["is_reference"]
    assert rows["peer"]["per_cell"] == {"a": 5.0, "b": None} and rows["peer"]["failed_runs"] == 1
    assert report["not_identical"] == ["fast"]
    text = render_suite_markdown(report)
    assert rows["fast"]["weakest_cell"] == {"cell": "b", "ratio": 1.0} and rows["base"]["weakest_cell"] is None
    assert "| fast | 2 | 25.00 | 2 | 2.00x | 1.00x (b) | **NO** (1 of 2 runs) |" in text
    assert "| base | 2 | 15.00 | 1 | baseline | - | reference |" in text and "| peer | 1 (1 failed) |" in text
    assert "- NOT identical: fast on b (repeat 1): first difference at token 1" in text
    files = write_suite_report(report, tmp_path / "out", say=lambda _: None)
    assert json.loads(open(files["json"]).read())["suite"] == "known"
    if "plot" in files:  # matplotlib is installed: the chart is a PNG
        assert open(files["plot"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_suite_row_s_weakest_cell_is_the_worst_median_of_its_repeats(tmp_path):
    """The floor of a row is the cell whose per-repeat ratios to the baseline have the worst median: one slow run of
    a cell fast otherwise does not make it the floor; where a lower figure is better (seconds), the worst is the
    highest ratio."""
    from edge_specdec.benchmark.suite_report import build_suite_report
    from edge_specdec.benchmark.suite_runs import Cell, Figure, Measured, Suite, SuiteRow

    def suite_of(figure: Figure, base_runs: dict, row_runs: dict) -> dict:
        rows = []
        for name, runs in (("base", base_runs), ("row", row_runs)):
            r = SuiteRow(name, name, run=None)
            r.measured = {(cell, rep): Measured({figure.key: v}) for cell, values in runs.items()
                          for rep, v in enumerate(values)}
            rows.append(r)
        bundle = types.SimpleNamespace(path=tmp_path / "pair", vocabulary={"relation": "identical"}, manifest={})
        suite = Suite("known", bundle, rows, [Cell("steady"), Cell("one-slow-run"), Cell("mostly-slow")], [figure],
                      headline=figure.key, baseline="base", settings={}, method="Known runs.")
        report = build_suite_report(suite, {"cpu": "x", "cores": 2, "platform": "p", "python": "3", "date": "d"},
                                    None, interrupted=False)
        return {r["setup"]: r for r in report["setups"]}["row"]["weakest_cell"]

    base = {"steady": [10.0] * 3, "one-slow-run": [10.0] * 3, "mostly-slow": [10.0] * 3}
    rates = {"steady": [20.0] * 3, "one-slow-run": [30.0, 5.0, 30.0], "mostly-slow": [11.0, 9.0, 9.5]}
    assert suite_of(Figure("tps", "tok/s"), base, rates) == {"cell": "mostly-slow", "ratio": 0.95}
    seconds = {cell: [10 / v for v in values] for cell, values in rates.items()}
    base_seconds = {cell: [1.0] * 3 for cell in base}
    weakest = suite_of(Figure("s", "seconds", lower_is_better=True), base_seconds, seconds)
    assert weakest["cell"] == "mostly-slow" and weakest["ratio"] == pytest.approx(10 / 9.5, abs=1e-4)


@pytest.mark.slow  # a suite on the demo's engines (the fast tier checks the suites' options and report)
def test_the_workloads_suite_runs_each_category_against_the_target_alone_with_a_cold_pool(capsys, tmp_path,
                                                                                          monkeypatch):
    from edge_specdec.benchmark.suites.workloads import COPIES_FREE, WORKLOADS
    from edge_specdec.runtime.sources import FreeFirst

    # copies of at most 8 tokens: a 12-token answer the ceiling copies then takes a copy round after the first
    # (whose copy rides in the prefill call and is not timed apart), whether or not this machine's measured fixed
    # blocks cap copies further
    monkeypatch.setattr(FreeFirst, "free_tokens", 8)
    report = run_suite(capsys, tmp_path, "workloads", "--max-new-tokens", "12", "--warm-pool", "--ceiling")
    rows = rows_of(report)
    assert list(rows) == ["ours-none", "ours-auto", "ours-auto-no-free", "ours-auto-warm-pool", "ours-ceiling"]
    assert report["cells"] == [f"{c}/{i + 1}" for c, requests in WORKLOADS.items() for i in range(len(requests))]
    # the ceiling copies the request's own answer from the pool: nearly every token, in few passes
    assert rows["ours-ceiling"]["figures"]["pool_share"] >= 0.8
    assert rows["ours-ceiling"]["figures"]["tokens_per_pass"] > rows["ours-auto"]["figures"]["tokens_per_pass"]
    for name in ("ours-auto", "ours-auto-no-free", "ours-auto-warm-pool", "ours-ceiling"):
        assert rows[name]["identical"] is True, name  # every row writes the target alone's tokens
    assert rows["ours-auto-no-free"]["figures"]["suffix_share"] == rows["ours-auto-no-free"]["figures"]["pool_share"] == 0
    assert rows["ours-auto"]["figures"]["pool_share"] == 0  # cold: nothing from earlier runs
    # warm: the other requests' answers, never the request's own (which the ceiling copies nearly whole); before
    # a request keeps a copy, a copy needs a long match (sources.OPENING_MATCH), which the demo's short answers
    # rarely share with each other
    assert rows["ours-auto-warm-pool"]["figures"]["pool_share"] < 0.5 <= rows["ours-ceiling"]["figures"]["pool_share"]
    # the rounds that copied, timed apart: none in the row without free drafts, whose speed is then its own
    no_free, ceiling = rows["ours-auto-no-free"]["figures"], rows["ours-ceiling"]["figures"]
    assert no_free["copy_time_share"] == 0 and no_free["copies_free_tokens_per_s"] == no_free["tokens_per_s"]
    assert 0 < ceiling["copy_time_share"] < 1 and ceiling["copies_free_tokens_per_s"] > ceiling["tokens_per_s"]
    table = (tmp_path / "workloads" / "report.md").read_text()
    assert "per category" in table and all(f"| {c} |" in table for c in WORKLOADS)
    assert COPIES_FREE in table and set(rows["ours-auto"]["per_cell_figures"]["copies_free_tokens_per_s"]) == set(
        report["cells"])


@pytest.mark.slow  # opens the demo's engine and runs its cells
def test_a_conversation_cell_is_timed_with_its_earlier_turns_in_the_kv_cache(monkeypatch):
    from edge_specdec.benchmark.suites.workloads import WORKLOADS, earlier_turns, load_cells, runner
    from edge_specdec.runtime import Engine
    from edge_specdec.runtime.pipeline import DecodingSession

    engine = Engine(DEMO_BUNDLE)
    cells = {c.key: c for c in load_cells(engine, None)}
    chat_ids = cells["chat/1"].value[2]
    assert earlier_turns(engine, WORKLOADS["chat"][0], chat_ids) == []  # one turn: nothing earlier to keep
    category, index, ids, earlier = cells["tool_loop/1"].value
    assert earlier and ids[:len(earlier)] == earlier and len(earlier) < len(ids)
    draft_held = []  # what the draft's cache holds when each generate call starts
    generate = DecodingSession.generate

    def spy(self, prompt, *args, **kwargs):
        draft_held.append(self.draft.length)
        return generate(self, prompt, *args, **kwargs)

    monkeypatch.setattr(DecodingSession, "generate", spy)
    run = runner(engine, 4, engine.resolve_algorithm("auto"))
    measured = run(cells["tool_loop/1"], 0)
    # the untimed previous turn left its KV: the timed run prefills only the last turn, and the draft model, which
    # drafted in the previous turn, holds it too
    assert measured.figures["prompt_reused"] >= len(earlier) - 1
    assert draft_held[0] == 0 and draft_held[1] >= len(earlier) // 2
    assert run(cells["chat/1"], 0).figures["prompt_reused"] < 8


def test_long_prompts_per_call_figures_sum_a_runs_record_up_by_kind_of_call():
    from edge_specdec.benchmark.target_calls import call_figures, call_kind, calls_markdown

    # (tokens, block, past, seconds): the prefill with a proposal, two steps, two verification blocks
    calls = [(303, 64, 0, 0.5), (1, 2, 302, 0.010), (1, 2, 303, 0.012), (4, 9, 304, 0.020), (2, 9, 308, 0.016)]
    assert [call_kind(c[0], c[2], 300) for c in calls] == ["prefill", "1-token step", "1-token step",
                                                           "4-token block", "2-token block"]
    figures = call_figures(calls, 300)
    assert figures["step_ms"] == pytest.approx(11) and figures["block_ms"] == pytest.approx(18)
    assert figures["block_tokens"] == 3 and figures["decode_past"] == pytest.approx(304.25)
    assert call_figures(calls[:1], 300) == {"step_ms": None, "block_ms": None, "block_tokens": None,
                                            "decode_past": None}
    table = calls_markdown({"ours-auto": {"300 tokens": [calls]}}, {"300 tokens": 300})
    assert "| ours-auto | 300 tokens | 1-token step | 2 | 2.0 | 11.00 | 11.00 | 302-303 |" in table
    rows = [line.split(" | ")[2] for line in table.splitlines() if line.startswith("| ours-auto")]
    assert rows == ["prefill", "1-token step", "2-token block", "4-token block"]


def test_long_prompts_profile_runs_alone(capsys, tmp_path):
    out = tmp_path / "out"
    assert main(["bench", "long-prompts", "--lengths", "700", "--profile", "--per-call", "--out", str(out)]) == 1
    assert "--profile runs profiled runs instead of the timed rows" in capsys.readouterr().err and not out.exists()


@pytest.mark.slow  # fresh processes on the demo pair
def test_long_prompts_record_the_targets_calls_and_profile_them(capsys, tmp_path, monkeypatch):
    """--per-call: the table gets the target's time per step and per block, report.md a table by call size, and
    target_calls.json every call of the timed runs; --profile: per-node-type times per kind of call and the
    plugin's threads, in profile.md and profile.json."""
    warm_caches(monkeypatch, tmp_path)
    common = ["--lengths", "300", "--tasks", "summarize", "--max-new-tokens", "4", "--repeats", "1", "--no-genai",
              "--kv-caches"]
    report = run_suite(capsys, tmp_path, "long-prompts", *common, "--per-call")
    rows = rows_of(report)
    assert rows["ours-none"]["figures"]["step_ms"] > 0 and rows["ours-none"]["figures"]["block_ms"] is None
    assert rows["ours-none"]["figures"]["decode_past"] >= 300
    assert "## The target's calls (--per-call)" in (tmp_path / "long-prompts" / "report.md").read_text()
    calls = json.loads((tmp_path / "long-prompts" / "target_calls.json").read_text())
    assert calls["columns"] == ["tokens", "block", "past", "seconds"]
    none_runs = calls["runs"]["ours-none"]["300 tokens, summarize"]
    assert len(none_runs) == 1 and [c[0] for c in none_runs[0]] == [300, 1, 1, 1]  # the prefill, then steps
    out = tmp_path / "profile"
    assert main(["bench", "long-prompts", *common, "--profile", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip("\n") == (out / "profile.md").read_text().rstrip("\n")
    assert "## 300 tokens, summarize, none" in printed and "| FullyConnected" in printed
    assert "INFERENCE_NUM_THREADS 1" in printed  # the demo's tiny target runs on one thread
    profiles = json.loads((out / "profile.json").read_text())["profiles"]
    assert [p["algorithm"] for p in profiles] == ["none", "auto"]
    for p in profiles:
        assert p["calls"]["prefill"]["calls"] >= 1 and sum(p["calls"]["prefill"]["nodes"].values()) > 0
