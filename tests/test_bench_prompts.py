"""`edge-specdec bench --prompts FILE`: the rows benchmark and --clients run the file's prompts instead of the
shipped set, --categories chooses among the file's categories, and the report records the file."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest

from edge_specdec.cli import main
from support import SAME_VOCAB


# a user's workload: two categories, one of them with a prompt over several lines and a numbered id
WORKLOAD = [{"text": "The printer on floor 3 says PC LOAD LETTER. What now?", "category": "support", "id": "printer"},
            {"text": "Reset my password, please.", "category": "support"},
            {"text": "Rename the variable x to count:\n\nx = 0\nfor _ in items:\n    x += 1", "category": "code"},
            {"text": "Draft a one-line reply thanking a customer for the bug report.", "category": "support",
             "id": "thanks"}]


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_rows_benchmark_runs_the_files_prompts_of_the_chosen_category(bundle_dir, tmp_path, capsys):
    prompts = tmp_path / "workload.jsonl"
    prompts.write_text("\n".join(json.dumps(item) for item in WORKLOAD) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code = main(["bench", str(bundle_dir(*SAME_VOCAB)), "--prompts", str(prompts), "--categories", "support",
                 "--setups", "ours-standard-k3", "--no-genai", "--max-new-tokens", "4", "--repeats", "1",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((out / "report.json").read_text())

    support = [item for item in WORKLOAD if item["category"] == "support"]
    # the file's support prompts, in its order, the one without an id numbered within its category
    assert [p["key"] for p in report["prompts"]] == ["support/printer", "support/support-2", "support/thanks"]
    # the tiny target has no chat template: each prompt is the file's text as it is
    assert [p["chars"] for p in report["prompts"]] == [len(item["text"]) for item in support]
    assert report["categories"] == ["support"]
    assert all(r["runs"] == len(support) for r in report["setups"])
    assert report["settings"]["prompts_file"] == {"path": str(prompts), "sha256": sha256(prompts),
                                                  "prompts": len(WORKLOAD), "categories": {"support": 3, "code": 1}}
    # the command in the report says where the prompts came from, and so does report.md
    assert f"--prompts {prompts}" in report["command"]
    for markdown in ((out / "report.md").read_text(), captured.out):  # the file written, the report printed
        assert f"Prompts from `{prompts}`" in markdown and sha256(prompts) in markdown


def test_clients_benchmark_runs_the_files_prompts(bundle_dir, tmp_path, capsys):
    prompts = tmp_path / "workload.txt"
    lines = ["Name three rivers in Europe.", "", "What is 17 times 3?", "Write a limerick about a cat."]
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code = main(["bench", str(bundle_dir(*SAME_VOCAB)), "--clients", "2", "--prompts", str(prompts),
                 "--setups", "ours-spec", "--no-genai", "--max-new-tokens", "3", "--repeats", "1",
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((out / "report.json").read_text())
    # plain text: the first two non-blank lines, in the category "custom", numbered
    assert [p["key"] for p in report["prompts"]] == ["custom/custom-1", "custom/custom-2"]
    assert report["settings"]["categories"] == ["custom"]
    assert report["settings"]["prompts_file"]["sha256"] == sha256(prompts)
    assert report["settings"]["prompts_file"]["prompts"] == sum(1 for line in lines if line)
    assert f"--prompts {prompts}" in report["command"]
    assert sha256(prompts) in (out / "report.md").read_text()


def test_without_prompts_the_report_records_the_shipped_set(bundle_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["bench", str(bundle_dir(*SAME_VOCAB)), "--categories", "math", "--setups", "ours-none",
                 "--no-genai", "--max-new-tokens", "2", "--repeats", "1", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["prompts_file"] is None and "--prompts" not in report["command"]
    assert all(p["category"] == "math" for p in report["prompts"])
    assert "--prompts" not in (out / "report.md").read_text()


@pytest.mark.parametrize("content,args,message", [
    ('{"text": "a"}\n{"text": "b"\n', [], "workload.jsonl, line 2: bad JSON line"),
    ('{"text": "a", "id": "x"}\n{"text": "b", "id": "x"}\n', [], "duplicate id 'x'"),
    ('{"text": "a", "category": "support"}\n', ["--categories", "math"],
     "unknown prompt category 'math': choose from support"),
    ('{"text": "a"}\n{"text": "b"}\n', ["--clients", "3"], "needs 3 distinct prompts, but the prompt set has 2"),
    (None, [], "does not exist"),
])
def test_a_bad_prompt_file_is_one_clear_line_before_anything_runs(bundle_dir, tmp_path, capsys, content, args,
                                                                   message):
    prompts = tmp_path / "workload.jsonl"
    if content is not None:
        prompts.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["bench", str(bundle_dir(*SAME_VOCAB)), "--prompts", str(prompts), *args, "--no-genai",
                 "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("edge-specdec: error: ") and message in err, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert not out.exists()  # nothing ran, nothing was written


@pytest.mark.slow
def test_bench_help_explains_the_prompt_file():
    proc = subprocess.run([sys.executable, "-m", "edge_specdec.cli", "bench", "--help"], capture_output=True,
                          text=True)
    assert proc.returncode == 0
    for needle in ("--prompts FILE", "one prompt per line", '"category"', "sha256", "--prompts my_prompts.jsonl"):
        assert needle in proc.stdout, needle
    # the JSON-lines example in the help is itself a valid prompt line
    example = next(line.strip() for line in proc.stdout.splitlines() if line.strip().startswith('{"text"'))
    assert isinstance(json.loads(example)["text"], str)
