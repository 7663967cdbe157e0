"""What `vistarl up` checks before it starts any process: a run that cannot work on this host as asked fails
here, at once, with one line that names what to change, instead of minutes later in a log.

In order: the directory is not in use by a live `vistarl up` (`lock.py`), nor does it hold an earlier run
unless the run resumes it; the GPU layout is one that works; the GPUs this host is to use exist and this
torch can use them; the `redis-server` to start is Redis 7 or later (the queue's Lua scripts need it); the
checkpoint the engine and the trainer load is of the config's `model.arch`; every port a server is to
listen on is free, and `--host` is an address of this host.

The trainer and the engine on exactly the same GPUs is the colocated layout, which passes here; GPU sets
that overlap without being the same, which cannot work (two processes on one GPU, and the weight sync's
NCCL group with both ends on one: "Duplicate GPU detected"), the plan refuses before the preflight runs.
"""

from __future__ import annotations

import errno
import re
import shutil
import socket
import subprocess
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from vistarl.launcher.addresses import is_loopback
from vistarl.launcher.lock import DirectoryInUse, held_by
from vistarl.launcher.plan import Plan, UpOptions
from vistarl.launcher.status import PLAN_FILE
from vistarl.trainer.config import ConfigError, TrainConfig, load_config

__all__ = ["MIN_REDIS", "PreflightError", "preflight"]

MIN_REDIS = (7, 0)
"""The oldest Redis whose Lua scripting the queue's scripts run on (they fail on 6.2)."""
QUERY_TIMEOUT_S = 10.0
"""How long `nvidia-smi` and `redis-server --version` may take to answer."""
BIND_ALL = {"workers"}
"""The roles whose servers listen on every address, whatever `--host` says: the workers' metrics
(prometheus_client's default)."""


class PreflightError(Exception):
    """A run that cannot work on this host as asked; the message is one line saying what to change."""


def preflight(options: UpOptions, plan: Plan) -> None:
    """Check `plan` (made from `options`) before anything starts; the first failure as a `PreflightError`."""
    cfg = load_config(options.config, list(options.overrides))
    here = {spec.role for spec in plan.processes}
    _directory(options.out, resume=options.resume or cfg.train.resume)
    trainer = options.trainer_gpus if "trainer" in here else ()
    engine = options.engine_gpus if "engine" in here or options.colocated else ()
    _gpu_layout(trainer, engine)
    _gpus_present({"--trainer-gpus": trainer, "--engine-gpus": engine})
    if "redis" in here:
        _redis_version()
    if here & {"engine", "trainer"}:
        try:
            cfg.model.check_arch()
        except ConfigError as exc:
            raise PreflightError(str(exc)) from None
    _ports(plan, options, cfg)


def _directory(out: Path, *, resume: bool) -> None:
    """`out` is neither run by a live `vistarl up` nor, unless resuming, holding a finished one."""
    pid = held_by(out)
    if pid is not None:
        raise PreflightError(str(DirectoryInUse(out, pid)))
    if (out / PLAN_FILE).is_file() and not resume:
        raise PreflightError(
            f"{out} holds an earlier run (its {PLAN_FILE}): continue it with --resume, or give another --out"
        )


def _gpu_layout(trainer: tuple[int, ...], engine: tuple[int, ...]) -> None:
    """No GPU named twice in one list. (Trainer and engine GPUs that overlap without being the same, the
    one layout of both that cannot work, the plan already refuses: `plan.plan_processes`.)"""
    for flag, gpus in (("--trainer-gpus", trainer), ("--engine-gpus", engine)):
        twice = sorted(gpu for gpu, n in Counter(gpus).items() if n > 1)
        if twice:
            raise PreflightError(f"{flag} {_listed(gpus)} names GPU {_listed(twice)} more than once")


def _gpus_present(named: dict[str, tuple[int, ...]]) -> None:
    """Every GPU named is one `nvidia-smi` lists, and this torch is a CUDA build."""
    named = {flag: gpus for flag, gpus in named.items() if gpus}
    if not named:
        return
    flags = " and ".join(f"{flag} {_listed(gpus)}" for flag, gpus in named.items())
    listed = _nvidia_gpus(flags)
    for flag, gpus in named.items():
        absent = sorted(set(gpus) - set(listed))
        if absent:
            raise PreflightError(
                f"{flag} {_listed(gpus)}: GPU {_listed(absent)} is not on this host (nvidia-smi lists "
                f"{_listed(listed) or 'none'})"
            )
    import torch

    if torch.version.cuda is None:
        raise PreflightError(
            f"{flags}, but torch {torch.__version__} here is a CPU build: install its CUDA build "
            '(docs/deploy.md, "A bare GPU host"), or name no GPUs to run on the CPU'
        )


def _nvidia_gpus(flags: str) -> list[int]:
    """The GPU indices `nvidia-smi` lists (the driver's own numbering, as CUDA_VISIBLE_DEVICES takes it)."""
    if shutil.which("nvidia-smi") is None:
        raise PreflightError(
            f"{flags}, but this host has no NVIDIA driver (no nvidia-smi on PATH): name no GPUs to run on "
            "the CPU"
        )
    query = ("nvidia-smi", "--query-gpu=index", "--format=csv,noheader")
    try:
        answer = subprocess.run(query, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=True)
        return [int(line) for line in answer.stdout.split()]
    except subprocess.CalledProcessError as exc:
        said = (exc.stdout + exc.stderr).strip().splitlines()
        raise PreflightError(f"{flags}, but nvidia-smi failed: {said[0] if said else exc}") from None
    except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
        raise PreflightError(f"{flags}, but nvidia-smi did not list the GPUs: {exc}") from None


def _redis_version() -> None:
    """The `redis-server` on PATH (plan.py made sure there is one) is Redis 7 or later."""
    try:
        answer = subprocess.run(
            ("redis-server", "--version"), capture_output=True, text=True, timeout=QUERY_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PreflightError(
            f"redis-server --version failed ({exc}): install Redis 7, or give --redis-url"
        ) from None
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", answer.stdout)
    if found is None:
        said = answer.stdout.strip() or answer.stderr.strip()
        raise PreflightError(
            f"redis-server --version said {said!r}, no version: install Redis 7, or give --redis-url"
        )
    version = tuple(int(part) for part in found.groups())
    if version[:2] < MIN_REDIS:
        raise PreflightError(
            f"redis-server on PATH ({shutil.which('redis-server')}) is Redis {'.'.join(found.groups())}; the "
            "queue's scripts need Redis 7 or later: install it, or give --redis-url"
        )


def _ports(plan: Plan, options: UpOptions, cfg: TrainConfig) -> None:
    """Every port this host's servers are to listen on can be bound: the plan's servers (their readiness
    URLs name the ports), and on rank 0's node beyond loopback the weight sync's and torchrun's."""
    wanted: list[tuple[str, str, int]] = []
    for spec in plan.processes:
        port = urlsplit(spec.ready).port if spec.ready else None
        if port is not None:
            wanted.append((spec.name, "0.0.0.0" if spec.role in BIND_ALL else options.host, port))
    trains_here = any(spec.role == "trainer" for spec in plan.processes)
    if trains_here and options.node_rank == 0 and not is_loopback(options.host):
        wanted.append(("the weight sync (sync.master_port)", "0.0.0.0", cfg.sync.master_port))
    if trains_here and options.node_rank == 0 and options.nnodes > 1 and options.rdzv_endpoint:
        rendezvous = int(options.rdzv_endpoint.rpartition(":")[2])  # plan.py checked HOST:PORT
        wanted.append(("torchrun (--rdzv-endpoint)", "0.0.0.0", rendezvous))
    for name, host, port in wanted:
        _bindable(name, host, port, options.host)


def _bindable(name: str, host: str, port: int, flag_host: str) -> None:
    """`host:port` can be bound as a server binds it (address reuse on, as Redis and uvicorn set it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PreflightError(
                    f"port {port} on {host} ({name}) is in use: stop what listens there "
                    f"(`ss -ltnp 'sport = :{port}'` names it)"
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
                raise PreflightError(
                    f"--host {flag_host} is not an address of this host ({exc.strerror}): give one of its "
                    "addresses, 0.0.0.0 for all of them, or 127.0.0.1"
                ) from None
            raise PreflightError(f"{name} cannot listen on {host}:{port}: {exc.strerror}") from None


def _listed(numbers: list[int] | tuple[int, ...]) -> str:
    """`0,1,2`, as the GPU flags write them."""
    return ",".join(map(str, numbers))
