"""`GpuSampler`: the run's GPUs, sampled every second into `DIR/gpus.jsonl`, for the idle time and peak
memory of each GPU per step that `vistarl status` reports.

`nvidia-smi` reads them (the driver's own tool, wherever the GPUs are; no Python package needed):
`utilization.gpu` is the share of the last sample period in which a kernel ran on the GPU, and
`memory.used` the memory of every process on it. One line per sample: `{"time": unix seconds, "gpus":
{"<index>": {"util": percent, "mem_mib": MiB}}}`, indices as `nvidia-smi` counts them.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["SAMPLES_FILE", "GpuSampler"]

log = logging.getLogger(__name__)

SAMPLES_FILE = "gpus.jsonl"
QUERY = ("nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits")
QUERY_TIMEOUT_S = 10.0


class GpuSampler:
    """Samples `gpus` every `every_s` seconds into `path` while the `with` block runs; without
    `nvidia-smi` on PATH (no GPU named, or none here) it samples nothing."""

    def __init__(self, path: Path, gpus: tuple[int, ...], every_s: float = 1.0) -> None:
        self.path = path
        self.gpus = {str(index) for index in gpus}
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vistarl-gpu-sampler", daemon=True)

    @property
    def enabled(self) -> bool:
        """Whether there is anything to sample."""
        return bool(self.gpus) and shutil.which(QUERY[0]) is not None

    def __enter__(self) -> GpuSampler:
        if self.enabled:
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(QUERY_TIMEOUT_S)

    def _run(self) -> None:
        """Append a sample every `every_s` until stopped; a failed query is logged and skipped."""
        with self.path.open("a", encoding="utf-8") as sink:
            while not self._stop.wait(self.every_s):
                try:
                    sample = self.sample()
                except (OSError, subprocess.SubprocessError, ValueError) as exc:
                    log.warning("nvidia-smi failed: %s", exc)
                    continue
                sink.write(json.dumps(sample) + "\n")
                sink.flush()

    def sample(self) -> dict[str, Any]:
        """One sample of the named GPUs."""
        answer = subprocess.run(QUERY, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=True)
        gpus = {}
        for line in answer.stdout.splitlines():
            index, util, memory = (field.strip() for field in line.split(","))
            if index in self.gpus:
                gpus[index] = {"util": float(util), "mem_mib": float(memory)}
        return {"time": time.time(), "gpus": gpus}
