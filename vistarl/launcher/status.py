"""What `vistarl status DIR` reports of a `vistarl up` run: each process's state, the last step, the
step breakdown (where a step's time goes, throughput, what each episode took, the engine and trainer
agreeing on logprobs, how long each GPU sat idle) and the failures: each kind of episode a step could not
learn from (ABORTED, FAILED, missing, stale) and its tries with nothing to learn from, per step and in all,
those of the tries the trainer played again included.

It reads what the run writes: `DIR/up.json` (the plan), `DIR/processes.json` and `DIR/up.lock` (the
supervisor's), the trainer's `metrics.jsonl` (one record per step) and `DIR/gpus.jsonl` (the GPU
samples). A GPU's idle time in a step is the step's time times the mean share of its samples, over the
step's span, in which no kernel ran; its peak memory the most any sample of the span saw.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

from vistarl.launcher.gpus import SAMPLES_FILE
from vistarl.launcher.lock import held_by
from vistarl.launcher.supervisor import PROCESSES_FILE

__all__ = ["COUNTS", "FAILURES", "FIGURES", "PLAN_FILE", "RunStatus", "alive", "read_jsonl", "step_figures"]

PLAN_FILE = "up.json"
METRICS_FILE = "metrics.jsonl"
FIGURES: tuple[tuple[str, str], ...] = (
    ("time/step", "step (s)"),
    ("time/rollout", "waiting for the step's episodes (s)"),
    ("share/rollout", "share of the step waiting for episodes"),
    ("share/generate", "share of an episode's time generating"),
    ("rollout/seconds/generate", "generating, per episode (s)"),
    ("rollout/seconds/env", "in env calls, per episode (s)"),
    ("rollout/seconds/env_reset", "of which the reset (s)"),
    ("rollout/seconds/queue", "waiting in the queue, per episode (s)"),
    ("engine/prompt_share", "share of the embedded engine's time in prompt passes"),
    ("engine/cached_share", "share of prompt tokens from the prefix cache"),
    ("engine/decode_step_ms", "embedded engine's decode step (ms)"),
    ("time/train", "update (s)"),
    ("time/sync", "weight sync (s)"),
    ("time/eval", "evaluation (s)"),
    ("perf/tokens_per_s", "generated tokens/s"),
    ("perf/episodes_per_s", "episodes/s"),
    ("rollout/turns", "turns per episode"),
    ("rollout/response_tokens", "generated tokens per episode"),
    ("train/logprob_abs_diff", "engine vs trainer |logprob diff|"),
    ("train/tis_weight_mean", "TIS weight, mean"),
    ("perf/peak_memory_gib", "trainer rank 0 peak memory (GiB)"),
)
"""The per-step figures, by metric name (`share/...`: derived by `step_figures`), with their labels."""
COUNTS: tuple[tuple[str, str], ...] = (("rollout/duplicates", "duplicate results dropped"),)
"""Running totals the trainer logs: (metric, label)."""
FAILURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ABORTED", ("rollout/status/ABORTED", "rollout/unusable/ABORTED")),
    ("FAILED", ("rollout/status/FAILED", "rollout/unusable/FAILED")),
    ("missing", ("rollout/missing", "rollout/unusable/missing")),
    ("stale", ("rollout/stale", "rollout/unusable/stale")),
    ("unusable tries", ("rollout/unusable_tries",)),
)
"""Each kind of failure a step's record counts, and its metrics: the step's trained try and the tries it
played again (`rollout/unusable/...`, docs/training.md, "Metrics")."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON records of a JSON-lines file, in order (none when it does not exist)."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_figures(records: list[dict[str, Any]], samples: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Each step's record with the shares of its time (`share/rollout`: the wait for its episodes, of the
    step; `share/generate`: generation, of an episode's time) and, for each sampled GPU, `gpu/<i>/idle_s`
    and `gpu/<i>/peak_mib` added."""
    figures = []
    for record in records:
        end = record.get("time", math.nan)
        start = end - record.get("time/step", math.nan)
        span = [s["gpus"] for s in samples if start < s["time"] <= end]
        row = {**record, **_shares(record)}
        for index in sorted({i for gpus in span for i in gpus}, key=int):
            seen = [gpus[index] for gpus in span if index in gpus]
            idle = sum(1.0 - g["util"] / 100.0 for g in seen) / len(seen)
            row[f"gpu/{index}/idle_s"] = idle * record["time/step"]
            row[f"gpu/{index}/peak_mib"] = max(g["mem_mib"] for g in seen)
        figures.append(row)
    return figures


def _shares(record: dict[str, Any]) -> dict[str, float]:
    """The shares of a step's time that its record allows."""
    shares = {}
    if record.get("time/step") and "time/rollout" in record:
        shares["share/rollout"] = record["time/rollout"] / record["time/step"]
    if record.get("rollout/seconds/total") and "rollout/seconds/generate" in record:
        shares["share/generate"] = record["rollout/seconds/generate"] / record["rollout/seconds/total"]
    return shares


class RunStatus:
    """A run directory of `vistarl up`, read (see the module docstring)."""

    def __init__(self, out: Path) -> None:
        if not (out / PLAN_FILE).is_file():
            raise FileNotFoundError(f"{out} is not a `vistarl up` directory (it has no {PLAN_FILE})")
        self.out = out
        self.plan = json.loads((out / PLAN_FILE).read_text())
        record = json.loads(p.read_text()) if (p := out / PROCESSES_FILE).is_file() else {}
        self.recorded: dict[str, dict[str, Any]] = record.get("processes", {})
        run_dir = self.plan.get("run_dir")
        self.steps = step_figures(
            read_jsonl(Path(run_dir) / METRICS_FILE) if run_dir else [], read_jsonl(out / SAMPLES_FILE)
        )

    @property
    def supervisor_alive(self) -> bool:
        """Whether a live `vistarl up` runs this directory (it holds the directory's lock)."""
        return held_by(self.out) is not None

    def processes(self) -> list[dict[str, Any]]:
        """Each process of the plan: name, role, pid, state, restarts and last exit code. A process
        recorded as up whose pid is gone (its supervisor was killed) is `gone`."""
        rows = []
        for name in self.plan["processes"]:
            row = {
                "name": name,
                "role": None,
                "pid": None,
                "state": "waiting",
                "restarts": 0,
                "exit_code": None,
            }
            row.update(self.recorded.get(name, {}))
            if row["state"] in ("starting", "running") and not alive(row["pid"]):
                row["state"] = "gone"
            rows.append(row)
        return rows

    def breakdown(self) -> list[tuple[str, float | None, float | None]]:
        """(label, the last step's value, the mean over the steps after the first) of each figure the run
        reports; the first step is left out of the mean (it compiles and warms up)."""
        rows: list[tuple[str, float | None, float | None]] = []
        later = self.steps[1:] or self.steps
        keys = [*FIGURES, *_gpu_figures(self.steps)]
        for key, label in keys:
            values = [s[key] for s in later if key in s]
            if values:
                rows.append((label, self.steps[-1].get(key), sum(values) / len(values)))
        return rows

    def counts(self) -> list[tuple[str, float]]:
        """(label, total over the run) of each running total the run reports."""
        return [
            (label, values[-1])
            for key, label in COUNTS
            if (values := [s[key] for s in self.steps if key in s])
        ]

    def failures(self) -> list[dict[str, float]]:
        """Each step with a failure of any kind (`FAILURES`): its step and the count of each kind."""
        rows = []
        for step in self.steps:
            row = {kind: sum(step.get(key, 0.0) for key in keys) for kind, keys in FAILURES}
            if any(row.values()):
                rows.append({"step": step["step"], **row})
        return rows

    def failure_totals(self) -> dict[str, float]:
        """The count of each kind of failure over the whole run."""
        rows = self.failures()
        return {kind: sum(row[kind] for row in rows) for kind, _ in FAILURES}


def _gpu_figures(steps: list[dict[str, float]]) -> list[tuple[str, str]]:
    """The GPU figures the steps carry, with their labels."""
    indices = sorted({key.split("/")[1] for step in steps for key in step if key.startswith("gpu/")}, key=int)
    return [
        figure
        for index in indices
        for figure in (
            (f"gpu/{index}/idle_s", f"GPU {index} idle (s)"),
            (f"gpu/{index}/peak_mib", f"GPU {index} peak memory (MiB)"),
        )
    ]


def alive(pid: int | None) -> bool:
    """Whether process `pid` runs: it exists and has not exited (a zombie, which nothing reaped, has)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True
