"""The host Python of a GRPO step's episode starts: what the event loop runs per episode during the update.

    .venv/bin/python -m benchmarks.episode_host [--config configs/sokoban_demo_gpu.yaml] [--rounds 5]
    .venv/bin/python -m benchmarks.episode_host --profile 25     # cProfile of the last round, top 25

With `rollout.overlap_resets` the next step's episodes start on the event loop while the update runs on
another thread, and every millisecond of Python they run holds the GIL the update needs. This runs exactly
that work for one step's jobs of the config (`step_jobs`: `rollout_batch_size` levels x
`n_samples_per_prompt` samples), in the trainer's own code, with the checkpoint's real processor and model
(`model.path`, else a `medium` one written to a temporary directory; `--shape tiny` for a smaller one):

- `reset`: the in-process env's reset of every episode at once (`Envs`, as the runner opens them: render,
  PNG, data URL, in the env pool's threads);
- `tokenize`: each episode's first prompt (`TokenTracks.add_prompt`, the system prompt and the observation);
- `prepare`: the HF engine's request for it (`PromptRules.prepare`: pixel inputs, content keys, mRoPE
  positions, prefix-cache key), one request after another as its thread would.

Each round plays a new step's jobs (new levels: no cache carries over from the round before). Prints the
CPU milliseconds per episode of each part (the process's CPU time over the part: with torch on one thread,
the time some thread held the GIL), the mean over `--rounds` after one warm-up round, and one JSON line.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.harness import benchmark_parser
from vistarl.devtools.model_shapes import SHAPES
from vistarl.devtools.tiny_checkpoint import write_tiny_checkpoint
from vistarl.trainer.config import TrainConfig, load_config
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.hf.loading import load_model
from vistarl.trainer.rollout.engines.hf.prompts import PromptRules
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.episode_env import EpisodeEnv, opening_messages
from vistarl.trainer.rollout.job import EpisodeJob
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TokenTracks, TurnEncoder
from vistarl.trainer.run.prompts import PromptSource, step_jobs

PARTS = ("reset", "tokenize", "prepare")


class Round:
    """One step's episode starts, part by part, with the CPU seconds each part took."""

    def __init__(self, envs: Envs, encoder: TurnEncoder, rules: PromptRules, jobs: Sequence[EpisodeJob]):
        self.envs = envs
        self.encoder = encoder
        self.rules = rules
        self.jobs = jobs
        self.cpu: dict[str, float] = {}

    async def run(self, profiler: cProfile.Profile | None = None) -> dict[str, float]:
        """Reset every episode, then build the prompts, then prepare the requests; CPU seconds per part."""
        handles = [await self.envs.open(job.env) for job in self.jobs]
        with _cpu(self.cpu, "reset", profiler):
            messages = await asyncio.gather(*(h.reset(j) for h, j in zip(handles, self.jobs, strict=True)))
        with _cpu(self.cpu, "tokenize", profiler):
            tracks = [self._tracks(env, message) for env, (message, _) in zip(handles, messages, strict=True)]
        with _cpu(self.cpu, "prepare", profiler):
            for track, job in zip(tracks, self.jobs, strict=True):
                self.rules.prepare(_request(track, job))
        await asyncio.gather(*(h.close() for h in handles))
        return self.cpu

    def _tracks(self, env: EpisodeEnv, message: dict[str, Any]) -> TokenTracks:
        """An episode's tracks after its first prompt, as `run_episode` builds them."""
        tracks = TokenTracks(self.encoder)
        tracks.add_prompt(opening_messages(env, message))
        return tracks


class _cpu:
    """Adds the process's CPU seconds over a block to `into[name]`, under `profiler` when one is given."""

    def __init__(self, into: dict[str, float], name: str, profiler: cProfile.Profile | None) -> None:
        self.into, self.name, self.profiler = into, name, profiler

    def __enter__(self) -> None:
        self.started = time.process_time()
        if self.profiler is not None:
            self.profiler.enable()

    def __exit__(self, *exc: object) -> None:
        if self.profiler is not None:
            self.profiler.disable()
        self.into[self.name] = self.into.get(self.name, 0.0) + time.process_time() - self.started


def _request(tracks: TokenTracks, job: EpisodeJob) -> GenerateRequest:
    """The first turn's engine request, as `_Episode._generate` makes it."""
    return GenerateRequest(
        engine_ids=list(tracks.engine_ids),
        images=list(tracks.images),
        sampling=job.settings.sampling,
        session=job.episode_id,
    )


def prepared_config(config: Path, shape: str, tmp: Path) -> TrainConfig:
    """The config, with a `shape` checkpoint written to `tmp` when `model.path` holds none."""
    cfg = load_config(config, [])
    if Path(cfg.model.path).exists():
        return cfg
    path = write_tiny_checkpoint(tmp / "model", arch=cfg.model.arch, shape=SHAPES[shape])
    return load_config(config, [f"model.path={path}"])


async def measure(cfg: TrainConfig, rounds: int, profile: int) -> dict[str, Any]:
    """A warm-up round, then `rounds` measured ones, each a new step's jobs (`--profile`: the last one)."""
    processor = VLProcessor.from_pretrained(cfg.model.path)
    model = load_model(cfg.model.path, "cpu", torch.float32)
    rules = PromptRules.of(model, processor)
    encoder = TurnEncoder(processor)
    env = cfg.env.name
    source = await PromptSource.create(cfg, env)
    envs = Envs()
    profiler = cProfile.Profile() if profile else None
    measured: list[dict[str, float]] = []
    try:
        for step in range(1, rounds + 2):
            jobs = step_jobs(cfg, env, source, step, 0, "bench")
            last = step == rounds + 1
            cpu = await Round(envs, encoder, rules, jobs).run(profiler if last else None)
            if step > 1:
                measured.append({part: 1e3 * cpu[part] / len(jobs) for part in PARTS})
    finally:
        await envs.aclose()
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(profile)
    per_part = {part: [m[part] for m in measured] for part in PARTS}
    return {
        "episodes": len(jobs),
        "ms_per_episode": {part: round(statistics.mean(v), 3) for part, v in per_part.items()},
        "ms_per_episode_min": {part: round(min(v), 3) for part, v in per_part.items()},
        "total_ms_per_episode": round(sum(statistics.mean(v) for v in per_part.values()), 3),
    }


def print_report(result: dict[str, Any], out: Callable[[str], None] = print) -> None:
    """The part table (mean and least ms per episode), then the JSON line."""
    out(f"{'part':<10} {'ms/episode':>11} {'min':>8}   ({result['episodes']} episodes a round)")
    for part in PARTS:
        out(f"{part:<10} {result['ms_per_episode'][part]:11.3f} {result['ms_per_episode_min'][part]:8.3f}")
    out(f"{'total':<10} {result['total_ms_per_episode']:11.3f}")
    out(json.dumps(result))


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/sokoban_demo_gpu.yaml"))
    parser.add_argument("--shape", choices=sorted(SHAPES), default="medium", help="checkpoint if none")
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds, one step's jobs each")
    parser.add_argument("--profile", type=int, default=0, help="print this many cProfile rows")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = prepared_config(args.config, args.shape, Path(tmp))
        print_report(asyncio.run(measure(cfg, args.rounds, args.profile)))


if __name__ == "__main__":
    main()
