"""Rank commands: typed, validated once where they are decoded, and carried out by every rank of a run.

The last test runs two steps of `run_training` on two CPU ranks (gloo, torchrun): rank 0 drives the
stack, rank 1 follows its commands through the real broadcast, and both agree on the run directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import torch.distributed as dist

from tests.machine import outlasting
from vistarl.httpserver.launch import free_port
from vistarl.trainer.learner.checkpoint import TrainerState
from vistarl.trainer.rollout.trajectory import Behaviour, Status, Trajectory
from vistarl.trainer.run import ranks
from vistarl.trainer.run.rank_commands import Push, Save, Stop, Train, decode, encode

REPO = Path(__file__).resolve().parent.parent
RANKS_S = 280.0
"""How long two torchrun ranks may take to train two steps here."""


def played(episode_id: str) -> Trajectory:
    """A two-token episode with one generated token and one image."""
    return Trajectory(
        episode_id=episode_id,
        group_id="g",
        policy_version=2,
        status=Status.COMPLETED,
        train_ids=[5, 6],
        loss_mask=[0, 1],
        rollout_logprobs=[0.0, -0.5],
        turn_index=[0, 0],
        images=["data:image/png;base64,AAAA"],
        image_grid_thw=[(1, 2, 2)],
        episode_reward=1.0,
        metrics={"turns": 1.0},
        behaviour=Behaviour(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, max_staleness=1),
    )


@pytest.mark.parametrize(
    "command",
    [
        Train(3, [played("a"), played("b")], TrainerState(3, 4, 12, python_rng=[3, [1, 2], None])),
        Train(1, [], None),
        Push(7),
        Push(8, reconnect=True, engines=(0, 2)),
        Save(TrainerState(5, 5, 20, python_rng=[3, [1, 2], None])),
        Stop(),
    ],
    ids=["train-and-save", "train", "push", "push-to-some-engines", "save", "stop"],
)
def test_a_command_decodes_to_an_equal_command(command: Train | Push | Save | Stop) -> None:
    assert decode(encode(command)) == command


def test_a_train_command_with_an_invalid_trajectory_is_refused_naming_the_field() -> None:
    name, fields = msgpack.unpackb(encode(Train(1, [played("a")])), raw=False)
    fields["trajectories"][0]["loss_mask"] = [0]
    with pytest.raises(ValueError, match="tracks aligned with train_ids differ in length"):
        decode(msgpack.packb([name, fields], use_bin_type=True))


def test_an_unknown_command_is_refused() -> None:
    with pytest.raises(ValueError, match="not a rank command: 'Train2'"):
        decode(msgpack.packb(["Train2", {}], use_bin_type=True))


@pytest.mark.slow  # two torchrun ranks: minutes of CPU
@outlasting(RANKS_S)
def test_rank_messages_travel_on_a_cpu_group_of_their_own(tmp_path: Path) -> None:
    """A rank waiting for rank 0's next command holds no GPU: the messages go over a gloo group beside the
    default one (NCCL on GPUs), made once."""
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        assert ranks.broadcast_bytes(b"step 3") == b"step 3"
        assert ranks.gather_bytes(b"http://127.0.0.1:1") == [b"http://127.0.0.1:1"]
        group = ranks._control_group()
        assert group is not dist.group.WORLD and dist.get_backend(group) == "gloo"
        assert ranks._control_group() is group
    finally:
        dist.destroy_process_group()
        ranks._control_group.cache_clear()


def test_two_ranks_train_two_steps_as_rank_0_commands(tiny_qwen25: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    worker = [str(REPO / "tests" / "train_ranks_worker.py"), str(tiny_qwen25), str(out_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [*launcher, "--master-port", str(free_port()), *worker]
    subprocess.run(command, env=env, cwd=tmp_path, timeout=RANKS_S, check=True)
    lead, follower = (json.loads((out_dir / f"rank{r}.json").read_text()) for r in (0, 1))
    run_dir = Path(lead["run_dir"])
    assert follower["run_dir"] == lead["run_dir"] and run_dir.parent == Path("runs")
    assert run_dir.name.startswith("ranks-")
    assert [r["step"] for r in lead["history"]] == [1, 2] and follower["history"] == []
    assert [r["policy_version"] for r in lead["history"]] == [1.0, 2.0]
    assert all(r["train/trajectories"] == 8 for r in lead["history"])
    checkpoint = tmp_path / run_dir / "checkpoints" / "step-000002"
    assert lead["checkpoint"] == str(run_dir / "checkpoints" / "step-000002")
    assert sorted(p.name for p in checkpoint.glob("rng-rank*")) == [
        "rng-rank0.safetensors",
        "rng-rank1.safetensors",
    ]
