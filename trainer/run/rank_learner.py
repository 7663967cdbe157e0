"""One rank's side of a training run: its models, their update, checkpoints and weight pushes.

`RankLearner` loads the actor (and reference, critic) from the configured model or from the
checkpoint being resumed, with their optimizers, schedulers and RNG states, and carries out rank 0's
`RankCommand`s (`vistarl.trainer.run.rank_commands`). Every collective runs on one dedicated compute thread,
so rank 0's event loop (workers, engine, HTTP) keeps going while the model trains.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import signal
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import torch
import torch.distributed as dist

from vistarl.trainer.config import TrainConfig
from vistarl.trainer.learner.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_optimizer,
    load_schedulers,
    load_trainer_state,
    restore_rng,
    save_checkpoint,
)
from vistarl.trainer.learner.fsdp import init_distributed, rank_device
from vistarl.trainer.learner.memory_budget import GIB, Budget, preflight
from vistarl.trainer.learner.models import Models, load_actor, load_critic, load_reference
from vistarl.trainer.learner.update import PolicyTrainer
from vistarl.trainer.modeling.device import shorten_switch_interval, use_device
from vistarl.trainer.rollout.engines.base import Engine
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.rank_commands import Push, RankCommand, Save, Stop, Train, share_command
from vistarl.trainer.run.ranks import barrier, current_rank
from vistarl.trainer.run.stack import DTYPES
from vistarl.trainer.weights.sync import WeightSync, weight_sync

__all__ = ["RankLearner"]


class RankLearner:
    """This rank's learner: loaded (or resumed) at construction, then driven by rank 0's commands.

    Rank 0 calls `command` for each action, which every rank carries out; the other ranks `follow`
    until `Stop`. `state` is where the run stood when it was loaded; `model_path` the actor it starts from.
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.distributed = init_distributed()
        self.rank = current_rank()
        self.device = rank_device()
        shorten_switch_interval(cfg.rollout.gil_switch_ms, self.device)  # packing's and launches' GIL waits
        cfg.model.check_arch()  # before anything loads: a checkpoint of another architecture is refused
        self.checkpoint = latest_checkpoint(run_dir) if resume else None
        if not resume and latest_checkpoint(run_dir) is not None:
            raise FileExistsError(
                f"{run_dir} already holds checkpoints: resume it (--resume) or pick another run_dir"
            )
        self.state = load_trainer_state(self.checkpoint) if self.checkpoint else TrainerState(0, 0, 0)
        self.model_path = self.checkpoint / "actor" if self.checkpoint else Path(cfg.model.path)
        self.processor = VLProcessor.from_pretrained(self.model_path)
        self.budget = preflight(cfg, self.model_path, self.device)  # before a model takes memory
        self.trainer = PolicyTrainer(cfg, self._load_models(), self.processor, self.device)
        if self.checkpoint is not None:
            self._restore(self.checkpoint)
        self.compute = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="vistarl-train", initializer=use_device, initargs=(self.device,)
        )
        self.sync = self._weight_sync(None)

    def _load_models(self) -> Models:
        """The actor (and critic) from the checkpoint being resumed, or the configured model; the
        reference always from the configured model, the policy the KL term anchors to."""
        algo = self.cfg.algo
        critic_path = self.checkpoint / "critic" if self.checkpoint else Path(self.cfg.model.path)
        return Models(
            actor=load_actor(self.model_path),
            reference=load_reference(self.cfg.model.path) if algo.use_kl else None,
            critic=load_critic(critic_path) if algo.needs_critic else None,
        )

    def _restore(self, path: Path) -> None:
        """Optimizers, learning-rate schedulers and RNG states from the checkpoint being resumed."""
        trainer = self.trainer
        load_optimizer(path, "optimizer", trainer.actor, trainer.actor_optimizer)
        if trainer.critic is not None and trainer.critic_optimizer is not None:
            load_optimizer(path, "critic_optimizer", trainer.critic, trainer.critic_optimizer)
        load_schedulers(path, trainer.schedulers)
        restore_rng(path, self.rank, self.state)

    @contextlib.asynccontextmanager
    async def sending_to(self, engine: Engine) -> AsyncIterator[None]:
        """Rank 0: pushes in the block reach `engine` by the transport it names, closed at the end."""
        self.sync = self._weight_sync(engine)
        try:
            yield
        finally:
            await asyncio.to_thread(self.sync.close)

    async def command(
        self, command: RankCommand, packed: Callable[[], object] | None = None
    ) -> dict[str, float]:
        """Rank 0: send `command` to every rank and carry it out here too; a `Train`'s metrics come back.
        `packed` is called on the compute thread once a `Train`'s trajectories are packed here."""
        _, metrics = await self._in_compute(command, packed)
        return metrics

    async def follow(self) -> None:
        """The other ranks: carry out rank 0's commands until it sends `Stop`, ignoring SIGTERM (rank 0
        decides when the run stops: `vistarl.trainer.run.stopping`)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        while not isinstance((await self._in_compute(None))[0], Stop):
            pass

    def close(self) -> None:
        """Stop the compute thread once its work is done."""
        self.compute.shutdown(wait=True)

    async def _in_compute(
        self, command: RankCommand | None, packed: Callable[[], object] | None = None
    ) -> tuple[RankCommand, dict[str, float]]:
        """Receive rank 0's command (rank 0 gives it) and carry it out, on the compute thread."""
        work = functools.partial(self._receive, command, packed)
        return await asyncio.get_running_loop().run_in_executor(self.compute, work)

    def _receive(
        self, command: RankCommand | None, packed: Callable[[], object] | None
    ) -> tuple[RankCommand, dict[str, float]]:
        """Every rank: take rank 0's command and carry it out."""
        shared = share_command(command)
        return shared, self._carry_out(shared, packed)

    def _carry_out(self, command: RankCommand, packed: Callable[[], object] | None) -> dict[str, float]:
        """One command on this rank: a `Train`'s update (then its checkpoint), a `Push`, a `Save`, or
        nothing."""
        match command:
            case Train(step=step, trajectories=trajectories, checkpoint=state):
                metrics = {
                    **self.trainer.update(step, trajectories, packed),
                    **_peak_memory(self.device, self.budget),
                }
                if state is not None:
                    self._save(state)
                return metrics
            case Push(version=version, reconnect=reconnect, engines=engines):
                self.sync.push(self.trainer.actor, version, reconnect=reconnect, engines=engines)
                barrier()  # every rank's engine serves `version` before rank 0 plays on with it
            case Save(state=state):
                self._save(state)
        return {}

    def _save(self, state: TrainerState) -> Path:
        """Every rank: write the checkpoint of `state` (rank 0 writes the shared files)."""
        trainer = self.trainer
        return save_checkpoint(
            self.run_dir,
            state,
            actor=trainer.actor,
            actor_optimizer=trainer.actor_optimizer,
            hf_config=trainer.actor.config,
            source_dir=Path(self.cfg.model.path),
            critic=trainer.critic,
            critic_optimizer=trainer.critic_optimizer,
            schedulers=trainer.schedulers,
            rank=self.rank,
            barrier=dist.barrier if self.distributed else None,
            keep=self.cfg.train.keep_checkpoints,
        )

    def _weight_sync(self, engine: Engine | None) -> WeightSync:
        """This rank's `WeightSync`: with `engine` (rank 0), sending by the transport the engine names."""
        cfg = self.cfg
        dtype = DTYPES[cfg.sync.dtype or cfg.model.dtype]
        config = self.trainer.actor.config
        if engine is None:
            return WeightSync(config, dtype, cfg.sync.bucket_mb * 1024 * 1024)
        return weight_sync(
            engine,
            cfg.sync,
            config=config,
            dtype=dtype,
            weights_dir=cfg.sync.dir or self.run_dir / "weights",
            source_dir=Path(cfg.model.path),
            pause=cfg.rollout.engine_kind == "sglang",
            loop=asyncio.get_running_loop(),
            backend="nccl" if self.device.type == "cuda" else "gloo",
        )


def _peak_memory(device: torch.device, budget: Budget | None) -> dict[str, float]:
    """On a GPU, the most memory this rank's tensors held since the last call (GiB), then a fresh count:
    the figure of one step, its update and the push before it; beside it the start's estimate of the peak
    (`memory_budget`), margin left out. Nothing on the CPU."""
    if device.type != "cuda":
        return {}
    peak = torch.cuda.max_memory_allocated(device) / GIB
    torch.cuda.reset_peak_memory_stats(device)
    estimate = {"perf/estimated_peak_gib": budget.tensors / GIB} if budget is not None else {}
    return {"perf/peak_memory_gib": peak, **estimate}
