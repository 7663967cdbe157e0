"""The GIL switch interval a GPU process runs with (`rollout.gil_switch_ms`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch

from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.modeling.device import shorten_switch_interval


@pytest.fixture
def python_default() -> Iterator[None]:
    """Each test starts from Python's 5 ms and leaves the interval as it found it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


@pytest.mark.usefixtures("python_default")
def test_a_gpu_process_runs_with_the_configured_interval_and_never_raises_it() -> None:
    shorten_switch_interval(RolloutConfig().gil_switch_ms, torch.device("cuda", 0))
    assert sys.getswitchinterval() == pytest.approx(0.05e-3, abs=2e-6)  # kept in whole microseconds
    shorten_switch_interval(1.0, torch.device("cuda", 0))  # a longer one leaves the shorter in place
    assert sys.getswitchinterval() == pytest.approx(0.05e-3, abs=2e-6)  # kept in whole microseconds


@pytest.mark.usefixtures("python_default")
def test_the_cpu_and_zero_leave_pythons_interval() -> None:
    shorten_switch_interval(0.05, torch.device("cpu"))
    shorten_switch_interval(0, torch.device("cuda", 0))
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="gil_switch_ms must be >= 0"):
        shorten_switch_interval(-1, torch.device("cuda", 0))
