"""Which processes `vistarl up` runs on this host, and how: the compose file's `gpu` profile without Docker.

`plan_processes` turns the options of `vistarl up` and the run's config into `ProcessSpec`s, in start
order: Redis (the queue in database 0, the env servers' sessions in database 1), the config's env server,
one `vistarl engine serve` per engine GPU (`--engines` of them on the CPU, one by default; together they
batch as many requests as the workers run episodes, unless `VISTARL_MAX_BATCH_SIZE` says otherwise), the
rollout workers (spreading their requests over the engines), and `vistarl train` (under torchrun on the
trainer GPUs, plainly on the CPU) with the NCCL weight sync (over gloo on the CPU), one broadcast to every
engine. The commands and flags are the compose file's services' (docker-compose.yml), on this host's
ports, and so are the stop grace periods (copied here: the wheel ships no compose file;
tests/test_launcher.py holds them equal); an engine waits for the trainer's weights before it generates
(`--await-weights`), so one that restarts serves nothing else.

Placement (docs/deploy.md, "Placement"): GPUs named for the engines and not the trainer make that split
layout; the same GPUs for both make it colocated: no engine server and no worker process, the trainer's
ranks each embed an engine on their GPU (`vistarl.trainer.run.rank_engines`) and each runs its own workers
on it (`rollout.local_workers`, each rank its share of `rollout.concurrency`), on the run's Redis queue.

`--role` narrows a host to its part of a larger run: each part the roles leave out, or whose URL is
given (`--redis-url`, `--env-url`, `--engine-url`), is not started here, and the processes that need it
use the URL. Servers bind `host`; on a loopback address each takes a free port, on any other the compose
file's (Redis 6379, env 8000, engine 30000, worker metrics 9100 and up), which other hosts name. The
processes here, and the readiness checks, reach them at the address they listen on (`addresses.py`).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from vistarl.httpserver.launch import free_port
from vistarl.launcher.addresses import is_loopback, reach
from vistarl.services.server.settings import ServerSettings
from vistarl.trainer.config import ConfigError, TrainConfig, load_config

__all__ = [
    "ROLES",
    "Plan",
    "PlanError",
    "ProcessSpec",
    "Role",
    "UpOptions",
    "plan_processes",
]

Role = Literal["redis", "env", "engine", "workers", "trainer"]
ROLES: tuple[Role, ...] = ("redis", "env", "engine", "workers", "trainer")
"""The parts of a run, in start order; a host runs those its `--role`s name (all by default)."""

LOOPBACK = "127.0.0.1"
COMPOSE_PORTS = {"redis": 6379, "env": 8000, "engine": 30000, "workers": 9100}
"""The ports of docker-compose.yml's services, which servers take when they listen beyond loopback (held
equal to the file's by tests/test_launcher.py, as are `STOP_GRACE_S`, `SESSIONS_DB` and
`WORKER_SHUTDOWN_GRACE_S`)."""
STOP_GRACE_S = {"redis": 10.0, "env": 20.0, "engine": 10.0, "workers": 45.0, "trainer": 30.0}
"""docker-compose.yml's `stop_grace_period` of each part (10 s, Compose's default, where it sets none); the
trainer's 30 s are for the checkpoint it saves on SIGTERM, and torchrun's own bound on its ranks' exit."""
START_TIMEOUT_S = {"redis": 30.0, "env": 120.0, "engine": 1200.0, "workers": 120.0, "trainer": 0.0}
"""How long a process may take to answer its readiness check (a big checkpoint loads for minutes)."""
WORKER_SHUTDOWN_GRACE_S = 30.0
"""Seconds a worker's running episodes get to finish on SIGTERM (`--shutdown-grace-s`, as in compose)."""
SESSIONS_DB = 1
"""The Redis database of the env servers' sessions (the queue uses the URL's own, 0 by default)."""


class PlanError(ValueError):
    """Options that do not make a run: a part that nothing starts and no URL names, say."""


@dataclass(frozen=True)
class UpOptions:
    """What `vistarl up` was asked (see `vistarl/cli/up.py` for each flag)."""

    config: Path
    out: Path
    overrides: tuple[str, ...] = ()
    workers: int = 1
    trainer_gpus: tuple[int, ...] = ()
    engine_gpus: tuple[int, ...] = ()
    roles: tuple[Role, ...] = ROLES
    redis_url: str | None = None
    env_url: str | None = None
    engine_url: str | None = None
    host: str = LOOPBACK
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    resume: bool = False
    engines: int | None = None

    @property
    def colocated(self) -> bool:
        """Whether the trainer's ranks generate on their own GPUs: the same GPUs named for both roles, both
        run here."""
        both_here = {"engine", "trainer"} <= set(self.roles) and self.engine_url is None
        return both_here and bool(self.trainer_gpus) and set(self.trainer_gpus) == set(self.engine_gpus)

    @property
    def engine_count(self) -> int:
        """Engine servers the engine role starts: one per engine GPU, else `engines` (one) on the CPU."""
        return len(self.engine_gpus) or self.engines or 1


@dataclass(frozen=True)
class ProcessSpec:
    """One process of the plan: its command and environment, how to tell it is up (`ready`: an
    `http://` URL that answers 2xx or a `tcp://host:port` that accepts), whether it is a long-lived
    service that is restarted when it dies (`restart`) or the run itself, whose exit ends everything,
    and how long it gets to stop after SIGTERM before SIGKILL."""

    name: str
    role: Role
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    ready: str | None = None
    restart: bool = True
    stop_grace_s: float = 10.0
    start_timeout_s: float = 60.0


@dataclass(frozen=True)
class Plan:
    """The processes this host runs, in start order, and where the run's parts are."""

    processes: tuple[ProcessSpec, ...]
    run_dir: Path | None
    urls: dict[str, str]
    gpus: tuple[int, ...]


def plan_processes(options: UpOptions) -> Plan:
    """The plan for `options` (see the module docstring); a `PlanError` says what is missing or wrong."""
    cfg = _load(options, options.overrides)
    _check(options, cfg)
    ports = _Ports(options.host)
    near = reach(options.host)
    specs: list[ProcessSpec] = []
    redis_url = options.redis_url
    if redis_url is None and "redis" in options.roles:
        port = ports.take("redis")
        redis_url = f"redis://{near}:{port}/0"
        specs.append(_redis(options, port))
    env_url = options.env_url
    if env_url is None and "env" in options.roles:
        assert redis_url is not None  # _check: the env server keeps its sessions in Redis
        port = ports.take("env")
        env_url = f"http://{near}:{port}"
        specs.append(_env_server(options, cfg, port, redis_url))
    engine_url = options.engine_url
    if engine_url is None and "engine" in options.roles and not options.colocated:
        engine_ports = [ports.take("engine", index) for index in range(options.engine_count)]
        engine_url = ",".join(f"http://{near}:{port}" for port in engine_ports)
        specs += [_engine(options, cfg, index, port) for index, port in enumerate(engine_ports)]
    urls = {"redis": redis_url, "env": env_url, "engine": engine_url}
    if "workers" in options.roles and not options.colocated:
        specs += [
            _worker(options, cfg, index, ports.take("workers", index), urls)
            for index in range(options.workers)
        ]
    run_dir = None
    if "trainer" in options.roles:
        trainer = _trainer(options, urls)
        run_dir = _load(options, _trainer_overrides(trainer)).train.run_dir
        specs.append(trainer)
    gpus = tuple(sorted({*options.trainer_gpus, *options.engine_gpus}))
    return Plan(tuple(specs), run_dir, {k: v for k, v in urls.items() if v is not None}, gpus)


def vistarl(*args: str) -> tuple[str, ...]:
    """A `vistarl` command line, run by this interpreter (the checkout need not be installed)."""
    return (sys.executable, "-m", "vistarl.cli.main", *args)


def _load(options: UpOptions, overrides: tuple[str, ...]) -> TrainConfig:
    """The run's config with `overrides`; a bad file or key is a `PlanError`."""
    try:
        return load_config(options.config, list(overrides))
    except ConfigError as exc:
        raise PlanError(str(exc)) from None


def _check(options: UpOptions, cfg: TrainConfig) -> None:
    """Every part that a started process needs is started here or named by a URL."""
    roles = options.roles
    needs = {
        "redis": {"env", "workers", "trainer"},
        "env": {"workers", "trainer"},
        "engine": {"workers", "trainer"},
    }
    given = {"redis": options.redis_url, "env": options.env_url, "engine": options.engine_url}
    flags = {"redis": "--redis-url", "env": "--env-url", "engine": "--engine-url"}
    for part, users in needs.items():
        using = sorted(users & set(roles) - {part})
        if using and part not in roles and given[part] is None:
            raise PlanError(f"{', '.join(using)} need {part}: give --role {part} or {flags[part]}")
    both_here = {"engine", "trainer"} <= set(roles) and options.engine_url is None
    if both_here and bool(options.trainer_gpus) != bool(options.engine_gpus):
        raise PlanError(
            "name GPUs for both the trainer and the engine (--trainer-gpus, --engine-gpus), or neither"
        )
    shared = set(options.trainer_gpus) & set(options.engine_gpus)
    if both_here and shared and not options.colocated:
        raise PlanError(
            f"GPUs {','.join(map(str, sorted(shared)))} are named for both roles: give the trainer and the "
            "engines the same GPUs (colocated) or separate ones"
        )
    if options.engines is not None and options.engine_gpus and options.engines != len(options.engine_gpus):
        raise PlanError(
            f"--engines {options.engines} with {len(options.engine_gpus)} engine GPUs: one engine runs on "
            "each engine GPU"
        )
    if options.nnodes > 1 and not re.fullmatch(r"[^:\s]+:\d+", options.rdzv_endpoint or ""):
        raise PlanError("a trainer over several nodes (--nnodes) needs torchrun's --rdzv-endpoint HOST:PORT")
    if not 0 <= options.node_rank < options.nnodes:
        raise PlanError(f"--node-rank {options.node_rank} is not one of the {options.nnodes} nodes' ranks")
    if "redis" in roles and options.redis_url is None and shutil.which("redis-server") is None:
        raise PlanError(
            "no redis-server on PATH: install it (Debian: apt-get install redis-server) or give --redis-url"
        )
    starts_engine = "engine" in roles and options.engine_url is None
    if starts_engine and not Path(cfg.model.path).is_dir():
        raise PlanError(f"model.path={cfg.model.path} is not a checkpoint directory (set it with --set)")


class _Ports:
    """Free ports when servers listen on loopback, the compose file's ports when they listen beyond it."""

    def __init__(self, host: str) -> None:
        self.fixed = not is_loopback(host)

    def take(self, part: str, index: int = 0) -> int:
        """The port of `part`'s server number `index`."""
        return COMPOSE_PORTS[part] + index if self.fixed else free_port()


def _redis(options: UpOptions, port: int) -> ProcessSpec:
    """`redis-server` as compose runs it (AOF, fsync always, noeviction), its data under DIR/redis."""
    data = options.out / "redis"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        "redis-server", "--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction",
        "--port", str(port), "--bind", options.host, "--dir", str(data.resolve()),
    ]  # fmt: skip
    if not is_loopback(options.host):
        argv += ["--protected-mode", "no"]  # other hosts connect; no password, as in compose
    return ProcessSpec(
        "redis", "redis", tuple(argv), ready=f"tcp://{reach(options.host)}:{port}",
        stop_grace_s=STOP_GRACE_S["redis"], start_timeout_s=START_TIMEOUT_S["redis"],
    )  # fmt: skip


def _env_server(options: UpOptions, cfg: TrainConfig, port: int, redis_url: str) -> ProcessSpec:
    """`vistarl serve ENV`, its sessions in Redis, as compose's env services, with room for twice the
    episodes the workers run at once (a restarted worker's sessions stay until they expire), the server's
    default at least: past it, resets wait out 503s."""
    sessions = _database(redis_url, SESSIONS_DB)
    room = max(
        ServerSettings.model_fields["max_sessions"].default, 2 * options.workers * cfg.rollout.concurrency
    )
    argv = vistarl(
        "serve", cfg.env.name, "--host", options.host, "--port", str(port), "--session-store", sessions,
        "--max-sessions", str(room),
    )  # fmt: skip
    return ProcessSpec(
        _safe_name(cfg.env.name), "env", argv, ready=f"http://{reach(options.host)}:{port}/health",
        stop_grace_s=STOP_GRACE_S["env"], start_timeout_s=START_TIMEOUT_S["env"],
    )  # fmt: skip


def _engine(options: UpOptions, cfg: TrainConfig, index: int, port: int) -> ProcessSpec:
    """`vistarl engine serve` number `index` on the run's checkpoint (of `model.arch`), on its engine GPU (or
    the CPU), awaiting weights, with the run's prefix cache; `engine`, or `engine-0`, `engine-1`, ... when
    there are several."""
    count = options.engine_count
    device = "cuda" if options.engine_gpus else "cpu"
    argv = vistarl(
        "engine", "serve", "--model", str(cfg.model.path), "--arch", cfg.model.arch, "--host", options.host,
        "--port", str(port), "--device", device, "--await-weights",
    )  # fmt: skip
    if "VISTARL_MAX_BATCH_SIZE" not in os.environ:  # batch its share of the episodes the workers run at once
        argv += ("--max-batch-size", str(math.ceil(options.workers * cfg.rollout.concurrency / count)))
    prefixes = cfg.rollout.prefix_cache
    argv += ("--prefix-cache-mb", str(cfg.rollout.prefix_cache_mb)) if prefixes else ("--no-prefix-cache",)
    gpus = options.engine_gpus[index : index + 1]
    return ProcessSpec(
        "engine" if count == 1 else f"engine-{index}", "engine", argv, env=_visible(gpus),
        ready=f"http://{reach(options.host)}:{port}/health", stop_grace_s=STOP_GRACE_S["engine"],
        start_timeout_s=START_TIMEOUT_S["engine"],
    )  # fmt: skip


def _worker(
    options: UpOptions, cfg: TrainConfig, index: int, port: int, urls: dict[str, str | None]
) -> ProcessSpec:
    """`vistarl worker` as compose's worker service, on this run's queue, engine and env server."""
    argv = vistarl(
        "worker",
        f"--redis-url={urls['redis']}",
        f"--namespace={cfg.rollout.namespace}",
        f"--engine=sglang:{urls['engine']}",
        f"--env-url={cfg.env.name}={urls['env']}",
        f"--concurrency={cfg.rollout.concurrency}",
        f"--metrics-port={port}",
        f"--shutdown-grace-s={WORKER_SHUTDOWN_GRACE_S:g}",
    )
    return ProcessSpec(
        f"worker-{index}", "workers", argv, ready=f"http://{reach(options.host)}:{port}/metrics",
        stop_grace_s=STOP_GRACE_S["workers"], start_timeout_s=START_TIMEOUT_S["workers"],
    )  # fmt: skip


def _trainer(options: UpOptions, urls: dict[str, str | None]) -> ProcessSpec:
    """`vistarl train` on the config, its rollouts through the queue, the external workers and the engine
    servers, weights pushed over NCCL unless the user's `--set sync.mode` says otherwise (the defaults come
    before the user's overrides, the URLs after); or, colocated, every rank's workers and embedded engine,
    pushed in process. Under torchrun on the trainer GPUs (and nodes), plainly on the CPU;
    with `--resume` when the run resumes."""
    overrides = [
        f"train.run_dir={options.out.resolve() / 'run'}",
        *(() if options.colocated else ("sync.mode=nccl",)),
        *options.overrides,
        f"rollout.queue={urls['redis']}",
        f"env.url={urls['env']}",
    ]
    if options.colocated:
        overrides += [f"rollout.local_workers={options.workers}", "rollout.engine=hf"]
    else:
        overrides += ["rollout.local_workers=0", f"rollout.engine=sglang:{urls['engine']}"]
    if is_loopback(options.host) and not options.colocated:
        overrides.append(f"sync.master_port={free_port()}")
    train = (
        "-m",
        "vistarl.cli.main",
        "train",
        "--config",
        str(options.config),
        *(("--resume",) if options.resume else ()),
        *(f"--set={o}" for o in overrides),
    )
    if not options.trainer_gpus:  # on the CPU, even where GPUs are
        return ProcessSpec(
            "trainer", "trainer", (sys.executable, *train), env=_visible(()), restart=False,
            stop_grace_s=STOP_GRACE_S["trainer"],
        )  # fmt: skip
    nodes: tuple[str, ...] = ("--standalone",)
    if options.nnodes > 1:  # static rendezvous: global rank 0, which drives the run, is on node rank 0
        address, _, port = (options.rdzv_endpoint or "").rpartition(":")
        nodes = (
            f"--nnodes={options.nnodes}",
            f"--node-rank={options.node_rank}",
            f"--master-addr={address}",
            f"--master-port={port}",
        )
    torchrun = (
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={len(options.trainer_gpus)}",
        *nodes,
    )
    return ProcessSpec(
        "trainer", "trainer", (*torchrun, *train), env=_visible(options.trainer_gpus), restart=False,
        stop_grace_s=STOP_GRACE_S["trainer"],
    )  # fmt: skip


def _trainer_overrides(trainer: ProcessSpec) -> tuple[str, ...]:
    """The `--set` overrides of the trainer's command line."""
    return tuple(arg.removeprefix("--set=") for arg in trainer.argv if arg.startswith("--set="))


def _visible(gpus: tuple[int, ...]) -> dict[str, str]:
    """The environment that shows a process only `gpus` (none: the CPU)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}


def _database(redis_url: str, db: int) -> str:
    """`redis_url` pointed at database `db` of the same server."""
    base, _, last = redis_url.rstrip("/").rpartition("/")
    return f"{base}/{db}" if last.isdigit() and base.count("/") >= 2 else f"{redis_url.rstrip('/')}/{db}"


def _safe_name(env: str) -> str:
    """A process name for an env (`sokoban`, or an import path's last part): letters, digits, `-`, `_`."""
    last = env.replace(":", ".").rsplit(".", 1)[-1]
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in last) or "env"
