"""`vistarl up`'s preflight (vistarl/launcher/preflight.py), with real processes of `vistarl up`: a run that
cannot work on this host as asked exits 2 before any process starts, with one line naming what to change,
and leaves nothing of its own running. Where a case needs what this host lacks, a stand-in program on PATH
plays it: `nvidia-smi` listing GPUs 0 and 1, `redis-server` saying it is Redis 6.2. A directory in use and
a finished one are refused against real runs in tests/test_up.py."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from tests.machine import require
from vistarl.devtools.servers import vistarl_cmd
from vistarl.httpserver.launch import stop_process

ROOT = Path(__file__).resolve().parents[1]
TINY_CONFIG = str(ROOT / "configs" / "sokoban_tiny.yaml")
NVIDIA_SMI_STAND_IN = (
    '#!/bin/sh\n# a stand-in for the driver\'s tool on a host with GPUs 0 and 1\nprintf "0\\n1\\n"\n'
)
REDIS_6_STAND_IN = (
    '#!/bin/sh\n# a stand-in for Redis 6.2\'s server\necho "Redis server v=6.2.14 sha=00000000:0 bits=64"\n'
)


def bin_dir(tmp_path: Path, *stand_ins: tuple[str, str]) -> str:
    """A PATH of one folder: the real `redis-server` (or its stand-in), the stand-ins given, nothing else."""
    redis = shutil.which("redis-server")
    require(redis is not None, "vistarl up starts redis-server: install it")
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "redis-server").symlink_to(str(redis))
    for name, script in stand_ins:
        (folder / name).unlink(missing_ok=True)
        (folder / name).write_text(script)
        (folder / name).chmod(0o755)
    return str(folder)


def refused(out: Path, path: str, *flags: str) -> str:
    """Run `vistarl up` with `flags` and PATH `path`; assert it exits 2 with one line, having started nothing
    and left no process of its session; that line."""
    args = vistarl_cmd("up", "--config", TINY_CONFIG, "--out", str(out), *flags)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": path}
    run = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        said, line = run.communicate(timeout=120)
    finally:
        stop_process(run)  # type: ignore[arg-type]
    assert run.returncode == 2, said + line
    assert said == "" and len(line.splitlines()) == 1, said + line
    with pytest.raises(ProcessLookupError):  # nothing of its session (its process group) lives on
        os.killpg(run.pid, 0)
    assert not any((out / name).exists() for name in ("up.json", "processes.json", "logs", "pids"))
    return line.strip()


@pytest.mark.parametrize(
    ("flags", "stand_ins", "said"),
    [
        (
            ("--trainer-gpus", "0", "--engine-gpus", "0"),
            (),
            r"--trainer-gpus 0 and --engine-gpus 0, but this host has no NVIDIA driver "
            r"\(no nvidia-smi on PATH\): name no GPUs to run on the CPU",
        ),
        (
            ("--trainer-gpus", "0", "--engine-gpus", "2"),
            (("nvidia-smi", NVIDIA_SMI_STAND_IN),),
            r"--engine-gpus 2: GPU 2 is not on this host \(nvidia-smi lists 0,1\)",
        ),
        (
            ("--trainer-gpus", "0,0", "--engine-gpus", "1"),
            (("nvidia-smi", NVIDIA_SMI_STAND_IN),),
            r"--trainer-gpus 0,0 names GPU 0 more than once",
        ),
        (
            ("--trainer-gpus", "0,1", "--engine-gpus", "0"),
            (("nvidia-smi", NVIDIA_SMI_STAND_IN),),
            r"GPUs 0 are named for both roles: give the trainer and the engines the same GPUs \(colocated\) "
            r"or separate ones",
        ),
        (
            (),
            (("redis-server", REDIS_6_STAND_IN),),
            r"redis-server on PATH \(\S+\) is Redis 6\.2\.14; the queue's scripts need Redis 7 or later: "
            r"install it, or give --redis-url",
        ),
        (
            ("--set", "model.arch=qwen3_vl"),
            (),
            r"\S+ holds a qwen2_5_vl checkpoint \(its config.json's model_type\), but model.arch is "
            r"qwen3_vl: .*",
        ),
        (
            ("--host", "192.0.2.1"),  # TEST-NET-1: an address no host here has
            (),
            r"--host 192\.0\.2\.1 is not an address of this host \(.*\): .*",
        ),
    ],
    ids=[
        "gpus-without-a-driver",
        "a-gpu-not-here",
        "a-gpu-twice",
        "engine-on-rank-0s-gpu",
        "redis-6",
        "arch",
        "host",
    ],
)
def test_a_run_that_cannot_work_is_refused_in_one_line_before_anything_starts(
    tmp_path: Path,
    tiny_qwen25: Path,
    flags: tuple[str, ...],
    stand_ins: tuple[tuple[str, str], ...],
    said: str,
) -> None:
    path = bin_dir(tmp_path, *stand_ins)
    line = refused(tmp_path / "up", path, "--set", f"model.path={tiny_qwen25}", *flags)
    assert re.fullmatch(f"vistarl up: {said}", line), line


def test_gpus_named_for_a_cpu_build_of_torch_are_refused(tmp_path: Path, tiny_qwen25: Path) -> None:
    import torch

    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    path = bin_dir(tmp_path, ("nvidia-smi", NVIDIA_SMI_STAND_IN))
    flags = ("--set", f"model.path={tiny_qwen25}", "--trainer-gpus", "0", "--engine-gpus", "1")
    line = refused(tmp_path / "up", path, *flags)
    assert re.fullmatch(
        r"vistarl up: --trainer-gpus 0 and --engine-gpus 1, but torch \S+ here is a CPU build: install "
        r"its CUDA build .*",
        line,
    ), line


def test_a_port_in_use_is_named_before_anything_starts(tmp_path: Path, tiny_qwen25: Path) -> None:
    """Beyond loopback the env server takes the compose file's port 8000; something listens there."""
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with contextlib.suppress(OSError):  # what listens there already is what this test needs
            taken.bind(("0.0.0.0", 8000))
            taken.listen()
        line = refused(
            tmp_path / "up",
            bin_dir(tmp_path),
            "--set", f"model.path={tiny_qwen25}", "--role", "env", "--redis-url", "redis://127.0.0.1:1/0",
            "--host", "0.0.0.0",
        )  # fmt: skip
    assert line == (
        "vistarl up: port 8000 on 0.0.0.0 (sokoban) is in use: stop what listens there "
        "(`ss -ltnp 'sport = :8000'` names it)"
    )
