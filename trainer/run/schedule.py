"""When a training step enqueues the next step's episodes: the run's `StepSchedule`, one of three.

- synchronous (the default): after the step's weight push, so every episode comes from the current policy;
- overlapped resets (`rollout.overlap_resets`): once the step's trajectories are packed, with the engine
  holding generation until the push, so that only the env resets and prompts overlap the update (and
  not the packing, whose many short torch calls would wait for the GIL behind them);
- asynchronous (`rollout.async_mode`): before the update, played by the policy the engine serves, so whole
  rollouts overlap training (trajectories over `rollout.max_staleness` versions old are dropped).

A run's last step enqueues nothing (`LAST`).
"""

from __future__ import annotations

import asyncio
import enum
import functools
from collections.abc import Awaitable, Callable

from vistarl.trainer.config import RolloutConfig

__all__ = ["StepSchedule"]


class StepSchedule(enum.Enum):
    """Where a step puts the next step's jobs, and for which policy version (the module docstring)."""

    SYNCHRONOUS = "synchronous"
    OVERLAPPED_RESETS = "overlapped resets"
    ASYNCHRONOUS = "asynchronous"
    LAST = "the run's last step"

    @classmethod
    def of(cls, rollout: RolloutConfig) -> StepSchedule:
        """The schedule `rollout.async_mode` and `rollout.overlap_resets` name."""
        if rollout.async_mode:
            return cls.ASYNCHRONOUS
        return cls.OVERLAPPED_RESETS if rollout.overlap_resets else cls.SYNCHRONOUS

    @property
    def enqueues_before_update(self) -> bool:
        """Whether the next step's jobs go in before this step's update."""
        return self in (StepSchedule.OVERLAPPED_RESETS, StepSchedule.ASYNCHRONOUS)

    @property
    def waits_for_packing(self) -> bool:
        """Whether the next step's jobs, going in before the update, wait until its trajectories are packed:
        resets gain nothing by starting sooner, while generation (asynchronous) does."""
        return self is StepSchedule.OVERLAPPED_RESETS

    @property
    def enqueues_after_push(self) -> bool:
        """Whether the next step's jobs go in once this step's weights are pushed."""
        return self is StepSchedule.SYNCHRONOUS

    @property
    def holds_generation(self) -> bool:
        """Whether the engine generates nothing from before the update until the push."""
        return self is StepSchedule.OVERLAPPED_RESETS

    async def around_update(
        self,
        update: Callable[..., Awaitable[dict[str, float]]],
        enqueue: Callable[[], Awaitable[None]],
    ) -> dict[str, float]:
        """Run `update` (called with `packed=`), enqueueing the next step's jobs before it, once it has
        packed, or not at all, as this schedule says; never once the update has failed."""
        if not self.enqueues_before_update:
            return await update()
        if not self.waits_for_packing:
            await enqueue()
            return await update()
        loop, packed = asyncio.get_running_loop(), asyncio.Event()
        updating = asyncio.ensure_future(
            update(packed=functools.partial(loop.call_soon_threadsafe, packed.set))
        )
        waiting = asyncio.ensure_future(packed.wait())
        await asyncio.wait({updating, waiting}, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if updating.done() and updating.exception() is not None:
            return updating.result()  # raises the update's error; nothing was enqueued
        await enqueue()
        return await updating

    def next_version(self, serving: int) -> int:
        """The policy version the next step's jobs are played by: `serving` (the version the engine serves
        during the update) when they are played then, else the one after it, which this step pushes."""
        return serving if self is StepSchedule.ASYNCHRONOUS else serving + 1
