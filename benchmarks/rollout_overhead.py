"""The episode loop's own cost per turn, with an engine that costs nothing.

    .venv/bin/python -m benchmarks.rollout_overhead [--concurrency 1 64 256] [--episodes 512] [--turns 8]

`ScriptedEngine` answers every turn with canonical ids of a short move list at zero model cost, so
what remains is the loop itself: building requests, appending generated ids, decoding, the HTTP
round trip to the env (client side), rendering and tokenizing each observation delta, image grids,
and bookkeeping. Episodes run in this one process at each concurrency, against a `vistarl serve
sokoban` subprocess ("http": the env's step, render and PNG encode happen in the server process)
and against the env module in process ("local": that env work runs here, in worker threads).

Per turn it reports the wall time (elapsed / turns) and the CPU time of this process
(`time.process_time()`), also per image (each Sokoban observation holds one 384x384 image); the
server's CPU per turn (from /proc); and the mean split of an episode's wall time from trajectory
timings (env, tokenize, generate, the rest). The target is loop CPU under 2 ms per turn per image
at concurrency 64 over HTTP. Prints a markdown table.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness import benchmark_parser, markdown_header, process_cpu_s, served_env
from vistarl.devtools.tiny_checkpoint import write_tiny_checkpoint
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.job import EpisodeSettings, group_jobs
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.runner import RolloutRunner, run_jobs
from vistarl.trainer.rollout.trajectory import Trajectory

MOVES = ("<answer>Up</answer>", "<answer>Right</answer>", "<answer>Down</answer>", "<answer>Left</answer>")
SPLIT = ("env", "tokenize", "generate")


@dataclass(frozen=True)
class Figures:
    """One benchmark row."""

    mode: str
    concurrency: int
    episodes: int
    turns: int
    images: int
    statuses: str
    wall_ms: float
    cpu_ms: float
    server_cpu_ms: float | None
    split_ms: dict[str, float]

    @property
    def cpu_ms_per_image(self) -> float:
        return self.cpu_ms * self.turns / max(self.images, 1)


def scripted_moves(index: int, request: GenerateRequest) -> str:
    """The zero-cost policy: cycle through the four moves."""
    return MOVES[index % len(MOVES)]


@dataclass
class Tally:
    """What the measured episodes add up to, summed as they finish (trajectories are not kept)."""

    episodes: int = 0
    turns: int = 0
    images: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)

    def add(self, trajectory: Trajectory) -> None:
        self.episodes += 1
        self.turns += int(trajectory.metrics["turns"])
        self.images += len(trajectory.images)
        self.statuses[trajectory.status.value] += 1
        self.seconds.update(trajectory.timings)

    def split_ms(self) -> dict[str, float]:
        """Per turn, the summed episode wall time spent in each part (overlapping across episodes)."""
        parts = {name: self.seconds[name] for name in SPLIT}
        parts["rest"] = self.seconds["total"] - sum(parts.values())
        return {name: seconds / self.turns * 1e3 for name, seconds in parts.items()}


async def measure(
    env: str, processor: VLProcessor, concurrency: int, episodes: int, turns: int, server_pid: int | None
) -> Figures:
    """Play `episodes` (after a warm-up of `concurrency` more) and summarise the measured part."""
    config = RolloutConfig(max_turns=turns, max_new_tokens=32, rollout_max_response_len=1536)
    engine = ScriptedEngine(processor, scripted_moves, record=False)
    runner = RolloutRunner(engine, processor, config, envs=Envs(token=""))
    settings = EpisodeSettings.of(config)
    warmup = group_jobs(env, [{"seed": s} for s in range(concurrency)], 1, settings=settings, prefix="warmup")
    jobs = group_jobs(env, [{"seed": 1000 + s} for s in range(episodes)], 1, settings=settings)
    tally = Tally()
    try:
        async for _ in run_jobs(runner, warmup, concurrency):
            pass
        cpu, server_cpu, wall = time.process_time(), _cpu(server_pid), time.perf_counter()
        async for trajectory in run_jobs(runner, jobs, concurrency):
            tally.add(trajectory)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        server_end = _cpu(server_pid)
    finally:
        await runner.aclose()
    server_cpu_ms = None
    if server_cpu is not None and server_end is not None:
        server_cpu_ms = (server_end - server_cpu) / tally.turns * 1e3
    return Figures(
        mode="http" if server_pid is not None else "local",
        concurrency=concurrency,
        episodes=tally.episodes,
        turns=tally.turns,
        images=tally.images,
        statuses=" ".join(f"{s}={n}" for s, n in sorted(tally.statuses.items())),
        wall_ms=wall / tally.turns * 1e3,
        cpu_ms=cpu / tally.turns * 1e3,
        server_cpu_ms=server_cpu_ms,
        split_ms=tally.split_ms(),
    )


def _cpu(pid: int | None) -> float | None:
    return None if pid is None else process_cpu_s(pid)


def markdown(rows: list[Figures]) -> str:
    """The figures as a markdown table."""
    columns = ["env", "concurrency", "episodes", "turns", "wall ms/turn", "loop CPU ms/turn"]
    columns += ["loop CPU ms/turn/image", "server CPU ms/turn", *(f"{name} ms" for name in (*SPLIT, "rest"))]
    lines = [markdown_header(*columns, "statuses", text=("env", "statuses"))]
    for r in rows:
        server = "-" if r.server_cpu_ms is None else f"{r.server_cpu_ms:.2f}"
        cells = [
            r.mode,
            r.concurrency,
            r.episodes,
            r.turns,
            f"{r.wall_ms:.2f}",
            f"{r.cpu_ms:.2f}",
            f"{r.cpu_ms_per_image:.2f}",
            server,
            *(f"{r.split_ms[name]:.2f}" for name in (*SPLIT, "rest")),
            r.statuses,
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--episodes", type=int, default=512, help="Measured episodes per row.")
    parser.add_argument("--turns", type=int, default=8, help="max_turns of each episode.")
    parser.add_argument("--model", type=Path, help="Checkpoint whose processor to use (default: a tiny one).")
    parser.add_argument("--modes", nargs="+", choices=["http", "local"], default=["http", "local"])
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or write_tiny_checkpoint(Path(scratch) / "tiny", "qwen2_5_vl", seed=0)
        processor = VLProcessor.from_pretrained(model)
    rows: list[Figures] = []
    if "http" in args.modes:
        with served_env("sokoban", 2 * max(args.concurrency)) as server:
            for n in args.concurrency:
                rows.append(
                    asyncio.run(measure(server.url, processor, n, args.episodes, args.turns, server.pid))
                )
    if "local" in args.modes:
        for n in args.concurrency:
            rows.append(asyncio.run(measure("sokoban", processor, n, args.episodes, args.turns, None)))
    print(markdown(rows))


if __name__ == "__main__":
    main()
