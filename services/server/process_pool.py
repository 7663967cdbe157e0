"""Envs in worker processes: `ProcessEnvPool` starts `env_workers` `python -m
vistarl.services.server.worker_process` processes and keeps each session in the one that reset it;
`WorkerProcess` is the server's handle on one of them (its pipes, its sessions, the calls awaiting answers).

The event loop only routes requests: msgpack frames on each worker's stdin and stdout. The workers start in
the background, so the server answers (`/health`) while they load the env; what needs one waits for them.
A worker that dies or overruns the timeout is replaced; the envs it held are lost (500), and their
sessions with them unless a shared session store can restore them. The interface it meets is
`vistarl.services.server.env_pool.EnvPool`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import sys
from typing import Any

import msgpack

from vistarl.clients.protocol import ErrorCode, Observation, ResetResponse
from vistarl.httpserver.errors import ServiceError
from vistarl.services.server.env_calls import EnvGoneError, EnvLostError, Reply, Stepped, Task, task_payload
from vistarl.services.server.metrics import ServerMetrics
from vistarl.services.server.settings import ServerSettings

logger = logging.getLogger(__name__)

WORKER_START_TIMEOUT_S = 60.0
WORKER_RESTART_ATTEMPTS = 3
STREAM_LIMIT = 1 << 16  # asyncio's default buffer limit for the stdin stream
MAX_ANSWER_BYTES = 1 << 28


class ProcessEnvPool:
    """Envs in `env_workers` worker processes; every session stays in the worker that created it."""

    def __init__(self, import_path: str, settings: ServerSettings, metrics: ServerMetrics) -> None:
        self.import_path = import_path
        self.settings = settings
        self.metrics = metrics
        self.workers: list[WorkerProcess | None] = [None] * settings.env_workers
        self.placement: dict[str, WorkerProcess] = {}
        self._closing = False
        self._format_turn = itertools.count()
        self._restarting: set[asyncio.Task[None]] = set()
        self._starting: asyncio.Task[None] | None = None
        self.metrics.env_workers.set_function(
            lambda: sum(1 for w in self.workers if w is not None and w.alive)
        )

    async def open(self) -> None:
        """Start every worker in the background; `started` waits for them."""
        self._starting = asyncio.create_task(self._start_workers(), name="vistarl-env-workers-start")

    async def started(self) -> None:
        """Wait until every worker has loaded the env (each within `WORKER_START_TIMEOUT_S`); a 500 naming
        the failure if one could not."""
        assert self._starting is not None, "open() the pool first"
        if not self._starting.done():  # waiting neither raises its failure nor cancels it with the caller
            await asyncio.wait([self._starting])
        if self._starting.cancelled():
            raise ServiceError(ErrorCode.DRAINING, "server is shutting down")
        failure = self._starting.exception()
        if failure is not None:
            message = f"the env workers did not start: {failure}; see the server log"
            raise ServiceError(ErrorCode.INTERNAL, message)

    async def start(
        self, session_id: str, task: Task, with_message: bool
    ) -> tuple[Reply[ResetResponse], bytes | None]:
        body, state = await self._place(session_id, "reset", [*task_payload(task), with_message])
        return Reply(bytes(body)), state

    async def step(self, session_id: str, action: str, with_message: bool) -> Stepped:
        done, body, state = await self._worker_of(session_id).call("step", [session_id, action, with_message])
        if done:  # the worker closed the env with the step
            self.discard(session_id)
        return Stepped(bool(done), Reply(bytes(body)), state)

    async def restore(self, session_id: str, state: bytes) -> None:
        """Restore in the live worker that holds the session's stale env, else in the one with the fewest."""
        worker = self.placement.get(session_id)
        if worker is not None and worker.alive:
            await worker.call("restore", [session_id, state])
            return
        self.discard(session_id)
        await self._place(session_id, "restore", [state])

    async def close(self, session_id: str) -> None:
        worker = self._worker_of(session_id)
        try:
            await worker.call("close", [session_id])
        finally:
            self.discard(session_id)

    def discard(self, session_id: str) -> None:
        worker = self.placement.pop(session_id, None)
        if worker is not None:
            worker.sessions.discard(session_id)

    async def format(self, observation: Observation) -> bytes:
        alive = await self._alive()
        worker = alive[next(self._format_turn) % len(alive)]
        body: bytes = await worker.call("format", [observation.model_dump(mode="json")])
        return body

    async def shutdown(self) -> None:
        """Stop starting workers; ask every worker to close its envs and exit; kill those still running
        after the grace."""
        self._closing = True
        if self._starting is not None:
            self._starting.cancel()
            await asyncio.gather(self._starting, return_exceptions=True)
        await self._stop_workers()

    async def _start_workers(self) -> None:
        """Start every worker, each into its slot once it has loaded the env; if one cannot start, stop the
        others and fail (the failure is logged here, and `started` names it)."""
        slots = range(len(self.workers))
        outcomes = await asyncio.gather(*(self._start_in(slot) for slot in slots), return_exceptions=True)
        failure = next((outcome for outcome in outcomes if isinstance(outcome, BaseException)), None)
        if failure is not None:
            logger.error("the env workers did not start: %s", failure)
            self._closing = True
            await self._stop_workers()
            raise failure

    async def _start_in(self, slot: int) -> None:
        """Start the first worker of `slot`; a TimeoutError says what it did not do in time."""
        try:
            self.workers[slot] = await self._spawn(slot)
        except TimeoutError:
            raise TimeoutError(
                f"env worker {slot} did not load the env within {WORKER_START_TIMEOUT_S:.0f} s"
            ) from None

    async def _stop_workers(self) -> None:
        """Stop every worker in a slot, at once, each within the shutdown grace."""
        workers = [w for w in self.workers if w is not None]
        await asyncio.gather(*(w.stop(self.settings.shutdown_timeout_s) for w in workers))

    async def _place(self, session_id: str, op: str, args: list[Any]) -> Any:
        """Run `op` for a session new to this pool in the worker holding the fewest, which keeps it."""
        worker = min(await self._alive(), key=lambda w: (len(w.sessions), len(w.pending)))
        self.placement[session_id] = worker
        worker.sessions.add(session_id)
        try:
            return await worker.call(op, [session_id, *args])
        except BaseException:
            self.discard(session_id)
            raise

    async def _alive(self) -> list[WorkerProcess]:
        """The running workers, once they have started; a 500 if none is."""
        await self.started()
        alive = [w for w in self.workers if w is not None and w.alive]
        if not alive:
            raise ServiceError(ErrorCode.INTERNAL, "no env worker process is running; see the server log")
        return alive

    def _worker_of(self, session_id: str) -> WorkerProcess:
        """The worker holding `session_id` (the manager only asks about sessions it has started)."""
        worker = self.placement.get(session_id)
        if worker is None:
            raise EnvLostError(f"the env of session {session_id} is gone")
        return worker

    async def _spawn(self, slot: int) -> WorkerProcess:
        """Start the worker of `slot` and wait for its ready frame."""
        command = [
            sys.executable,
            "-m",
            "vistarl.services.server.worker_process",
            self.import_path,
            "--max-image-bytes",
            str(self.settings.max_image_bytes),
            "--max-image-pixels",
            str(self.settings.max_image_pixels),
            *(["--export-state"] if self.settings.session_store is not None else []),
        ]
        worker = WorkerProcess(slot, self.settings.env_timeout_s, on_exit=self._replace)
        await worker.launch(command)
        return worker

    def _replace(self, dead: WorkerProcess) -> None:
        """A worker exited: its sessions are lost; start another in its slot unless shutting down."""
        if self._closing or self.workers[dead.slot] is not dead:
            return
        self.workers[dead.slot] = None
        lost = len(dead.sessions)
        logger.error("env worker %d (pid %s) exited; %d sessions lost", dead.slot, dead.pid, lost)
        restart = asyncio.get_running_loop().create_task(
            self._restart(dead.slot), name=f"vistarl-env-worker-{dead.slot}-restart"
        )
        self._restarting.add(restart)  # the loop keeps only weak references to tasks
        restart.add_done_callback(self._restarting.discard)

    async def _restart(self, slot: int) -> None:
        """Start a replacement worker in `slot`, a few times with a growing pause before giving up."""
        for attempt in range(1, WORKER_RESTART_ATTEMPTS + 1):
            try:
                worker = await self._spawn(slot)
            except Exception:
                logger.exception("restarting env worker %d failed (attempt %d)", slot, attempt)
                await asyncio.sleep(attempt)
                continue
            if self._closing:
                await worker.stop(self.settings.shutdown_timeout_s)
                return
            self.workers[slot] = worker
            self.metrics.env_worker_restarts.inc()
            return


class WorkerProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's protocol of a child process with its stdin as a stream, but its stdout handed to the
    `WorkerProcess` as it arrives."""

    def __init__(self, worker: WorkerProcess, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=STREAM_LIMIT, loop=loop)
        self.worker = worker

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        if fd == 1 and isinstance(data, bytes):
            self.worker.received(data)
        else:
            super().pipe_data_received(fd, data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        super().pipe_connection_lost(fd, exc)
        if fd == 1:
            self.worker.output_closed()


class WorkerProcess:
    """One `vistarl.services.server.worker_process` process, its sessions, and the calls awaiting its
    answers."""

    def __init__(self, slot: int, timeout_s: float, on_exit: Any) -> None:
        self.slot = slot
        self.timeout_s = timeout_s
        self.on_exit = on_exit
        self.sessions: set[str] = set()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.alive = False
        self.pid: int | None = None
        self._ids = itertools.count(1)
        self._process: asyncio.subprocess.Process | None = None
        self._answers = msgpack.Unpacker(max_buffer_size=MAX_ANSWER_BYTES)
        self._ended: asyncio.Task[None] | None = None

    async def launch(self, command: list[str]) -> None:
        """Start the process and wait for its ready frame (it sends one once the env module is loaded)."""
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            lambda: WorkerProtocol(self, loop),
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=None,
            start_new_session=True,
        )
        self._process = asyncio.subprocess.Process(transport, protocol, loop)
        self.pid = self._process.pid
        ready: asyncio.Future[Any] = loop.create_future()
        self.pending[0] = ready
        self.alive = True
        try:
            async with asyncio.timeout(WORKER_START_TIMEOUT_S):
                await ready
        except BaseException:
            self._kill()
            raise

    async def call(self, op: str, args: list[Any]) -> Any:
        """Send one call and await its answer within the timeout; a timeout kills the worker.

        The bound is a timer on the loop that fails the answer (`_overran`), cancelled when the answer
        comes: cheaper per call than an `asyncio.timeout` scope, and a step makes one call."""
        if not self.alive or self._process is None or self._process.stdin is None:
            raise EnvLostError(f"env worker {self.slot} (pid {self.pid}) is not running")
        call_id = next(self._ids)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        self.pending[call_id] = answer
        self._process.stdin.write(msgpack.packb([call_id, op, args]))
        timer = loop.call_later(self.timeout_s, self._overran, op, answer)
        try:
            return await answer
        finally:
            timer.cancel()
            self.pending.pop(call_id, None)

    def _overran(self, op: str, answer: asyncio.Future[Any]) -> None:
        """A call got no answer within the timeout: fail it and kill the worker, which cannot be trusted."""
        if answer.done():
            return
        logger.error("env %s exceeded %ss; killing env worker %d", op, self.timeout_s, self.slot)
        answer.set_exception(EnvGoneError(f"environment {op} exceeded {self.timeout_s}s"))
        self._kill()

    async def stop(self, grace_s: float) -> None:
        """Close stdin (the worker then closes its envs and exits), then kill it if it outlives `grace_s`."""
        if self._process is None:
            return
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            async with asyncio.timeout(grace_s):
                await self._process.wait()
        except TimeoutError:
            self._kill()
        if self._ended is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._ended

    def received(self, data: bytes) -> None:
        """Resolve the calls whose answers `data` completes, as the pipe delivers it (no reader task wakes
        up per answer); a bad frame kills the worker."""
        if self._ended is not None:
            return
        try:
            self._answers.feed(data)
            for call_id, ok, payload in self._answers:
                self._answer(call_id, ok, payload)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            logger.error("env worker %d sent a bad frame: %s", self.slot, exc)
            self.output_closed()
            self._kill()

    def output_closed(self) -> None:
        """The worker's stdout closed (or can no longer be read): fail what is left once it has exited."""
        if self._ended is None:
            self.alive = False
            self._ended = asyncio.get_running_loop().create_task(
                self._end(), name=f"vistarl-env-worker-{self.pid}-end"
            )

    async def _end(self) -> None:
        """Wait for the process to exit, fail every call still waiting, and tell the pool."""
        assert self._process is not None
        returncode = await self._process.wait()
        gone = EnvGoneError(f"env worker {self.slot} exited with code {returncode}")
        for future in self.pending.values():
            if not future.done():
                future.set_exception(gone)
        self.on_exit(self)

    def _answer(self, call_id: int, ok: bool, payload: Any) -> None:
        future = self.pending.get(call_id)
        if future is None or future.done():
            return
        if ok:
            future.set_result(payload)
        else:
            code, message = payload
            future.set_exception(ServiceError(ErrorCode(code), message))

    def _kill(self) -> None:
        self.alive = False
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
