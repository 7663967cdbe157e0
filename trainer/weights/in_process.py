"""The in-process transport: each bucket is copied into an engine that lives in the trainer's process.

On one GPU the copy is device to device (`targets.copy_into`); nothing passes through host memory.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from vistarl.trainer.weights.buckets import Bucket
from vistarl.trainer.weights.targets import Load, copy_into
from vistarl.trainer.weights.transport import EngineCalls, Waiter, pipelined

__all__ = ["InProcessSync", "LocalEngine"]


@runtime_checkable
class LocalEngine(Protocol):
    """An engine whose parameters this process can write (the embedded `HFEngine`)."""

    async def load_weights(self, load: Load, weight_version: str | None = None, *, final: bool = True) -> str:
        """Run `load` on the engine's live parameters (by live name) between batches; the `final` load
        sets the weight version."""
        ...


class InProcessSync:
    """Copy each bucket into a `LocalEngine`; the last one sets the version."""

    def __init__(self, engine: LocalEngine, calls: EngineCalls) -> None:
        self.engine = engine
        self.calls = calls

    def push(self, buckets: Iterable[Bucket], version: int) -> None:
        """Each bucket's copy waits for the engine's running batch (see `LocalEngine.load_weights`)."""
        pipelined(buckets, functools.partial(self._send, version=version))

    def _send(self, bucket: Bucket, version: int) -> Waiter:
        """Start the copy of one bucket on the engine's loop."""
        load = functools.partial(copy_into, tensors=dict(bucket.tensors))
        weight_version = str(version) if bucket.last else None
        started = self.calls.start(self.engine.load_weights(load, weight_version, final=bucket.last))

        def loaded() -> None:
            self.calls.wait(started)

        return loaded

    def reconnect(self, engines: Sequence[int] | None) -> None:
        """Nothing to form again: the engine lives in this process."""

    def close(self) -> None:
        """Nothing to release."""
