"""SIGTERM stops a training run between steps, with a checkpoint of its last one.

Rank 0's event loop takes the signal while `StopRequest.watching` runs, and the loop of
`trainer/run/train.py` acts on it: a step whose update has begun finishes it (the update, the push, the log
line), and a wait for a step's episodes gives way at once (`StopRequest.unless_asked` raises `Stopped`,
which ends the loop; `--resume` plays that step again); `checkpoint_last_step` then saves the last finished
step, unless its checkpoint exists. Under torchrun the other ranks ignore the signal
(`RankLearner.follow`): rank 0 decides when the run stops, and the checkpoint it asks for (`Save`) is
collective. `vistarl up` and `vistarl down` stop a run this way, within the trainer's grace period
(docs/deploy.md, "Stopping").
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from vistarl.trainer.learner.checkpoint import TrainerState, checkpoint_dir, latest_checkpoint
from vistarl.trainer.run.rank_commands import Save
from vistarl.trainer.run.rank_learner import RankLearner

__all__ = ["StopRequest", "Stopped", "checkpoint_last_step"]

T = TypeVar("T")


class Stopped(Exception):
    """A stop was asked for while the loop waited for episodes."""


class StopRequest:
    """Whether the run was asked to stop; `note` says so on the run's console when it is."""

    def __init__(self, note: Callable[[str], None]) -> None:
        self.note = note
        self._asked = asyncio.Event()

    @property
    def asked(self) -> bool:
        """Whether a stop was asked for."""
        return self._asked.is_set()

    def ask(self) -> None:
        """Ask the run to stop (SIGTERM's handler)."""
        if not self.asked:
            self.note("SIGTERM: stopping once the update in progress ends (now, if none is)")
        self._asked.set()

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """In the block, SIGTERM asks the run to stop, and the block ends quietly on `Stopped`. Only the
        main thread's event loop takes signals: a run driven from another thread keeps the default."""
        loop = asyncio.get_running_loop()
        on_main = threading.current_thread() is threading.main_thread()
        if on_main:
            loop.add_signal_handler(signal.SIGTERM, self.ask)
        try:
            yield
        except Stopped:
            pass
        finally:
            if on_main:
                loop.remove_signal_handler(signal.SIGTERM)

    async def unless_asked(self, work: Awaitable[T]) -> T:
        """`work`'s result; `Stopped`, with `work` cancelled, once a stop is (or was already) asked for."""
        task = asyncio.ensure_future(work)
        asked = asyncio.ensure_future(self._asked.wait())
        try:
            await asyncio.wait({task, asked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            asked.cancel()
        if not self.asked:
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise Stopped


async def checkpoint_last_step(
    learner: RankLearner, state: TrainerState, note: Callable[[str], None]
) -> None:
    """Save `state`, the last finished step of a stopped run, on every rank (`Save`) unless its checkpoint
    exists, and `note` where it is."""
    saved = latest_checkpoint(learner.run_dir)
    if state.step > 0 and saved != checkpoint_dir(learner.run_dir, state.step):
        await learner.command(Save(state))
        saved = latest_checkpoint(learner.run_dir)
    note(f"stopped after step {state.step}; checkpoint: {saved}")
