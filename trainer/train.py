"""The training loop: rollouts in, PPO-family updates out, weights back to the engine, every step logged.

One step:

1. enqueue `rollout_batch_size` starts x `n_samples_per_prompt` episode jobs (procedural seeds that
   skip the eval range, or dataset rows);
2. gather the trajectories (bounded wait); FAILED / ABORTED ones, and any without a generated token,
   are counted and left out of the update (GRPO baselines are taken over the group's remaining
   samples). When none is left, the step does not count: its episodes are played again, and after
   `train.max_unusable_steps` such tries in a row the run stops with an error naming the env;
3. recompute the trainer's old logprobs (and reference logprobs, critic values) over packed
   micro-batches, without gradients;
4. compute advantages;
5. run `ppo_epochs` passes over mini-batches of `global_batch_size` trajectories, each split into
   micro-batches by token budget and accumulated, with gradient clipping and AdamW;
6. push the weights to the engine (bumping `policy_version`);
7. log; save a checkpoint every `train.save_every` steps (and at the end: after `train.steps`, or after
   the first step that ends past `train.max_time_s`).

In synchronous mode (the default) a step's episodes all come from the current policy. In
asynchronous mode step k+1's jobs are enqueued before training on step k, so rollouts overlap
training; trajectories more than `rollout.max_staleness` versions old are dropped.

Under torchrun, every rank trains its share of each mini-batch (FSDP2) and gathers its share of each
weight push (`trainer.weights`); rank 0 alone drives the queue, the engine and the logs, and sends
each step's trajectories to the other ranks as msgpack bytes in a tensor broadcast. Steps 3-5 are
`trainer.learner.update.PolicyTrainer.update`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from rich.console import Console

from services.datasets import ParquetSplit
from services.env_api import TaskSplit
from trainer.config import TrainConfig
from trainer.eval import evaluate
from trainer.learner.checkpoint import (
    TrainerState,
    latest_checkpoint,
    load_optimizer,
    load_schedulers,
    load_trainer_state,
    restore_rng,
    save_checkpoint,
)
from trainer.learner.fsdp import init_distributed, is_distributed, rank_device
from trainer.learner.models import Models, load_actor, load_critic, load_reference
from trainer.learner.update import SEED_STRIDE, PolicyTrainer
from trainer.rollout.engines.base import Engine
from trainer.rollout.env_handle import split_size
from trainer.rollout.job import group_jobs
from trainer.rollout.processor import VLProcessor
from trainer.rollout.trajectory import Status, Trajectory
from trainer.run_logging import RunLogger, failure_places
from trainer.stack import DTYPES, Gathered, Stack, episode_sampling, open_stack
from trainer.weights.sync import WeightSync, weight_sync

__all__ = [
    "PromptSource",
    "TrainResult",
    "resolve_run_dir",
    "rollout_metrics",
    "run_training",
    "share",
    "step_jobs",
]

T = TypeVar("T")


# --- what each step trains on -------------------------------------------------------------------


class PromptSource:
    """Episode starts for training, addressed by a resumable position: one of

    - procedural env seeds, counting up from 0 and jumping over the eval range, so training never plays
      an eval level (the default);
    - the rows of a parquet of samples (`env.dataset`), sent whole as each episode's `sample`;
    - the tasks of a split the env holds (`env.task_split`), sent as `task_id`s.

    Rows and tasks are visited in a shuffled order that changes every epoch. `env.options` go with every
    start; a dataset row whose `extra_info.seed` lies in the eval range is an error.
    """

    def __init__(self, cfg: TrainConfig, rows: TaskSplit | None = None, tasks: int = 0) -> None:
        self.options = dict(cfg.env.options)
        self.eval_seeds = cfg.env.eval_seed_range
        self.shuffle_seed = cfg.train.seed
        self.rows = rows
        self.split = cfg.env.task_split
        self.count = len(rows) if rows is not None else tasks

    @classmethod
    async def create(cls, cfg: TrainConfig, env: str) -> PromptSource:
        """The source `cfg.env` asks for; a task split's size is asked of the env itself."""
        if cfg.env.dataset is not None:
            return cls(cfg, rows=_dataset_rows(cfg.env.dataset, cfg.env.eval_seed_range))
        if cfg.env.task_split is not None:
            return cls(cfg, tasks=await split_size(env, cfg.env.task_split, "env.task_split"))
        return cls(cfg)

    def take(self, cursor: int, count: int) -> list[dict[str, Any]]:
        """The starts at positions `cursor .. cursor + count - 1`."""
        return [self._start(position) for position in range(cursor, cursor + count)]

    def _start(self, position: int) -> dict[str, Any]:
        if not self.count:
            seed = position if position < self.eval_seeds.start else position + len(self.eval_seeds)
            if seed in self.eval_seeds:
                raise AssertionError(f"training seed {seed} lies in the eval range {self.eval_seeds}")
            return {"seed": seed, "options": self.options}
        epoch, index = divmod(position, self.count)
        order = list(range(self.count))
        random.Random(self.shuffle_seed * SEED_STRIDE + epoch).shuffle(order)
        if self.rows is not None:
            return {"sample": self.rows[order[index]], "options": self.options}
        return {"task_id": f"{self.split}/{order[index]}", "options": self.options}


def _dataset_rows(path: Path, eval_seeds: range) -> ParquetSplit:
    """The rows of a parquet of samples; refuses an empty file and rows whose seed is an eval seed."""
    rows = ParquetSplit(path)
    if not len(rows):
        raise ValueError(f"dataset {path} has no rows")
    if "extra_info" in pq.read_schema(path).names:
        for index, row in enumerate(pq.read_table(path, columns=["extra_info"]).to_pylist()):
            seed = (row["extra_info"] or {}).get("seed")
            if seed in eval_seeds:
                raise ValueError(f"dataset {path} row {index} uses seed {seed}, an eval seed")
    return rows


def step_jobs(
    cfg: TrainConfig, env: str, prompts: PromptSource, step: int, version: int, tag: str
) -> list[Any]:
    """The episode jobs of step `step` (1-based): its starts, each `n_samples_per_prompt` times."""
    rollout = cfg.rollout
    cursor = (step - 1) * rollout.rollout_batch_size
    return group_jobs(
        env,
        prompts.take(cursor, rollout.rollout_batch_size),
        rollout.n_samples_per_prompt,
        sampling=episode_sampling(rollout),
        policy_version=version,
        seed=cfg.train.seed * SEED_STRIDE + step,
        prefix=f"{tag}-s{step:06d}",
    )


# --- rank 0 <-> other ranks ---------------------------------------------------------------------


def share(message: dict[str, Any] | None, device: torch.device) -> dict[str, Any]:
    """Rank 0's `message` on every rank: msgpack bytes in a uint8 tensor broadcast (no pickle)."""
    if not is_distributed():
        assert message is not None
        return message
    payload = msgpack.packb(message, use_bin_type=True) if dist.get_rank() == 0 else b""
    size = torch.tensor([len(payload)], dtype=torch.long, device=device)
    dist.broadcast(size, src=0)
    buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if dist.get_rank() == 0:
        buffer.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    dist.broadcast(buffer, src=0)
    decoded: dict[str, Any] = msgpack.unpackb(buffer.cpu().numpy().tobytes(), raw=False)
    return decoded


# --- the run ------------------------------------------------------------------------------------


def _rank() -> int:
    """This process's rank (0 outside torchrun)."""
    return dist.get_rank() if is_distributed() else 0


@dataclass
class TrainResult:
    """What a finished run reports."""

    run_dir: Path
    steps: int
    history: list[dict[str, float]]
    checkpoint: Path | None


def resolve_run_dir(cfg: TrainConfig, name: str, resume: bool) -> Path:
    """`train.run_dir`, else `runs/<name>-<timestamp>` (when resuming: the newest such run)."""
    if cfg.train.run_dir is not None:
        return cfg.train.run_dir
    if resume:
        candidates = sorted(Path("runs").glob(f"{name}-*"), key=lambda p: p.name)
        with_checkpoints = [p for p in candidates if latest_checkpoint(p) is not None]
        if with_checkpoints:
            return with_checkpoints[-1]
    return Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


class _Run:
    """One training run on this rank: setup, the step loop (rank 0 drives it, the others follow), teardown.

    Rank 0 sends every rank one message per action (`_command`): `train` (a step's update, then a
    checkpoint if `save`), `push` (the weights to the engine as `version`: every rank gathers, rank 0's
    `WeightSync` sends) or `stop`. All collectives run on one dedicated thread, so the event loop
    (workers, engine, HTTP) keeps going while the model trains.
    """

    def __init__(self, cfg: TrainConfig, run_dir: Path, resume: bool, console: Console) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.console = console
        self.distributed = init_distributed()
        self.rank = _rank()
        self.device = rank_device()
        self.checkpoint = latest_checkpoint(run_dir) if resume else None
        if not resume and latest_checkpoint(run_dir) is not None:
            raise FileExistsError(
                f"{run_dir} already holds checkpoints: resume it (--resume) or pick another run_dir"
            )
        self.state = load_trainer_state(self.checkpoint) if self.checkpoint else TrainerState(0, 0, 0)
        self.model_path = self.checkpoint / "actor" if self.checkpoint else Path(cfg.model.path)
        self.processor = VLProcessor.from_pretrained(self.model_path)
        self.trainer = PolicyTrainer(cfg, self._load_models(), self.processor, self.device)
        if self.checkpoint is not None:
            self._restore(self.checkpoint)
        self.compute = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="vistarl-train"
        )
        self.sync = self._weight_sync(None)  # rank 0's gets its transport once the engine is up

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

    async def run(self, engine: Engine | None) -> TrainResult:
        """Rank 0 leads; the other ranks carry out its messages until it says stop."""
        try:
            if self.rank == 0:
                return await self._lead(engine)
            while (await self._in_compute(self._execute, None))[0] != "stop":
                pass
            return TrainResult(self.run_dir, self.state.step, [], None)
        finally:
            self.compute.shutdown(wait=True)

    async def _in_compute(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on the compute thread."""
        return await asyncio.get_running_loop().run_in_executor(self.compute, fn, *args)

    async def _command(self, op: str, **fields: Any) -> tuple[str, dict[str, float]]:
        """Rank 0: send a message to every rank and carry it out here too."""
        return await self._in_compute(self._execute, {"op": op, **fields})

    def _execute(self, message: dict[str, Any] | None) -> tuple[str, dict[str, float]]:
        """Every rank: receive rank 0's message and carry it out."""
        message = share(message, self.device)
        op = message["op"]
        trajectories = [Trajectory.from_dict(data) for data in message.get("trajectories", [])]
        metrics = self.trainer.update(message["step"], trajectories) if op == "train" else {}
        if op == "push":
            self.sync.push(self.trainer.actor, message["version"])
        if message.get("save"):
            self._save(TrainerState(**message["state"]))
        return op, metrics

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

    async def _lead(self, engine: Engine | None) -> TrainResult:
        """Rank 0: the stack and logs around the step loop; the other ranks are stopped however it ends."""
        cfg = self.cfg
        logger = RunLogger(
            self.run_dir,
            cfg.model_dump(mode="json"),
            total_steps=cfg.train.steps,
            start_step=self.state.step,
            tensorboard=cfg.log.tensorboard,
            wandb_project=cfg.log.wandb_project,
            console=self.console,
        )
        resumed = f" (resuming after step {self.state.step})" if self.checkpoint else ""
        logger.note(f"run directory: {self.run_dir}{resumed}")
        try:
            async with open_stack(
                cfg, self.processor, self.model_path, self.run_dir, engine=engine, device=self.device
            ) as stack:
                self.sync = self._weight_sync(stack.engine)
                try:
                    await self._loop(stack, logger)
                finally:
                    await asyncio.to_thread(self.sync.close)
        finally:
            await self._command("stop")
            logger.close()
        return TrainResult(self.run_dir, self.state.step, logger.history, latest_checkpoint(self.run_dir))

    async def _loop(self, stack: Stack, logger: RunLogger) -> None:
        """Steps `state.step + 1 .. train.steps` (see the module docstring)."""
        cfg = self.cfg
        prompts = await PromptSource.create(cfg, stack.env)
        tag = uuid.uuid4().hex[:8]

        async def submit(step: int, retry: int = 0) -> None:
            retag = f"{tag}r{retry}" if retry else tag  # a try again gets episode ids of its own
            jobs = step_jobs(cfg, stack.env, prompts, step, self.state.policy_version, retag)
            await stack.submit(f"s{step}", jobs)

        await self._command("push", version=self.state.policy_version)  # the engine serves this run's weights
        stack.policy_version = self.state.policy_version
        if self.state.step < cfg.train.steps:
            await submit(self.state.step + 1)
        deadline = time.monotonic() + (cfg.train.max_time_s or math.inf)
        for step in range(self.state.step + 1, cfg.train.steps + 1):
            started = time.perf_counter()
            gathered = await self._gather_learnable(stack, step, submit, logger)
            timings = {"time/rollout": time.perf_counter() - started}
            rollout = rollout_metrics(gathered, stack)  # lags against the policy that was serving
            last = step == cfg.train.steps or time.monotonic() >= deadline
            if cfg.rollout.async_mode and not last:
                await submit(step + 1)
            state = TrainerState(step, self.state.policy_version + 1, step * cfg.rollout.rollout_batch_size)
            save = last or (cfg.train.save_every > 0 and step % cfg.train.save_every == 0)
            with _timed(timings, "time/train"):
                _, metrics = await self._command(
                    "train",
                    step=step,
                    trajectories=[t.to_dict() for t in gathered.trajectories],
                    save=save,
                    state=asdict(state),
                )
            with _timed(timings, "time/sync"):
                await self._command("push", version=state.policy_version)
            stack.policy_version = state.policy_version
            self.state = state
            if not cfg.rollout.async_mode and not last:
                await submit(step + 1)
            if cfg.train.eval_every and step % cfg.train.eval_every == 0:
                with _timed(timings, "time/eval"):
                    out_dir = self.run_dir / "eval" / f"step-{step:06d}"
                    metrics.update(
                        await evaluate(
                            stack, cfg, version=state.policy_version, key=f"eval-{step}", out_dir=out_dir
                        )
                    )
            timings["time/step"] = time.perf_counter() - started
            generated = sum(t.metrics.get("generated_tokens", 0.0) for t in gathered.trajectories)
            metrics.update(rollout)
            metrics.update(timings)
            metrics["policy_version"] = float(state.policy_version)
            metrics["perf/tokens_per_s"] = generated / timings["time/step"]
            logger.log_step(step, metrics)
            logger.save_samples(step, gathered.trajectories, cfg.train.save_samples)
            if last and step < cfg.train.steps:
                logger.note(f"step {step}: train.max_time_s={cfg.train.max_time_s:g} s has passed; stopping")
                return

    async def _gather_learnable(
        self, stack: Stack, step: int, submit: Callable[[int, int], Awaitable[None]], logger: RunLogger
    ) -> Gathered:
        """Step `step`'s episodes once some can be learned from: a try with none does not count as a step
        and is played again, up to `train.max_unusable_steps` tries in a row, then the run stops."""
        cfg = self.cfg
        tries = cfg.train.max_unusable_steps
        for attempt in range(1, tries + 1):
            gathered = await stack.gather(f"s{step}", cfg.rollout.collect_timeout_s)
            if not gathered.trajectories:
                raise RuntimeError(
                    f"step {step}: no episode finished within rollout.collect_timeout_s="
                    f"{cfg.rollout.collect_timeout_s:g} s ({gathered.missing} missing, "
                    f"{gathered.stale} stale); see {failure_places(cfg, self.run_dir)}"
                )
            if any(t.trainable for t in gathered.trajectories):
                return gathered
            if attempt == tries:
                logger.note(f"step {step}: nothing to learn from ({_outcomes(gathered)})")
                break
            logger.note(f"step {step}: nothing to learn from ({_outcomes(gathered)}); playing it again")
            await submit(step, attempt)
        errors = sorted({t.error for t in gathered.trajectories if t.error})
        raise RuntimeError(
            f"step {step}: {tries} tries in a row had no episode to learn from "
            f"(train.max_unusable_steps={tries}) against the env {stack.env}: {_outcomes(gathered)}; "
            f"errors: {'; '.join(errors[:3]) or 'none reported'}; see {failure_places(cfg, self.run_dir)}"
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
        )


def _outcomes(gathered: Gathered) -> str:
    """How a step's episodes ended, e.g. `3 COMPLETED, 5 FAILED, 0 missing`."""
    counts = Counter(t.status.value for t in gathered.trajectories)
    ended = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    return f"{ended}, {gathered.missing} missing"


@contextlib.contextmanager
def _timed(timings: dict[str, float], name: str) -> Iterator[None]:
    """Add the block's wall time to `timings[name]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - started


def rollout_metrics(gathered: Gathered, stack: Stack) -> dict[str, float]:
    """Reward and env metrics over usable episodes; statuses, lengths and losses over all of them."""
    trajectories = gathered.trajectories
    usable = [t for t in trajectories if t.status.played]
    metrics: dict[str, float] = {
        "rollout/episodes": float(len(trajectories)),
        "rollout/missing": float(gathered.missing),
        "rollout/stale": float(gathered.stale),
        "rollout/unexpected": float(stack.unexpected),
        "rollout/rejected": float(stack.rejected),
    }
    statuses = Counter(t.status for t in trajectories)
    for status in Status:
        metrics[f"rollout/status/{status.value}"] = float(statuses.get(status, 0))
    if trajectories:
        lags = [stack.lag(t) for t in trajectories]
        metrics["rollout/policy_lag"] = sum(lags) / len(lags)
    if usable:
        rewards = torch.tensor([t.episode_reward for t in usable])
        metrics.update(
            {
                "reward/mean": float(rewards.mean()),
                "reward/std": float(rewards.std()) if len(usable) > 1 else 0.0,
                "reward/min": float(rewards.min()),
                "reward/max": float(rewards.max()),
            }
        )
        per_episode: defaultdict[str, list[float]] = defaultdict(list)
        for t in usable:
            for name, value in t.metrics.items():
                per_episode[name].append(value)
        renamed = {
            "turns": "rollout/turns",
            "generated_tokens": "rollout/response_tokens",
            "context_tokens": "rollout/context_tokens",
        }
        for name, values in per_episode.items():
            if name.startswith("env/") or name in renamed:
                metrics[renamed.get(name, name)] = sum(values) / len(values)
        for part in sorted({part for t in usable for part in t.timings}):  # mean seconds per episode
            metrics[f"rollout/seconds/{part}"] = sum(t.timings.get(part, 0.0) for t in usable) / len(usable)
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


async def run_training(
    cfg: TrainConfig,
    *,
    name: str = "run",
    resume: bool = False,
    engine: Engine | None = None,
    console: Console | None = None,
) -> TrainResult:
    """Train as `cfg` says; `engine` replaces the configured engine (e.g. a scripted policy in tests).

    Returns on every rank; only rank 0's result carries the metric history.
    """
    resume = resume or cfg.train.resume
    init_distributed()
    chosen = {"run_dir": str(resolve_run_dir(cfg, name, resume))} if _rank() == 0 else None
    run_dir = Path(share(chosen, rank_device())["run_dir"])  # one run directory, rank 0's choice
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    run = _Run(cfg, run_dir, resume, console or Console())
    return await run.run(engine)
