"""`benchmarks.env_server --compare`: the default `vistarl serve` against OpenEnv's server on Sokoban, and
where each env's server CPU goes per step.

Each server runs as its own process at its default settings (vistarl: `vistarl serve ENV`, capacity
raised to 2x the users; OpenEnv: `benchmarks.openenv_sokoban`) and gets the same lean load from this
process (`benchmarks.lean_load`: N users, the same episodes, seeds and responses against both), a
warm-up and then the measured window. `--rounds` pairs run one after another, vistarl first; the ratios
compare the two rows of one round. OpenEnv is skipped, saying so, when `openenv-core` is not installed.

Then each env of `--envs` is served and loaded once more while `py-spy` samples the server's process
tree (`benchmarks.server_profile`; skipped, saying so, without py-spy): the env's own work (its step,
reset and render, and the PNG encoding of its images; grading processes included) against the rest,
the server's **overhead** per step (routing, validation, the JSON answer, session rules, frames to the
env workers, HTTP). Sampling takes CPU of its own, which is why it is not done during the comparison.
Every row notes the 1-minute load average when it started: a shared machine moves wall-clock figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import shutil
import sys
from collections.abc import Iterator

from benchmarks.episodes import EPISODES, Episodes
from benchmarks.harness import markdown_header, served_env
from benchmarks.lean_load import Row, measure, measure_vistarl, openenv_user
from benchmarks.server_profile import breakdown, sampled
from vistarl.devtools.servers import running_process
from vistarl.httpserver.launch import free_port


def openenv_installed() -> bool:
    """Whether `openenv-core` can be imported here (it is not a dependency of the project)."""
    return importlib.util.find_spec("openenv") is not None


@contextlib.contextmanager
def openenv_sokoban(max_sessions: int) -> Iterator[tuple[str, int]]:
    """OpenEnv's server for the project's Sokoban (`benchmarks.openenv_sokoban`): its URL and pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "benchmarks.openenv_sokoban", "--port", str(port)]
    with running_process([*command, "--max-sessions", str(max_sessions)], ready_url=f"{url}/health") as proc:
        yield url, proc.pid


async def on_vistarl(episodes: Episodes, concurrency: int, seconds: float, warmup: float) -> Row:
    """`vistarl serve ENV` at its defaults under the lean HTTP load."""
    with served_env(episodes.env, 2 * concurrency) as server:
        return await measure_vistarl(server, "vistarl serve", episodes, concurrency, seconds, warmup)


async def on_openenv(episodes: Episodes, concurrency: int, seconds: float, warmup: float) -> Row:
    """OpenEnv's server under the lean WebSocket load."""
    with openenv_sokoban(2 * concurrency) as (url, pid):
        user = openenv_user(url, episodes)
        return await measure("OpenEnv", episodes.env, pid, user, concurrency, seconds, warmup)


def compare(envs: list[str], concurrency: int, seconds: float, warmup: float, rounds: int) -> str:
    """Every measurement, as the markdown `--compare` prints."""
    parts: list[str] = []
    if "sokoban" in envs:
        parts += peer_rounds(concurrency, seconds, warmup, rounds)
    if shutil.which("py-spy") is None:
        return "\n\n".join([*parts, "Per-part profiles: skipped (pip install py-spy to add them)"])
    for name in envs:
        profile = asyncio.run(sampled(EPISODES[name](), [], seconds, warmup, concurrency))
        parts.append(breakdown(profile))
    return "\n\n".join(parts)


def peer_rounds(concurrency: int, seconds: float, warmup: float, rounds: int) -> list[str]:
    """Sokoban on `vistarl serve` and on OpenEnv's server, `rounds` times in turn: the rows and ratios."""
    sokoban = EPISODES["sokoban"]()
    peer = openenv_installed()
    rows: list[Row] = []
    for _ in range(rounds):
        rows.append(asyncio.run(on_vistarl(sokoban, concurrency, seconds, warmup)))
        if peer:
            rows.append(asyncio.run(on_openenv(sokoban, concurrency, seconds, warmup)))
    if not peer:
        return [table(rows), "OpenEnv: skipped (pip install openenv-core to add it)"]
    return [table(rows), ratios(list(zip(rows[::2], rows[1::2], strict=True)))]


def _ms(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(rows: list[Row]) -> str:
    """Every row measured, in order."""
    columns = ["server", "env", "load avg", "steps/s", "p50 ms", "p99 ms", "server CPU ms/step"]
    lines = [
        markdown_header(*columns, "of which first process", "client CPU ms/step", text=("server", "env"))
    ]
    for r in rows:
        cells = [r.server, r.env, f"{r.load:.1f}", f"{r.steps_per_s:.0f}", _ms(r.p50_ms, 1), _ms(r.p99_ms, 1)]
        cells += [_ms(r.cpu_ms_per_step), _ms(r.front_cpu_ms_per_step), _ms(r.client_cpu_ms_per_step)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(pairs: list[tuple[Row, Row]]) -> str:
    """Each round's vistarl row against the OpenEnv row measured right after it."""
    columns = ["round", "vistarl steps/s", "OpenEnv steps/s", "steps/s ratio", "vistarl p99 ms"]
    lines = [markdown_header(*columns, "OpenEnv p99 ms", "p99 ratio")]
    for index, (ours, theirs) in enumerate(pairs, 1):
        assert ours.p99_ms is not None and theirs.p99_ms is not None
        cells = [str(index), f"{ours.steps_per_s:.0f}", f"{theirs.steps_per_s:.0f}"]
        cells += [
            f"{ours.steps_per_s / theirs.steps_per_s:.2f}x",
            f"{ours.p99_ms:.1f}",
            f"{theirs.p99_ms:.1f}",
        ]
        cells.append(f"{ours.p99_ms / theirs.p99_ms:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
