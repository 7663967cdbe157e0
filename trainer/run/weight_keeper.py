"""Which weights the engines serve during a run: the trainer's current version, and no other.

`WeightKeeper` is how a run's weights reach its engines. `push` sends a version (every rank gathers, rank
0 sends: `vistarl.trainer.run.rank_commands.Push`) and records it as the stack's `policy_version`, against
which `Stack.lag` judges every trajectory. An engine server that died and came back serves its checkpoint
again, and says so: its `/model_info` reports another version (SGLang's `default`, or `0`). The keeper
asks every server before every push, and every `sync.watch_s` seconds between pushes (`watch`); when one
serves a version not the trainer's, the current one is pushed again, over a new connection, and the push
is logged. A restarted `vistarl engine serve --await-weights` generates nothing until that push; an
episode that an engine did play on its starting weights lags the trainer (`policy_version_of`) and is
stale. Of several servers (an engine pool), a push reaches those that answer: one that is down is left
out of the new connection, and the others keep serving; it is pushed again once it answers.

`updating` marks an update and its push, the span where the actor's weights are newer than the stack's
version: no push of the older version may run inside it, so a re-push waits for the span to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Protocol, runtime_checkable

from vistarl.trainer.config import SyncConfig
from vistarl.trainer.rollout.engines.base import UNKNOWN_VERSION, EngineError
from vistarl.trainer.rollout.engines.sglang_api import ModelInfo
from vistarl.trainer.run.rank_commands import Push
from vistarl.trainer.run.rank_learner import RankLearner
from vistarl.trainer.run.stack import Stack
from vistarl.trainer.weights.transport import push_targets

__all__ = ["PUSH_ATTEMPTS", "WeightKeeper"]

log = logging.getLogger(__name__)

PUSH_ATTEMPTS = 3
"""Tries of one push whose engine fails midway (it died: each later try waits for it to answer again)."""
ASK_TIMEOUT_S = 10.0
"""How long one question to the engine about its weights may take before it counts as unanswered."""
PUSH_ERRORS = (EngineError, ConnectionError, TimeoutError, RuntimeError)
"""How a push fails when its engine dies midway: the engine's calls, the broadcast to a lost peer."""


@runtime_checkable
class ServedEngine(Protocol):
    """An engine in another process, which can say what it serves (and can restart)."""

    async def model_info(self) -> ModelInfo:
        """`GET /model_info`: the checkpoint and the weight version served."""
        ...


class WeightKeeper:
    """Rank 0's pushes to the stack's engines, checked against what they serve (see the module docstring).

    `note` prints a line in the run's console; `sync` gives `watch_s` and `engine_return_s`."""

    def __init__(
        self,
        stack: Stack,
        learner: RankLearner,
        note: Callable[[str], None],
        sync: SyncConfig,
    ) -> None:
        self.stack = stack
        self.learner = learner
        self.note = note
        self.watch_s = sync.watch_s
        self.engine_return_s = sync.engine_return_s
        self.servers = [engine for engine in push_targets(stack.engine) if isinstance(engine, ServedEngine)]
        self._pushed = False
        self._reached: tuple[int, ...] | None = None  # the servers the last push reached; None: all
        self._lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        """Hold off re-pushes for the block (an update, then the push of its version)."""
        async with self._lock:
            yield

    async def push(self, version: int) -> None:
        """Make the engines serve `version`, once an engine server answers (`sync.engine_return_s` at
        most), over a new connection if one serves other than the last push or the servers that answer
        changed; a push that fails midway is tried again, over a new connection, up to `PUSH_ATTEMPTS`
        times. The run's first push is tried once: an engine that fails it was never up, and the run
        stops with the push's error."""
        served = await (self._answer() if self._pushed else self._served())
        if self._pushed:
            self._note_changes(served, version)
        attempts = PUSH_ATTEMPTS if self._pushed else 1
        for attempt in range(1, attempts + 1):
            reached = _answering(served)
            reconnect = attempt > 1 or self._other(served) or reached != self._reached
            try:
                await self.learner.command(Push(version, reconnect=reconnect, engines=reached))
                break
            except PUSH_ERRORS as exc:
                if attempt == attempts:
                    raise
                self.note(f"the push of weight version {version} failed ({exc}); trying again")
                served = await self._answer()
        self.stack.policy_version = version
        self._reached = reached
        self._pushed = True

    @contextlib.asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        """Run `watch` beside the block (unless `watch_s` is 0); it stops when the block ends."""
        task = asyncio.create_task(self.watch(), name="vistarl-weight-keeper") if self.watch_s else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def watch(self) -> None:
        """Forever, every `watch_s`: push the current version again to an engine serving another. A push
        that fails is noted here; the step's own push then tries again, and stops the run if it fails."""
        while True:
            await asyncio.sleep(self.watch_s)
            if not await self._serves_other():
                continue
            async with self._lock:
                if not await self._serves_other():  # the push that held the lock may have served it
                    continue
                try:
                    await self.push(self.stack.policy_version)
                except PUSH_ERRORS as exc:
                    self.note(f"pushing the weights to the restarted engine failed: {exc}")

    async def _serves_other(self) -> bool:
        """Whether an engine server answers with a version other than the stack's."""
        return self._other(await self._served())

    def _other(self, served: list[str | None]) -> bool:
        """Whether some server said it serves a known version that is not the stack's."""
        return any(map(self._differs, served))

    def _differs(self, served: str | None) -> bool:
        """Whether `served` (what a server said it serves) is known, and not the stack's version."""
        return served not in (None, UNKNOWN_VERSION) and served != str(self.stack.policy_version)

    async def _served(self) -> list[str | None]:
        """The version each engine server reports, within `ASK_TIMEOUT_S` (`UNKNOWN_VERSION` if it reports
        none; None if it does not answer: it may be restarting); no servers for an engine in this process
        (it cannot restart)."""
        return list(await asyncio.gather(*map(self._version, self.servers)))

    @staticmethod
    async def _version(server: ServedEngine) -> str | None:
        """The version one server reports, or None if it does not answer in time."""
        try:
            info = await asyncio.wait_for(server.model_info(), ASK_TIMEOUT_S)
        except (EngineError, ConnectionError, TimeoutError) as exc:
            log.info("an engine did not say which weights it serves: %s", exc)
            return None
        return info.weight_version or UNKNOWN_VERSION

    async def _answer(self) -> list[str | None]:
        """What each engine server serves, once one of them answers (a restarting one may take minutes to
        load its checkpoint; a `TimeoutError` after `engine_return_s`)."""
        deadline = time.monotonic() + self.engine_return_s
        served = await self._served()
        while served and all(version is None for version in served):
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no engine answered within sync.engine_return_s={self.engine_return_s:g} s"
                )
            await asyncio.sleep(1.0)
            served = await self._served()
        return served

    def _note_changes(self, served: list[str | None], version: int) -> None:
        """Log each server that serves weights the trainer did not last push, and each left out of the push
        for not answering, with what the push does."""
        policy = self.stack.policy_version
        for index, other in enumerate(served):
            which = "the engine" if len(served) == 1 else f"engine {index} of {len(served)}"
            if self._differs(other):
                self.note(
                    f"{which} serves weight version {other!r}, not the trainer's {policy} (it restarted): "
                    f"pushing version {version} before it generates"
                )
            elif other is None and len(served) > 1:
                self.note(f"{which} does not answer: pushing version {version} to the others")


def _answering(served: list[str | None]) -> tuple[int, ...] | None:
    """The servers a push reaches: those that answered; None (all of them) when all did, or none did (the
    push then fails as the servers do)."""
    answered = tuple(index for index, version in enumerate(served) if version is not None)
    return answered if 0 < len(answered) < len(served) else None
