"""`EnginePool`: several engines as one `Engine`, so that a run generates on every GPU it has.

Routing. A request goes to the member with the fewest requests in flight (ties: the fewest sent so
far), and every later turn of its episode (`GenerateRequest.session`) to that same member, which holds
the episode's prefix (its prompt grows turn by turn). Sessions are remembered for the last
`MAX_SESSIONS` episodes. With `router` (SGLang's router in front of the members), the router picks the
member instead, by its own policy (its cache-aware one keeps a prefix where it is cached); the pool then
only holds the members for their weights and their pauses.

A member that dies. A request that comes back aborted from a member that then does not answer
`/model_info` within `ASK_TIMEOUT_S`, or says it serves older weights than the other members
(`policy_version_of`: a restarted `vistarl engine serve --await-weights` reports its starting ones),
is sent again to another member, and the member takes no request until a probe, every `probe_s`,
finds it answering with weights as new as the others' (the trainer's push reaches it:
`vistarl.trainer.run.weight_keeper`). A deliberate abort (a paused engine, `abort(rid)`) comes from a
member that answers, and is returned as it is.

Weights. `push_targets` are the members a push reaches: every member, to which the trainer sends one
broadcast (`vistarl.trainer.weights.nccl`) or one checkpoint directory; or, with `local`, the member in
this process alone (under torchrun every rank embeds an engine and pushes it in process; the pool of
rank 0 reaches the others over HTTP, for generation only).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import torch

from vistarl.trainer.rollout.engines.base import (
    UNKNOWN_VERSION,
    Engine,
    EngineError,
    GenerateRequest,
    GenerateResult,
    policy_version_of,
)
from vistarl.trainer.rollout.engines.sglang_api import ModelInfo, PauseMode
from vistarl.trainer.weights.in_process import LocalEngine
from vistarl.trainer.weights.transport import TransportKind

__all__ = ["ASK_TIMEOUT_S", "MAX_SESSIONS", "PROBE_S", "EnginePool"]

log = logging.getLogger(__name__)

T = TypeVar("T")

PROBE_S = 2.0
"""Seconds between looks at the members taken out of the rotation."""
ASK_TIMEOUT_S = 5.0
"""How long a member may take to say which weights it serves before it counts as gone."""
MAX_SESSIONS = 4096
"""Episodes whose member is remembered (the oldest forgotten first): far more than run at once."""


@runtime_checkable
class _Answering(Protocol):
    """A member in another process, which can say which weights it serves."""

    async def model_info(self) -> ModelInfo: ...


class EnginePool:
    """Several engines as one (see the module docstring); `sent[i]` counts the requests member `i` took."""

    def __init__(
        self,
        members: Sequence[Engine],
        *,
        router: Engine | None = None,
        local: int | None = None,
        probe_s: float = PROBE_S,
    ) -> None:
        if not members:
            raise ValueError("an engine pool needs at least one member")
        if local is not None and not 0 <= local < len(members):
            raise ValueError(f"local member {local} is not one of the pool's {len(members)}")
        self.members = list(members)
        self.router = router
        self.local = local
        self.probe_s = probe_s
        self.in_flight = [0] * len(members)
        self.sent = [0] * len(members)
        self._out: set[int] = set()
        self._sessions: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._rids: dict[str, int] = {}
        self._probe: asyncio.Task[None] | None = None

    @property
    def push_targets(self) -> list[Engine]:
        """The members this process's pushes reach (see the module docstring)."""
        return self.members if self.local is None else [self.members[self.local]]

    @property
    def weight_transports(self) -> tuple[TransportKind, ...]:
        """The transports every push target takes, in the first one's order."""
        first, *rest = self.push_targets
        return tuple(
            kind for kind in first.weight_transports if all(kind in m.weight_transports for m in rest)
        )

    @property
    def weight_version(self) -> str:
        """The newest weight version a member reports (the local member's, with `local`)."""
        if self.local is not None:
            return self.members[self.local].weight_version
        return max((member.weight_version for member in self.members), key=_newness)

    @property
    def serving(self) -> list[int]:
        """The members that take requests now."""
        return [index for index in range(len(self.members)) if index not in self._out]

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate on the member the request is routed to; an abort from a member that is gone is sent
        again to another one."""
        if self.router is not None:
            return await self.router.generate(request)
        self._start_probe()
        tried: set[int] = set()
        while True:
            index = self._pick(request.session, tried)
            result = await self._send(index, request)
            tried.add(index)
            if not result.aborted or len(tried) == len(self.members) or await self._serves_newest(index):
                return result
            self._out.add(index)
            gone = f"engine {index} of {len(self.members)} is gone ({result.finish_reason.message})"
            log.warning("%s: it takes no request until it serves again", gone)

    def _pick(self, session: str | None, tried: set[int]) -> int:
        """The member for a request: its episode's, if that one serves; else the least loaded."""
        untried = [index for index in range(len(self.members)) if index not in tried]
        candidates = [index for index in untried if index not in self._out] or untried
        sticky = self._sessions.get(session) if session is not None else None
        if sticky is not None and sticky in candidates:
            index = sticky
        else:
            index = min(candidates, key=lambda i: (self.in_flight[i], self.sent[i]))
        if session is not None:
            self._sessions[session] = index
            self._sessions.move_to_end(session)
            if len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return index

    async def _send(self, index: int, request: GenerateRequest) -> GenerateResult:
        """Generate on member `index`, counted in flight meanwhile."""
        self.in_flight[index] += 1
        self.sent[index] += 1
        self._rids[request.rid] = index
        try:
            return await self.members[index].generate(request)
        finally:
            self.in_flight[index] -= 1
            if self._rids.get(request.rid) == index:
                del self._rids[request.rid]

    async def _serves_newest(self, index: int) -> bool:
        """Whether member `index` answers, with weights as new as any other serving member's (asked afresh;
        always, for a member in this process)."""
        if not isinstance(self.members[index], _Answering):
            return True
        others = [i for i in self.serving if i != index]
        version, *rest = await _each(map(self._version, [index, *others]))
        if version is None:
            return False
        return _newness(version) >= max((_newness(v) for v in rest if v is not None), default=-1)

    async def _version(self, index: int) -> str | None:
        """The weight version member `index` serves: asked within `ASK_TIMEOUT_S` of one in another process
        (None if it does not answer), known of one in this one."""
        member = self.members[index]
        if not isinstance(member, _Answering):
            return member.weight_version
        try:
            info = await asyncio.wait_for(member.model_info(), ASK_TIMEOUT_S)
        except (EngineError, ConnectionError, TimeoutError):
            return None
        return info.weight_version or UNKNOWN_VERSION

    def _start_probe(self) -> None:
        """Start the probe of the members out of the rotation, on the running loop, once."""
        if len(self.members) > 1 and (self._probe is None or self._probe.done()):
            self._probe = asyncio.get_running_loop().create_task(self._take_back(), name="vistarl-pool-probe")

    async def _take_back(self) -> None:
        """Forever, every `probe_s`: put each member out of the rotation back once it serves again."""
        while True:
            await asyncio.sleep(self.probe_s)
            for index in sorted(self._out):
                if await self._serves_newest(index):
                    self._out.discard(index)
                    log.info("engine %d of %d serves again", index, len(self.members))

    async def abort(self, rid: str) -> None:
        """Abort `rid` on the member that holds it (through the router, with one)."""
        if self.router is not None:
            await self.router.abort(rid)
        elif (index := self._rids.get(rid)) is not None:
            await self.members[index].abort(rid)

    async def load_weights(
        self,
        load: Callable[[Mapping[str, torch.Tensor]], None],
        weight_version: str | None = None,
        *,
        final: bool = True,
    ) -> str:
        """Run `load` on the local member's parameters (`LocalEngine`); only a pool with `local` has one."""
        member = self.members[self.local] if self.local is not None else None
        if not isinstance(member, LocalEngine):
            raise TypeError("this engine pool has no member in this process to load weights into")
        return await member.load_weights(load, weight_version, final=final)

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> str:
        """Every push target loads the checkpoint directory; the version they report."""
        versions = await _each(
            m.update_weights_from_disk(model_path, weight_version) for m in self.push_targets
        )
        return versions[0]

    async def pause_generation(self, mode: PauseMode = "abort") -> None:
        """Hold every member's generation (see `_reachable`)."""
        await self._reachable(member.pause_generation(mode) for member in self.members)

    async def continue_generation(self) -> None:
        """Resume every member's generation (see `_reachable`)."""
        await self._reachable(member.continue_generation() for member in self.members)

    async def _reachable(self, calls: Iterable[Awaitable[None]]) -> None:
        """Make a control call to every member at once; one that cannot be reached (it died: it generates
        nothing, and comes back awaiting the trainer's push) is passed over, unless none can be."""
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        for failure in failures:
            if not isinstance(failure, ConnectionError) or len(failures) == len(outcomes):
                raise failure
            log.warning("an engine of the pool was not reached: %s", failure)

    async def health(self) -> bool:
        """Whether some member (or the router) can generate now."""
        if self.router is not None:
            return await self.router.health()
        return any(await _each(member.health() for member in self.members))

    async def close(self) -> None:
        """Stop the probe and close every member (and the router)."""
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        await _each(engine.close() for engine in [*self.members, *filter(None, [self.router])])


def _newness(weight_version: str) -> int:
    """How new a weight version is: its policy version, -1 for an unknown one."""
    version = policy_version_of(weight_version)
    return -1 if version is None else version


async def _each(calls: Iterable[Awaitable[T]]) -> list[T]:
    """Await every call at once; their results in order."""
    return list(await asyncio.gather(*calls))
