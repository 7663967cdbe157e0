"""Training checkpoints: save everything a run needs to continue exactly, and find and load it again.

A checkpoint is a directory `run_dir/checkpoints/step-NNNNNN/`:

- `actor/`: an HF checkpoint directory (full state dict, checkpoint names, tokenizer and processor
  files), loadable by `from_pretrained`, SGLang and `vistarl eval`;
- `critic/`: the critic (backbone + `value_head.safetensors`) when the algorithm trains one;
- `optimizer.safetensors` + `optimizer.json` (and `critic_optimizer.*`): the full optimizer state,
  tensors in safetensors and the rest in JSON, so nothing is pickled;
- `rng-rank{R}.safetensors`: each rank's torch CPU (and CUDA) generator states;
- `trainer_state.json`: step, policy version, the prompt cursor (procedural seed or dataset position)
  and Python's RNG state.

It is written under a temporary name and renamed when complete, so a crash mid-save never leaves a
checkpoint that looks whole; `checkpoints/latest` names the newest one.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from transformers import PretrainedConfig

from vistarl.trainer.learner.fsdp import full_state_dict
from vistarl.trainer.learner.models import save_critic
from vistarl.trainer.weights.disk import save_hf_weights

__all__ = [
    "CheckpointError",
    "Schedule",
    "TrainerState",
    "checkpoint_dir",
    "latest_checkpoint",
    "load_optimizer",
    "load_schedulers",
    "load_trainer_state",
    "prune_checkpoints",
    "restore_rng",
    "save_checkpoint",
]

CHECKPOINTS = "checkpoints"
LATEST = "latest"
STATE_FILE = "trainer_state.json"
SCHEDULERS_FILE = "lr_schedulers.json"
_SEPARATOR = "::"


class Schedule(Protocol):
    """What a checkpoint keeps of a schedule (a learning rate's, the entropy bonus's): its state, as JSON."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, incomplete or does not fit the run."""


@dataclass(frozen=True)
class TrainerState:
    """Where the run stands after `step` completed steps."""

    step: int
    policy_version: int
    prompt_cursor: int
    python_rng: list[Any] | None = None


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """The directory of the checkpoint taken after `step` steps."""
    return run_dir / CHECKPOINTS / f"step-{step:06d}"


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of a run directory, or None."""
    pointer = run_dir / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    path = run_dir / CHECKPOINTS / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(f"{pointer} names {path.name}, which is not a complete checkpoint")
    return path


def save_checkpoint(
    run_dir: Path,
    state: TrainerState,
    *,
    actor: nn.Module,
    actor_optimizer: torch.optim.Optimizer,
    hf_config: PretrainedConfig,
    source_dir: Path,
    critic: nn.Module | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    schedulers: Mapping[str, Schedule] | None = None,
    rank: int = 0,
    barrier: Any = None,
    keep: int | None = None,
) -> Path:
    """Save a checkpoint after `state.step` steps; every rank calls it (gathering shards is collective).

    `barrier` (e.g. `torch.distributed.barrier`) separates the ranks' writes from rank 0's rename;
    `keep` (`train.keep_checkpoints`) leaves only that many of the newest checkpoints on disk.
    """
    final = checkpoint_dir(run_dir, state.step)
    staging = final.with_name(final.name + ".partial")
    actor_state = full_state_dict(actor)
    actor_optim = _full_optimizer_state(actor, actor_optimizer)
    critic_state = full_state_dict(critic) if critic is not None else None
    critic_optim = (
        _full_optimizer_state(critic, critic_optimizer)
        if critic is not None and critic_optimizer is not None
        else None
    )
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_hf_weights(actor_state, hf_config, staging / "actor", source_dir)
        _save_optimizer(actor_optim, staging / "optimizer")
        if critic_state is not None:
            save_critic(critic_state, hf_config, staging / "critic")
        if critic_optim is not None:
            _save_optimizer(critic_optim, staging / "critic_optimizer")
        states = {name: scheduler.state_dict() for name, scheduler in (schedulers or {}).items()}
        (staging / SCHEDULERS_FILE).write_text(json.dumps(states) + "\n")
    if barrier is not None:
        barrier()
    save_file(_rng_state(), str(staging / f"rng-rank{rank}.safetensors"))
    if barrier is not None:
        barrier()
    if rank == 0:
        record = {**asdict(state), "python_rng": _python_rng()}
        (staging / STATE_FILE).write_text(json.dumps(record) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        (run_dir / CHECKPOINTS / LATEST).write_text(final.name + "\n")
        if keep is not None:
            prune_checkpoints(run_dir, keep)
    if barrier is not None:
        barrier()
    return final


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Delete all but the `keep` newest complete checkpoints of a run; returns the deleted ones.

    Checkpoints are ordered by step (their zero-padded names); staging directories are left alone.
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1, not {keep}")
    complete = sorted(
        path for path in (run_dir / CHECKPOINTS).glob("step-*") if (path / STATE_FILE).is_file()
    )
    stale = complete[:-keep]
    for path in stale:
        shutil.rmtree(path)
    return stale


def load_trainer_state(path: Path) -> TrainerState:
    """The `TrainerState` of a checkpoint directory."""
    try:
        data = json.loads((path / STATE_FILE).read_text())
        return TrainerState(**data)
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"cannot read {path / STATE_FILE}: {exc}") from exc


def load_optimizer(path: Path, name: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Restore `optimizer` (of `model`, plain or FSDP-sharded) from `path/name.*`; every rank calls it."""
    try:
        tensors = load_file(str(path / f"{name}.safetensors"))
        groups = json.loads((path / f"{name}.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read the {name} state in {path}: {exc}") from exc
    state: dict[str, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        fqn, _, field = key.rpartition(_SEPARATOR)
        state.setdefault(fqn, {})[field] = tensor
    full = {"state": state, "param_groups": groups}
    if len(groups) != len(optimizer.param_groups):
        raise CheckpointError(
            f"the {name} state in {path} has {len(groups)} parameter groups, the optimizer "
            f"{len(optimizer.param_groups)}"
        )
    # torch refuses saved group entries the live optimizer lacks: those a scheduler adds (`initial_lr`),
    # when none is attached yet
    for live, saved in zip(optimizer.param_groups, groups, strict=True):
        for key, value in saved.items():
            live.setdefault(key, value)
    # not strict: a parameter that never had a gradient (the vision tower of a text-only run) has no state
    options = StateDictOptions(full_state_dict=True, strict=False)
    optimizer.zero_grad(set_to_none=True)  # torch creates the state to fill only when no gradient is set
    set_optimizer_state_dict(model, optimizer, full, options=options)


def load_schedulers(path: Path, schedulers: Mapping[str, Schedule]) -> None:
    """Restore the schedules saved with `path`: the learning rates' positions in warmup, the entropy
    bonus's weight."""
    try:
        states = json.loads((path / SCHEDULERS_FILE).read_text())
        for name, scheduler in schedulers.items():
            scheduler.load_state_dict(states[name])
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"cannot restore the schedules from {path}: {exc!r}") from exc


def restore_rng(path: Path, rank: int, state: TrainerState) -> None:
    """Restore this rank's torch generators and Python's RNG as they were when the checkpoint was saved."""
    rng_file = path / f"rng-rank{rank}.safetensors"
    if not rng_file.is_file():
        raise CheckpointError(f"{rng_file} is missing: was the run saved with a different number of ranks?")
    saved = load_file(str(rng_file))
    torch.set_rng_state(saved["cpu"])
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            if f"cuda:{index}" in saved:
                torch.cuda.set_rng_state(saved[f"cuda:{index}"], index)
    if state.python_rng is not None:
        version, internal, gauss = state.python_rng
        random.setstate((version, tuple(internal), gauss))


def _full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """The full (unsharded, CPU) optimizer state keyed by parameter names; `{}` off rank 0 under FSDP."""
    if optimizer is None:
        return {}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return dict(get_optimizer_state_dict(model, optimizer, options=options))


def _save_optimizer(full: Mapping[str, Any], prefix: Path) -> None:
    """Tensors of the per-parameter state to `prefix.safetensors`, the param groups to `prefix.json`."""
    tensors = {
        f"{fqn}{_SEPARATOR}{field}": value.detach().cpu().contiguous()
        for fqn, fields in full.get("state", {}).items()
        for field, value in fields.items()
    }
    save_file(tensors, str(prefix.with_suffix(".safetensors")))
    prefix.with_suffix(".json").write_text(json.dumps(full.get("param_groups", []), indent=1) + "\n")


def _rng_state() -> dict[str, torch.Tensor]:
    """This process's torch generator states."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, cuda_state in enumerate(torch.cuda.get_rng_state_all()):
            states[f"cuda:{index}"] = cuda_state
    return states


def _python_rng() -> list[Any]:
    """Python's RNG state as JSON-safe lists."""
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]
