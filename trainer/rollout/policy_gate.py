"""The policy version in-process episodes may generate from: each waits, after its reset and first prompt,
until the version its job names is served.

A training run's in-process workers share one `PolicyGate`; the trainer opens it at each weight push
(`Stack.serve`). So a job may go in before the weights it is played by exist: its env reset and prompt run
early, beside whatever the process does then, and its first generation waits for the push. Workers in other
processes have no gate; the trainer holds their engine instead (`StepSchedule.holds_generation`).
"""

from __future__ import annotations

import asyncio

__all__ = ["GateClosedError", "PolicyGate"]


class GateClosedError(RuntimeError):
    """The run stopped before the policy version an episode waited for was served."""


class PolicyGate:
    """The newest policy version served, and the episodes waiting for a newer one."""

    def __init__(self, served: int = 0) -> None:
        self.served = served
        self._closed = False
        self._changed = asyncio.Event()

    def open(self, version: int) -> None:
        """`version` is served now: release every episode waiting for it or an older one."""
        self.served = max(self.served, version)
        self._changed.set()
        self._changed = asyncio.Event()

    def close(self) -> None:
        """Release every waiting episode with `GateClosedError`: the versions they wait for will not come."""
        self._closed = True
        self._changed.set()

    async def reached(self, version: int) -> None:
        """Return once `version` (or a newer one) is served; `GateClosedError` if the gate closes first."""
        while self.served < version:
            if self._closed:
                raise GateClosedError(f"the run stopped before policy version {version} was served")
            await self._changed.wait()
