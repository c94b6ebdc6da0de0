"""The align work folder: what each stage has done, so that an align can stop and resume stage by stage.

    WORK/state.json     the settings that fix the work (bundle, draft source, prompts, lengths), each stage's
                        results once it is done, and the time spent so far (the --minutes budget spans resumes)
    WORK/data.jsonl     the target's continuations, one JSON object per prompt, appended as they are generated
    WORK/train/         the training checkpoint (trainable weights, optimizer, best weights so far)
    WORK/draft-hf/      the fine-tuned draft as a Hugging Face folder
    WORK/draft-ir/      the fine-tuned draft exported to OpenVINO IR in the bundle's weight format
    WORK/bundle/        the aligned bundle before it is moved to --out

state.json is rewritten atomically (a temporary file, then a rename); data.jsonl only grows, one whole line per
prompt. A line that is not a whole record (cut short by a crash, or damaged since) is skipped and counted when the
file is read, never deleted with what follows it: every intact record is kept, and the prompts of the damaged ones
are generated again.
"""
from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from ...errors import ExportError

# What a record of data.jsonl holds (see generate.py), each with its type: a line without them is damaged.
RECORD_FIELDS = {"id": (str, int), "split": str, "prompt": str, "completion": str, "stop_reason": str,
                 "target_tokens": int, "draft_tokens": int}

STATE_FILE = "state.json"
DATA_FILE = "data.jsonl"
# The stages in order; `--stop-after` names one of them, and state.json records each one done.
STAGES = ("baseline", "plan", "generate", "train", "export", "evaluate", "write")
# Settings that decide what the stored work is: a resume with other values would mix two aligns' work.
FIXED_SETTINGS = ("bundle_manifest_sha256", "draft_source", "prompts_sha256", "max_new_tokens", "eval_prompts",
                  "eval_tokens", "seed")


class WorkFolder:
    def __init__(self, path: Path):
        self.path = path
        self.state: dict[str, Any] = {}

    # --- paths --------------------------------------------------------------------------------------------------
    @property
    def data_file(self) -> Path:
        return self.path / DATA_FILE

    @property
    def train_dir(self) -> Path:
        return self.path / "train"

    @property
    def draft_hf(self) -> Path:
        return self.path / "draft-hf"

    @property
    def draft_ir(self) -> Path:
        return self.path / "draft-ir"

    @property
    def bundle(self) -> Path:
        return self.path / "bundle"

    # --- state --------------------------------------------------------------------------------------------------
    def open(self, fixed: dict[str, Any], resume: bool) -> None:
        """Start a new work folder, or (resume) continue the one there after checking it is the same align."""
        state_path = self.path / STATE_FILE
        if not resume:
            if self.path.exists() and any(self.path.iterdir()):
                reached = self._reached(state_path)
                raise ExportError(f"{self.path} holds the work of an earlier align{reached}: pass --resume to "
                                  "continue it, or remove that folder to start over.")
            self.path.mkdir(parents=True, exist_ok=True)
            self.state = {"fixed": fixed, "stages": {}, "spent_seconds": 0.0}
            self.save()
            return
        if not state_path.is_file():
            if self.data_file.is_file() and self.data_file.stat().st_size:  # its state.json was removed: start the
                self.state = {"fixed": fixed, "stages": {}, "spent_seconds": 0.0}  # stages again, keep the text
                self.save()
                return
            raise ExportError(f"--resume: there is no earlier align to resume in {self.path} (no {STATE_FILE}). "
                              "Run without --resume to start one (or pass the --work folder it used).")
        try:
            self.state = json.loads(state_path.read_text(encoding="utf-8"))
            if not isinstance(self.state, dict) or not isinstance(self.state.get("stages"), dict):
                raise ValueError("not the state of an align")
        except (OSError, ValueError) as exc:
            records, _ = self.scan_data()
            reason = (str(exc).splitlines() or [""])[0][:120]
            raise ExportError(f"--resume: {state_path} is damaged ({reason}), so which stages are done is unknown. "
                              f"The generated text is not lost ({len(records)} records in {self.data_file.name}): "
                              f"delete {state_path} alone and run the same command with --resume; the stages run "
                              "again and generation keeps the prompts already there.") from None
        changed = [key for key in FIXED_SETTINGS if self.state.get("fixed", {}).get(key) != fixed.get(key)]
        if changed:
            raise ExportError(f"--resume: the work in {self.path} was made with other settings "
                              f"({', '.join(changed)} differ): resume with the same bundle, draft source, "
                              "prompts and lengths, or remove that folder to start over.")

    @staticmethod
    def _reached(state_path: Path) -> str:
        try:
            stages = json.loads(state_path.read_text(encoding="utf-8")).get("stages", {})
        except (OSError, ValueError):
            return ""
        done = [s for s in STAGES if stages.get(s, {}).get("done")]
        return f" (done: {', '.join(done)})" if done else ""

    def save(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".state.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.state, f, indent=1)
            os.replace(tmp, self.path / STATE_FILE)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def done(self, stage: str) -> bool:
        return bool(self.state["stages"].get(stage, {}).get("done"))

    def result(self, stage: str) -> dict[str, Any]:
        return self.state["stages"].get(stage, {})

    def finish(self, stage: str, result: dict[str, Any]) -> None:
        self.state["stages"][stage] = {**result, "done": True}
        self.save()

    def record(self, stage: str, partial: dict[str, Any]) -> None:
        """Results of a stage that is not finished yet (kept for a resume)."""
        self.state["stages"][stage] = {**self.state["stages"].get(stage, {}), **partial, "done": False}
        self.save()

    def add_spent(self, seconds: float) -> None:
        self.state["spent_seconds"] = self.state.get("spent_seconds", 0.0) + seconds
        self.save()

    # --- the generated data -------------------------------------------------------------------------------------
    def read_data(self) -> list[dict[str, Any]]:
        """Every intact record of data.jsonl (see scan_data)."""
        return self.scan_data()[0]

    def scan_data(self) -> tuple[list[dict[str, Any]], int]:
        """(every intact record of data.jsonl, the number of damaged lines skipped). A line is damaged when it is
        not a JSON object with the fields of a record (RECORD_FIELDS); a later record of a prompt already read is
        left out. The file is only read: nothing in it is deleted."""
        if not self.data_file.is_file():
            return [], 0
        records, seen, damaged = [], set(), 0
        for line in self.data_file.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:  # also a line that is not UTF-8
                record = None
            if not is_record(record):
                damaged += 1
            elif record["id"] not in seen:
                seen.add(record["id"])
                records.append(record)
        return records, damaged

    def appender(self) -> "DataAppender":
        return DataAppender(self.data_file)


def is_record(record: Any) -> bool:
    return isinstance(record, dict) and all(isinstance(record.get(k), t) and not isinstance(record.get(k), bool)
                                            for k, t in RECORD_FIELDS.items())


def data_totals(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What the records hold: prompts by split, the target's tokens, the draft tokens of the training split."""
    totals = {"prompts": 0, "train_prompts": 0, "validation_prompts": 0, "target_tokens": 0,
              "train_draft_tokens": 0}
    for record in records:
        add_to_totals(totals, record)
    return totals


def add_to_totals(totals: dict[str, Any], record: dict[str, Any]) -> None:
    train = record["split"] == "train"
    totals["prompts"] += 1
    totals["train_prompts" if train else "validation_prompts"] += 1
    totals["target_tokens"] += record["target_tokens"]
    if train:
        totals["train_draft_tokens"] += record["draft_tokens"]


class DataAppender:
    """Appends one whole line per record and flushes it, so that a stop loses at most the records in flight."""

    def __init__(self, path: Path):
        # a last line without its newline (a crash mid-write) stays as it is: the next record starts a line of its own
        ends_a_line = not path.is_file() or path.stat().st_size == 0 or _last_byte(path) == b"\n"
        self.file = open(path, "a", encoding="utf-8")
        if not ends_a_line:
            self.file.write("\n")

    def add(self, record: dict[str, Any]) -> None:
        self.file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def _last_byte(path: Path) -> bytes:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


class Budget:
    """The --minutes budget of the whole align, resumes included: the clock starts at the time already spent."""

    def __init__(self, minutes: float, spent_seconds: float = 0.0):
        self.total = minutes * 60.0
        self.started = time.monotonic() - spent_seconds
        self.session_start = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.total - self.elapsed()

    def session_seconds(self) -> float:
        """Time spent in this run (added to the work folder's total when the run ends)."""
        return time.monotonic() - self.session_start


def iter_stages(stop_after: Optional[str]) -> Iterator[str]:
    for stage in STAGES:
        yield stage
        if stage == stop_after:
            return
