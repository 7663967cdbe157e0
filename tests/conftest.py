"""Shared fixtures: a private Redis server per test session, tiny checkpoints, both env clients; and how
the files share xdist workers (`make pytest`)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.client_kinds import BlockingAsyncClient, Client
from tests.servers import wait_until
from vistarl.clients import EnvClient
from vistarl.devtools.servers import redis_server

if TYPE_CHECKING:
    from tests.hf_models import Loaded

if "PYTEST_XDIST_WORKER" in os.environ:
    # Workers share the cores: torch in each (and in the processes it starts) runs one thread, where a pool
    # per core in every worker would spin against the others. Set before any test module imports torch.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

SLOW_FIRST = (
    "test_up.py",
    "test_demo_learns.py",
    "test_sft.py",
    "test_eval.py",
    "test_train_cli.py",
    "test_trl.py",
    "test_openenv_validate.py",
    "test_engine_serve.py",
    "test_fsdp.py",
    "test_engine_hf.py",
    "test_playground.py",
    "test_update.py",
    "test_weight_sync.py",
    "test_tiny_checkpoint.py",
    "test_documented_commands.py",
    "test_train_loop.py",
    "test_openenv_train.py",
    "test_rollout_hf.py",
    "test_fsdp_models.py",
    "test_vision_passes.py",
    "test_optimizers.py",
    "test_memory_budget.py",
    "test_up_preflight.py",
)
"""The files that take longest, dealt to xdist workers first (`--dist loadfile`), so that none of them
starts last and keeps one worker busy after the others are done."""


NO_GPU = pytest.mark.skip(reason="needs CUDA, which CI's machines lack: `make gpu-test` runs it on a GPU")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of `SLOW_FIRST` first, in that order, then the rest as collected; each file stays whole.
    Tests marked `gpu` are skipped where CUDA is not available."""
    rank = {name: at for at, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    gpu = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu:
        import torch

        if not torch.cuda.is_available():
            for item in gpu:
                item.add_marker(NO_GPU)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real Redis: a private redis-server on a free port, or $REDIS_URL when there is no binary."""
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Path]:
    """Tiny random-init Qwen2.5-VL and Qwen3-VL checkpoint directories, written once per pytest run: the
    first xdist worker to ask writes them into the run's shared temporary directory, the others wait for
    it under a file lock and read them."""
    from vistarl.devtools.tiny_checkpoint import ARCHS, write_tiny_checkpoint

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_id != "master" else base) / "tiny-checkpoints"
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "written").exists():
            for arch in ARCHS:
                write_tiny_checkpoint(root / arch, arch, seed=0)
            (root / "written").touch()
    return {arch: root / arch for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_qwen25(tiny_checkpoints: dict[str, Path]) -> Path:
    """The tiny Qwen2.5-VL checkpoint directory."""
    return tiny_checkpoints["qwen2_5_vl"]


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_checkpoints: dict[str, Path]) -> Path:
    """The tiny Qwen3-VL checkpoint directory."""
    return tiny_checkpoints["qwen3_vl"]


@pytest.fixture(scope="module")
def qwen25(tiny_qwen25: Path) -> Loaded:
    """The tiny Qwen2.5-VL in fp32 with its processor, loaded once a module (tests/hf_models.py)."""
    from tests.hf_models import load

    return load(tiny_qwen25)


@pytest.fixture(scope="module")
def qwen3(tiny_qwen3: Path) -> Loaded:
    """The tiny Qwen3-VL in fp32 with its processor, loaded once a module."""
    from tests.hf_models import load

    return load(tiny_qwen3)


@pytest.fixture(scope="module")
def geo3k_graders() -> None:
    """This process's Geo3k grading processes, started before a module's gradings: a first grading waits
    at most its `grade_timeout_s` for a process starting in the background, and on a loaded machine the
    start (sympy, the LaTeX grammar) can take longer. The module's bounds then measure grading alone."""
    from vistarl.services.geo3k.grader import shared_pool

    pool = shared_pool()

    def full() -> bool:
        pool.warm()  # again after a start that failed or a process an earlier module's test lost
        return pool.size == pool.max_workers

    assert wait_until(full, timeout=120), "no grading process started"


@pytest.fixture(params=[EnvClient, BlockingAsyncClient], ids=["sync", "async"])
def client_type(request: pytest.FixtureRequest) -> type[Client]:
    """Each test that takes it runs with `EnvClient` and with `AsyncEnvClient` (`tests.client_kinds`)."""
    return request.param  # type: ignore[no-any-return]
