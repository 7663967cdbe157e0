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
   the first step that ends past `train.max_time_s`, or on SIGTERM: `vistarl.trainer.run.stopping`).

Step k+1's jobs go in where the run's `StepSchedule` (`vistarl.trainer.run.schedule`) puts them:
after step k's push (synchronous, the default), or once its update has packed its trajectories, the engine
holding generation (overlapped resets), or before its update for the serving policy (asynchronous).

Under torchrun every rank trains its share of each mini-batch (FSDP2), gathers its share of each push
(`vistarl.trainer.weights`) and, with the embedded engine, generates (`run.rank_engines`); rank 0 alone
drives the queue, the engines and the logs, sending the others typed commands (`run.rank_commands`) that
each rank's `run.rank_learner.RankLearner` carries out. Steps 3-5 are `learner.update.PolicyTrainer.update`;
what a step plays comes from `run.prompts` (all under `vistarl.trainer`).
"""

from __future__ import annotations

import functools
import math
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from rich.console import Console

from vistarl.trainer.config import TrainConfig
from vistarl.trainer.eval import evaluate
from vistarl.trainer.learner.checkpoint import TrainerState, latest_checkpoint
from vistarl.trainer.learner.fsdp import init_distributed
from vistarl.trainer.rollout.engines.base import Engine
from vistarl.trainer.run.directory import agreed_run_dir
from vistarl.trainer.run.outputs import RunLogger, failure_places, timed
from vistarl.trainer.run.prompts import PromptSource, step_jobs
from vistarl.trainer.run.rank_commands import Stop, Train
from vistarl.trainer.run.rank_engines import rank_engines
from vistarl.trainer.run.rank_learner import RankLearner
from vistarl.trainer.run.rollout_metrics import endings, left_out, outcomes, rollout_metrics, throughput
from vistarl.trainer.run.schedule import StepSchedule
from vistarl.trainer.run.stack import Gathered, Stack, open_stack
from vistarl.trainer.run.stopping import StopRequest, checkpoint_last_step
from vistarl.trainer.run.weight_keeper import WeightKeeper

__all__ = ["TrainResult", "run_training"]

Submit = Callable[[int, int, int], Awaitable[None]]
"""Enqueue step `step`'s jobs (`retry`: which try of the step, 0 for the first) for policy `version`."""


@dataclass
class TrainResult:
    """What a finished run reports; `stopped`: SIGTERM ended it before its last step."""

    run_dir: Path
    steps: int
    history: list[dict[str, float]]
    checkpoint: Path | None
    stopped: bool = False


class _Lead:
    """Rank 0's run: the stack and logs around the step loop, with every rank's learner following."""

    def __init__(self, cfg: TrainConfig, learner: RankLearner, console: Console) -> None:
        self.cfg = cfg
        self.learner = learner
        self.run_dir = learner.run_dir
        self.state = learner.state
        self.schedule = StepSchedule.of(cfg.rollout)
        self.logger = RunLogger(
            self.run_dir,
            cfg.model_dump(mode="json"),
            total_steps=cfg.train.steps,
            start_step=self.state.step,
            tensorboard=cfg.logging.tensorboard,
            wandb=cfg.logging.wandb,
            console=console,
        )
        self.stop = StopRequest(self.logger.note)

    async def run(self, engine: Engine | None) -> TrainResult:
        """The step loop inside the stack; the other ranks are stopped however it ends."""
        learner = self.learner
        resumed = f" (resuming after step {self.state.step})" if learner.checkpoint else ""
        self.logger.note(f"run directory: {self.run_dir}{resumed}")
        try:
            async with (
                self.stop.watching(),
                open_stack(
                    self.cfg,
                    learner.processor,
                    learner.model_path,
                    self.run_dir,
                    engine=engine,
                    device=learner.device,
                ) as stack,
                learner.sending_to(stack.engine),
            ):
                await self._loop(stack)
            if stopped := self.stop.asked and self.state.step < self.cfg.train.steps:
                await checkpoint_last_step(learner, self.state, self.logger.note)
        finally:
            await learner.command(Stop())
            self.logger.close()
        history = self.logger.history
        return TrainResult(self.run_dir, self.state.step, history, latest_checkpoint(self.run_dir), stopped)

    async def _loop(self, stack: Stack) -> None:
        """Steps `state.step + 1 .. train.steps` (see the module docstring)."""
        cfg = self.cfg
        prompts = await PromptSource.create(cfg, stack.env)
        tag = uuid.uuid4().hex[:8]

        async def submit(step: int, retry: int, version: int) -> None:
            retag = f"{tag}r{retry}" if retry else tag  # a try again gets episode ids of its own
            jobs = step_jobs(cfg, stack.env, prompts, step, version, retag)
            await stack.submit(f"s{step}", jobs)

        keeper = WeightKeeper(stack, self.learner, self.logger.note, cfg.sync)
        await keeper.push(self.state.policy_version)  # the engine serves this run's weights
        if self.state.step < cfg.train.steps:
            await submit(self.state.step + 1, 0, self.state.policy_version)
        deadline = time.monotonic() + (cfg.train.max_time_s or math.inf)
        async with keeper.watching():
            for step in range(self.state.step + 1, cfg.train.steps + 1):
                last = await self._step(stack, keeper, step, submit, deadline)
                if last and step < cfg.train.steps:
                    self.logger.note(
                        f"step {step}: train.max_time_s={cfg.train.max_time_s:g} s has passed; stopping"
                    )
                    return

    async def _step(
        self, stack: Stack, keeper: WeightKeeper, step: int, submit: Submit, deadline: float
    ) -> bool:
        """Step `step`: gather, train, push (the next step's jobs going in where the schedule puts them),
        maybe evaluate, log; True if it is the run's last."""
        cfg = self.cfg
        started = time.perf_counter()
        gathered = await self._gather_learnable(stack, step, submit)
        timings = {"time/rollout": time.perf_counter() - started}
        rollout = rollout_metrics(gathered, stack)  # lags against the policy that was serving
        last = step == cfg.train.steps or time.monotonic() >= deadline
        schedule = StepSchedule.LAST if last else self.schedule
        state = TrainerState(step, self.state.policy_version + 1, step * cfg.rollout.rollout_batch_size)
        saved = state if (last and cfg.train.save_last) or cfg.train.periodic_save(step) else None
        async with keeper.updating(), stack.holding(schedule.holds_generation):
            with timed(timings, "time/train"):
                train = Train(step, gathered.trajectories, saved)
                metrics = await schedule.around_update(
                    functools.partial(self.learner.command, train),
                    functools.partial(submit, step + 1, 0, schedule.next_version(self.state.policy_version)),
                )
            with timed(timings, "time/sync"):
                await keeper.push(state.policy_version)
        self.state = state
        if schedule.enqueues_after_push:
            await submit(step + 1, 0, state.policy_version)
        if cfg.train.eval_every and step % cfg.train.eval_every == 0:
            with timed(timings, "time/eval"):
                out_dir = self.run_dir / "eval" / f"step-{step:06d}"
                metrics.update(
                    await evaluate(
                        stack, cfg, version=state.policy_version, key=f"eval-{step}", out_dir=out_dir
                    )
                )
        timings["time/step"] = time.perf_counter() - started
        self._log(step, gathered, {**metrics, **rollout, **timings})
        return last

    def _log(self, step: int, gathered: Gathered, metrics: dict[str, float]) -> None:
        """Log step `step`'s metrics, policy version, throughput, left-out episodes and samples."""
        metrics["policy_version"] = float(self.state.policy_version)
        metrics.update(throughput(gathered, metrics["time/step"]))
        self.logger.log_step(step, metrics, notes=left_out(gathered))
        self.logger.save_samples(step, gathered.trajectories, self.cfg.train.save_samples)

    async def _gather_learnable(self, stack: Stack, step: int, submit: Submit) -> Gathered:
        """Step `step`'s episodes once some can be learned from: a try with none does not count as a step
        and is played again, up to `train.max_unusable_steps` tries in a row, then the run stops."""
        cfg = self.cfg
        tries = cfg.train.max_unusable_steps
        played_again: list[Gathered] = []
        for attempt in range(1, tries + 1):
            gathered = await self.stop.unless_asked(stack.gather(f"s{step}", cfg.rollout.collect_timeout_s))
            if not gathered.trajectories:
                raise RuntimeError(
                    f"step {step}: no episode finished within rollout.collect_timeout_s="
                    f"{cfg.rollout.collect_timeout_s:g} s ({gathered.missing} missing, "
                    f"{gathered.stale} stale); see {failure_places(cfg, self.run_dir)}"
                )
            if any(t.trainable for t in gathered.trajectories):
                return replace(gathered, tries=attempt, unusable=endings(*played_again))
            played_again.append(gathered)
            if attempt == tries:
                self.logger.note(f"step {step}: nothing to learn from ({outcomes(gathered)})")
                break
            self.logger.note(f"step {step}: nothing to learn from ({outcomes(gathered)}); playing it again")
            await submit(step, attempt, self.state.policy_version)
        errors = sorted({t.error for t in gathered.trajectories if t.error})
        raise RuntimeError(
            f"step {step}: {tries} tries in a row had no episode to learn from "
            f"(train.max_unusable_steps={tries}) against the env {stack.env}: {outcomes(gathered)}; "
            f"errors: {'; '.join(errors[:3]) or 'none reported'}; see {failure_places(cfg, self.run_dir)}"
        )


async def run_training(
    cfg: TrainConfig,
    *,
    name: str = "run",
    resume: bool = False,
    engine: Engine | None = None,
    console: Console | None = None,
) -> TrainResult:
    """Train as `cfg` says; `engine` replaces the configured engine (e.g. a scripted policy in tests).
    Returns on every rank; only rank 0's result carries the metric history."""
    resume = resume or cfg.train.resume
    init_distributed()
    run_dir = agreed_run_dir(cfg, name, resume)
    torch.manual_seed(cfg.train.seed)
    random.seed(cfg.train.seed)
    learner = RankLearner(cfg, run_dir, resume)
    console = console or Console()
    try:
        async with rank_engines(cfg, learner, engine, console.print) as engine:
            if learner.rank == 0:
                return await _Lead(cfg, learner, console).run(engine)
            await learner.follow()
        return TrainResult(run_dir, learner.state.step, [], None)
    finally:
        learner.close()
