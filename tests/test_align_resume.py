"""align's work folder when something in it is damaged: every intact record of data.jsonl is kept and the damaged
lines' prompts are generated again; training and the manifest count what training read; a damaged checkpoint or
state.json is one line that deletes nothing and advises deleting no intact data."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from edge_specdec.errors import ExportError
from edge_specdec.export.align import AlignSettings, TrainSettings, align_bundle
from edge_specdec.export.align.run import _alignment_record
from edge_specdec.export.align.work import WorkFolder, data_totals

TARGET, DRAFT = "qwen2-bytelevel", "llama-metaspace"


def record(i: int, split: str = "train") -> dict:
    return {"id": f"p{i}", "category": "code", "split": split, "prompt": f"prompt {i}", "completion": f" answer {i}",
            "target_tokens": 3, "draft_tokens": 5, "stop_reason": "length", "target_ids": [1, 2, 3]}


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


# --- data.jsonl ---------------------------------------------------------------------------------------------------

def test_a_damaged_line_costs_only_itself(tmp_path):
    work = WorkFolder(tmp_path)
    lines = [json.dumps(record(i)).encode() for i in range(32)]
    lines[2] = lines[2][:25]                               # cut short
    lines[9] = b'{"id": "p9", "split": "train"}'           # JSON, but not a record
    lines[17] = lines[17].replace(b"answer", b"\xff\xfe")  # not UTF-8
    write_lines(work.data_file, lines)
    before = work.data_file.read_bytes()
    records, damaged = work.scan_data()
    assert damaged == 3 and [r["id"] for r in records] == [f"p{i}" for i in range(32) if i not in (2, 9, 17)]
    assert work.data_file.read_bytes() == before  # nothing deleted
    assert work.read_data() == records


def test_a_record_after_a_cut_short_last_line_starts_a_line_of_its_own(tmp_path):
    work = WorkFolder(tmp_path)
    work.data_file.write_bytes(json.dumps(record(0)).encode() + b"\n" + json.dumps(record(1)).encode()[:30])
    out = work.appender()
    out.add(record(2))
    out.close()
    records, damaged = work.scan_data()
    assert [r["id"] for r in records] == ["p0", "p2"] and damaged == 1


def test_a_later_record_of_the_same_prompt_is_left_out(tmp_path):
    work = WorkFolder(tmp_path)
    write_lines(work.data_file, [json.dumps(record(0)).encode(), json.dumps({**record(0), "completion": "x"}).encode()])
    assert [r["completion"] for r in work.read_data()] == [" answer 0"]


# --- state.json ---------------------------------------------------------------------------------------------------

def test_a_damaged_state_advises_deleting_only_itself_and_the_text_is_kept(tmp_path):
    work = WorkFolder(tmp_path / "work")
    fixed = {"seed": 0}
    work.open(fixed, resume=False)
    write_lines(work.data_file, [json.dumps(record(i)).encode() for i in range(5)])
    (work.path / "state.json").write_text('{"fixed": {"seed": 0}, "stag')
    with pytest.raises(ExportError) as info:
        WorkFolder(work.path).open(fixed, resume=True)
    message = str(info.value)
    assert "\n" not in message and "is damaged" in message and "5 records" in message
    assert f"delete {work.path / 'state.json'} alone" in message and f"remove {work.path}" not in message
    (work.path / "state.json").unlink()  # as the message says
    again = WorkFolder(work.path)
    again.open(fixed, resume=True)
    assert again.state["stages"] == {} and len(again.read_data()) == 5


# --- the manifest -------------------------------------------------------------------------------------------------

def test_the_manifest_counts_the_data_training_read(tmp_path):
    """Generation counted 32 prompts; training read 30 (two lines damaged since): the manifest says 30."""
    used = data_totals([record(i) for i in range(29)] + [record(29, "validation")])
    stages = {"generate": {**data_totals([record(i) for i in range(32)]), "done": True},
              "train": {"data": used, "steps": 4, "done": True}, "baseline": {"acceptance": 0.1, "done": True},
              "evaluate": {"after": {"acceptance": 0.2}, "done": True}}
    folder = SimpleNamespace(result=lambda stage: stages.get(stage, {}), done=lambda stage: stage in stages,
                             state={"fixed": {"prompts_sha256": "0" * 64}})
    settings = SimpleNamespace(train=TrainSettings(), prompts=None, max_new_tokens=16, minutes=1.0)
    alignment = _alignment_record(SimpleNamespace(path=tmp_path), settings, folder, tmp_path, 0,
                                  SimpleNamespace(elapsed=lambda: 1.0))
    assert alignment["data"]["prompts"] == 30 and alignment["data"]["train_prompts"] == 29
    assert alignment["data"]["validation_prompts"] == 1 and "data" not in alignment["training"]


# --- a whole align on the tiny fixtures ------------------------------------------------------------------------------

def align_settings(prompts: Path) -> AlignSettings:
    return AlignSettings(prompts=str(prompts), minutes=10, max_new_tokens=16, streams=2, eval_prompts=1,
                         eval_tokens=8, train=TrainSettings(train_layers=2, batch_tokens=256, epochs=1, evals=2))


@pytest.fixture(scope="module")
def generated(bundle_dir, tmp_path_factory):
    """An align stopped after generation: (source, prompts, work folder)."""
    root = tmp_path_factory.mktemp("align-resume")
    prompts = root / "prompts.txt"
    prompts.write_text("".join(f"Write a function that counts {thing}.\n" for thing in
                               ("apples", "words", "lines", "files", "bytes", "tokens", "errors", "rows")))
    source = bundle_dir(TARGET, DRAFT)
    align_bundle(source, root / "out", align_settings(prompts), work=root / "work", stop_after="generate")
    return source, prompts, root / "work"


@pytest.mark.slow
def test_resume_keeps_intact_records_regenerates_damaged_ones_and_trains_on_all(generated, tmp_path):
    source, prompts, pristine = generated
    work = tmp_path / "work"
    shutil.copytree(pristine, work)
    lines = work.joinpath("data.jsonl").read_bytes().splitlines()
    assert len(lines) == 8
    damaged_id = json.loads(lines[2])["id"]
    lines[2] = lines[2][:40]
    write_lines(work / "data.jsonl", lines)
    messages: list[str] = []
    align_bundle(source, tmp_path / "out", align_settings(prompts), work=work, resume=True, stop_after="train",
                 progress=messages.append)
    after = (work / "data.jsonl").read_bytes().splitlines()
    assert after[:8] == lines  # every line still there, the damaged one too
    records, damaged = WorkFolder(work).scan_data()
    assert damaged == 1 and len(records) == 8 and records[-1]["id"] == damaged_id  # generated again
    assert any("1 damaged lines" in m and "generating their prompts again" in m for m in messages), messages
    state = json.loads((work / "state.json").read_text())
    train = state["stages"]["train"]
    assert train["data"] == data_totals(records)
    assert train["train_sequences"] <= train["data"]["train_prompts"] == sum(r["split"] == "train" for r in records)
    assert state["stages"]["generate"]["prompts"] == 8


@pytest.mark.slow
def test_resume_with_the_data_deleted_says_so_and_generates_it_again(generated, tmp_path):
    source, prompts, pristine = generated
    work = tmp_path / "work"
    shutil.copytree(pristine, work)
    (work / "data.jsonl").unlink()
    messages: list[str] = []
    align_bundle(source, tmp_path / "out", align_settings(prompts), work=work, resume=True, stop_after="train",
                 progress=messages.append)
    assert any("data.jsonl, the 8 records generation wrote, is gone" in m and "generating them again" in m
               for m in messages), messages
    records, damaged = WorkFolder(work).scan_data()
    assert damaged == 0 and len(records) == 8
    state = json.loads((work / "state.json").read_text())
    assert state["stages"]["train"]["done"] and state["stages"]["train"]["data"] == data_totals(records)


@pytest.mark.slow
def test_a_damaged_checkpoint_is_one_line(generated, tmp_path):
    source, prompts, pristine = generated
    work = tmp_path / "work"
    shutil.copytree(pristine, work)
    (work / "train").mkdir(exist_ok=True)
    (work / "train" / "checkpoint.pt").write_bytes(b"PK\x03\x04 not a whole checkpoint")
    with pytest.raises(ExportError) as info:
        align_bundle(source, tmp_path / "out", align_settings(prompts), work=work, resume=True, stop_after="train")
    message = str(info.value)
    assert "\n" not in message and "checkpoint" in message and "is damaged" in message, message
    assert "delete it" in message and (work / "data.jsonl").is_file()
