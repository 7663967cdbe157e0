"""The commands rank 0 sends every rank of a training run, typed, and how they travel.

Rank 0 drives the run; every rank (rank 0 included) carries out each command it sends, in order:

- `Train`: one update on a step's trajectories, then a checkpoint if it names the state to save;
- `Push`: the weights to the engine as a policy version (every rank gathers, rank 0 sends), over a
  connection formed afresh when it says `reconnect` (an engine restarted, or one of a pool's is down);
- `Save`: a checkpoint of the run as a state, outside a step (a run stopped between steps);
- `Stop`: the run is over.

Rank 0 keeps its own command object as it is. Under torchrun the others receive it as msgpack bytes
in a tensor broadcast (no pickle), tagged with the command's class name, and validate it as they decode
it: the one validation a trajectory gets on those ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack
from pydantic import TypeAdapter

from vistarl.trainer.learner.checkpoint import TrainerState
from vistarl.trainer.learner.fsdp import is_distributed
from vistarl.trainer.rollout.trajectory import Trajectory
from vistarl.trainer.run.ranks import broadcast_bytes, current_rank

__all__ = ["Push", "RankCommand", "Save", "Stop", "Train", "decode", "encode", "share_command"]


@dataclass(frozen=True)
class Train:
    """Update on step `step`'s trajectories; with `checkpoint`, then save the run as that state."""

    step: int
    trajectories: list[Trajectory]
    checkpoint: TrainerState | None = None


@dataclass(frozen=True)
class Push:
    """Send the actor's weights to the engine as policy version `version`; with `reconnect`, over a new
    connection (the engine may be a new process that never joined the old one), to `engines` of an engine
    pool's servers (indices; None: all of them)."""

    version: int
    reconnect: bool = False
    engines: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Save:
    """Save the run as `state`: the checkpoint of a run stopped after a step that did not save one."""

    state: TrainerState


@dataclass(frozen=True)
class Stop:
    """The run is over: the other ranks stop following."""


RankCommand = Train | Push | Save | Stop

_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    kind.__name__: TypeAdapter(kind) for kind in (Train, Push, Save, Stop)
}


def encode(command: RankCommand) -> bytes:
    """msgpack of `[class name, fields]`, the fields as JSON-safe data."""
    name = type(command).__name__
    return bytes(msgpack.packb([name, _ADAPTERS[name].dump_python(command, mode="json")], use_bin_type=True))


def decode(payload: bytes) -> RankCommand:
    """The command `encode` wrote, validated; anything else is a `ValueError`."""
    name, fields = msgpack.unpackb(payload, raw=False)
    if name not in _ADAPTERS:
        raise ValueError(f"not a rank command: {name!r}")
    command: RankCommand = _ADAPTERS[name].validate_python(fields)
    return command


def share_command(command: RankCommand | None) -> RankCommand:
    """Rank 0's `command` on every rank (the others pass None); rank 0 keeps its own object."""
    if current_rank() != 0:
        return decode(broadcast_bytes(None))
    if command is None:
        raise ValueError("rank 0 gives the command")
    if is_distributed():
        broadcast_bytes(encode(command))
    return command
