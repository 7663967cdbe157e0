"""Where an env server's CPU goes per step: `py-spy` samples of a loaded `vistarl serve ENV`, by part.

    .venv/bin/python -m benchmarks.server_profile [--envs sokoban geo3k vsi] [--seconds 8]
        [--concurrency 64] [-- SERVE FLAGS...]

For each env, starts `vistarl serve ENV` (with any flags after `--`, e.g. `--env-workers 0`), puts the
lean load of `benchmarks.lean_load` on it (64 users), and records its process tree with `py-spy record
--subprocesses` (on-CPU samples only) for the measured window. Each sample goes to the part of its
innermost frame that belongs to one (`PARTS`, first match): a sample in zlib under `encode_image` is PNG
encoding, one in pydantic under `EnvHost.step` is the JSON answer, one in asyncio under the session
manager is the session rules. The table gives each part's share of the samples and its CPU per step
(the tree's CPU per step over the window, from /proc, times the share); the first two parts are the
env's own work, the rest the server's overhead. Threads without Python frames (an OpenGL driver's)
are not sampled, so an env's own share is understated there, and the overhead overstated; and on a
busy machine a process that waits for a core after a wake-up is sampled as running, which inflates the
pipes, the HTTP protocol and the event loop.

So each env is then also played alone in this process (`env_alone`: the same episodes, one after
another, built, reset, stepped and their images encoded as the server encodes them), and its CPU per
step (this process and its children, Geo3k's grading processes) is taken from the server's: the
overhead measured without sampling. It counts against the server what running the env there costs it
beyond the env's own work, cold caches included.
`py-spy` is not a dependency of the project: `pip install py-spy`.
"""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.episodes import EPISODES, Episodes
from benchmarks.harness import (
    add_window_arguments,
    benchmark_parser,
    markdown_header,
    ms_per_step,
    process_tree_cpu_s,
    served_env,
)
from benchmarks.lean_load import Row, measure_vistarl
from vistarl.services.env_api import EnvFactory, load_env_factory
from vistarl.services.server.encoding import observation_to_wire

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("env: step, reset, render", ("services/sokoban/", "services/geo3k/", "services/vsi/", "math_verify")),
    ("env: PNG encoding of images", ("clients/images.py",)),
    ("JSON answer (base64 images, info)", ("services/server/env_calls.py", "services/server/encoding.py")),
    (
        "frames to env workers (msgpack, pipes)",
        ("services/server/worker_process.py", "services/server/process_pool.py", "msgpack"),
    ),
    ("metrics", ("prometheus_client",)),
    (
        "session rules and store",
        ("services/server/sessions.py", "local_sessions.py", "services/server/store/"),
    ),
    ("request guard (middleware)", ("services/server/security.py", "starlette/middleware")),
    (
        "body validation",
        ("read_json (", "_body (services/server/json_route.py", "_is_json (", "tool_calls.py"),
    ),
    (
        "routing (the lean routes, FastAPI, Starlette)",
        ("services/server/json_route.py", "fastapi/", "starlette/"),
    ),
    ("HTTP protocol (uvicorn, httptools)", ("uvicorn/protocols", "httptools")),
    ("event loop and the rest", ()),
)
ENV_PARTS = 2  # the first parts are the env's own work; the others are the server's overhead


def part_of(stack: str) -> str:
    """The part of the innermost frame of `stack` (py-spy's raw `outer;...;inner`) that belongs to one."""
    for frame in reversed(stack.split(";")):
        for name, markers in PARTS[:-1]:
            if any(marker in frame for marker in markers):
                return name
    return PARTS[-1][0]


def parts(raw: str) -> collections.Counter[str]:
    """Samples per part, from py-spy's raw output (one `stack count` per line)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            counts[part_of(stack)] += int(count)
    return counts


@dataclass(frozen=True)
class Profile:
    """A loaded server's figures, its flags, its samples by part, and the CPU per step of its env alone."""

    row: Row
    flags: list[str]
    samples: collections.Counter[str]
    alone_ms_per_step: float | None


async def sampled(
    episodes: Episodes, flags: list[str], seconds: float, warmup: float, concurrency: int
) -> Profile:
    """Load `vistarl serve ENV FLAGS` with `concurrency` users and sample it for `seconds` after `warmup`;
    then play the env alone here (`env_alone`), the server stopped."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy is not installed: pip install py-spy")
    with served_env(episodes.env, 2 * concurrency, *flags) as server, tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "samples.txt"
        record = [py_spy, "record", "--pid", str(server.pid), "--subprocesses", "--format", "raw"]
        record += ["--rate", "250", "--duration", str(round(seconds)), "--output", str(out), "--nonblocking"]
        load = measure_vistarl(server, "vistarl serve", episodes, concurrency, seconds, warmup)
        running = asyncio.create_task(load)
        await asyncio.sleep(warmup)
        sampler = await asyncio.create_subprocess_exec(*record, stdout=subprocess.DEVNULL)
        await sampler.wait()
        row = await running
        samples = parts(out.read_text())
    return Profile(row, flags, samples, env_alone(episodes, seconds, warmup))


def env_alone(episodes: Episodes, seconds: float, warmup: float) -> float | None:
    """CPU ms per step of the env's own work on `episodes`, played one after another in this process for
    `seconds` after `warmup` seconds of the same (None without /proc)."""
    factory = load_env_factory(episodes.env)
    numbers = iter(range(1 << 62))
    deadline = time.perf_counter() + warmup
    while time.perf_counter() < deadline:
        play(factory, episodes, next(numbers))
    before, steps = process_tree_cpu_s(os.getpid()), 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        steps += play(factory, episodes, next(numbers))
    after = process_tree_cpu_s(os.getpid())
    return None if before is None or after is None else ms_per_step(after - before, steps)


def play(factory: EnvFactory, episodes: Episodes, n: int) -> int:
    """Play episode `n` as the server would: build and reset the env, step it until done, encode every
    observation's images (`observation_to_wire`); how many steps it took."""
    reset = episodes.reset(n)
    env = factory.create(
        factory.options_model.model_validate(reset.get("options", {})), reset.get("seed"), None
    )
    steps = 0
    try:
        observation, _ = env.reset()
        observation_to_wire(observation)
        for response in episodes.responses(n):
            result = env.step(response)
            observation_to_wire(result.observation)
            steps += 1
            if result.done:
                break
    finally:
        env.close()
    return steps


def breakdown(profile: Profile) -> str:
    """A profile as markdown: its figures, then each part's share of the samples and CPU per step, and the
    server's overhead (every part but the env's own)."""
    row, samples = profile.row, profile.samples
    per_step, first = row.cpu_ms_per_step or 0.0, row.front_cpu_ms_per_step or 0.0
    total = sum(samples.values()) or 1
    overhead = per_step * sum(samples[name] for name, _ in PARTS[ENV_PARTS:]) / total
    alone = profile.alone_ms_per_step
    beyond = (
        ""
        if alone is None
        else f"; the env alone {alone:.3f} ms/step, so **{per_step - alone:.3f}** beyond it"
    )
    lines = [
        f"`vistarl serve {' '.join([row.env, *profile.flags])}`, {row.steps_per_s:.0f} steps/s, p99 "
        f"{row.p99_ms:.1f} ms, {per_step:.2f} ms of server CPU per step ({first:.2f} in its first process), "
        f"load avg {row.load:.1f}: **overhead {overhead:.3f} ms/step** sampled{beyond}",
        "",
        markdown_header("part", "share of samples", "CPU ms/step", text=("part",)),
    ]
    for name, _ in PARTS:
        share = samples[name] / total
        lines.append(f"| {name} | {100 * share:.1f}% | {per_step * share:.3f} |")
    return "\n".join(lines)


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--envs", nargs="+", choices=sorted(EPISODES), default=["sokoban"])
    add_window_arguments(parser, 8.0, 3.0, "Seconds sampled.", "Unsampled seconds of load first.")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("flags", nargs="*", help="Flags for `vistarl serve`, after `--`.")
    args = parser.parse_args()
    for env in args.envs:
        profile = asyncio.run(
            sampled(EPISODES[env](), args.flags, args.seconds, args.warmup, args.concurrency)
        )
        print(breakdown(profile), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
