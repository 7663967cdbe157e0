"""`Supervisor`: a plan's processes started in order, watched, restarted within a bound, and stopped.

Each process runs in a session of its own, so that what it starts (an env server's env workers,
torchrun's ranks) is signalled with it; its output goes to `DIR/logs/NAME.log` and its pid to
`DIR/pids/NAME.pid`, and `DIR/processes.json` holds every process's state, rewritten at each change
(`vistarl status` reads it). The processes start part by part (Redis, the env server, the engines, the
workers, the trainer): a part's processes all at once (several engines load their checkpoints together),
once every process of the part before answers its readiness check.

A long-lived process that exits, or that does not answer within its start timeout, is started again,
at most `max_restarts` times; one more death and the run stops, exiting 1 with the process's name and
the last lines of its log. The run's own process (the trainer) is never restarted: its exit ends the
run, with its exit code. SIGTERM and SIGINT stop everything: the processes get SIGTERM part by part, in
the reverse of the start order (the trainer, the workers, the engine, the env server, Redis), each
part killed once its grace period (the compose file's) has passed; a second signal kills at once.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from urllib.parse import urlsplit

import httpx

from vistarl.launcher.plan import ROLES, ProcessSpec

__all__ = ["PROCESSES_FILE", "Ending", "Supervisor", "log_tail"]

PROCESSES_FILE = "processes.json"
POLL_S = 0.25
PROBE_TIMEOUT_S = 1.0
RESTART_DELAY_S = 1.0
LOG_TAIL_LINES = 20
LOG_COLUMNS = 160
"""The width the processes' consoles write their logs at (rich's default, 80, wraps every step line)."""
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Ending:
    """How a run ended: the exit code of `vistarl up`, and why."""

    code: int
    reason: str


@dataclass(eq=False)
class _Process:
    """A process of the plan and where it stands: `waiting` (not started yet), `starting`, `running`,
    `restarting`, `exited` or `stopped`."""

    spec: ProcessSpec
    popen: subprocess.Popen[bytes] | None = None
    state: str = "waiting"
    restarts: int = 0
    exit_code: int | None = None
    ready_by: float = 0.0
    restart_at: float = 0.0


class Supervisor:
    """Runs `specs` under `out` (see the module docstring); `echo` prints the run's events."""

    def __init__(
        self,
        specs: tuple[ProcessSpec, ...],
        out: Path,
        *,
        max_restarts: int,
        echo: Callable[[str], None],
    ) -> None:
        self.processes = [_Process(spec) for spec in specs]
        self.out = out
        self.max_restarts = max_restarts
        self.echo = echo
        self.signals: list[int] = []
        for folder in ("logs", "pids"):
            (out / folder).mkdir(parents=True, exist_ok=True)

    def run(self) -> Ending:
        """Start, watch and stop the processes; how the run ended. Call it on the main thread."""
        handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        (self.out / "pids" / "up.pid").write_text(f"{os.getpid()}\n")
        try:
            ending = self._start_all() or self._watch()
        finally:
            self._stop_all()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
        return ending

    def log_path(self, name: str) -> Path:
        """Where process `name` writes its output."""
        return self.out / "logs" / f"{name}.log"

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Note the signal; the watch loop (or, during the stop, the wait) acts on it."""
        self.signals.append(signum)

    def _start_all(self) -> Ending | None:
        """Start each part's processes together once the part before is ready; an ending if the run ends
        meanwhile."""
        for _, part in itertools.groupby(self.processes, key=lambda process: process.spec.role):
            starting = list(part)
            for process in starting:
                self._launch(process)
            while any(process.state in ("starting", "restarting") for process in starting):
                ending = self._tick()
                if ending is not None:
                    return ending
                time.sleep(POLL_S)
        return None

    def _watch(self) -> Ending:
        """Tick until the run ends."""
        while True:
            ending = self._tick()
            if ending is not None:
                return ending
            time.sleep(POLL_S)

    def _tick(self) -> Ending | None:
        """One look at every process: signals, exits, restarts due, readiness; an ending if the run ends."""
        if self.signals:
            name = signal.Signals(self.signals[0]).name
            return Ending(128 + self.signals[0], f"{name}: stopping every process")
        for process in self.processes:
            ending = self._look_at(process)
            if ending is not None:
                return ending
        return None

    def _look_at(self, process: _Process) -> Ending | None:
        """Act on what became of one process since the last look."""
        now = time.monotonic()
        if process.state == "restarting" and now >= process.restart_at:
            self._launch(process)
        if process.popen is None or process.state not in ("starting", "running"):
            return None
        code = process.popen.poll()
        if code is not None:
            return self._exited(process, code, f"exited with code {code}")
        if process.state == "starting":
            if _answers(process.spec.ready):
                process.state = "running"
                self._save()
            elif now >= process.ready_by:
                _kill_group(process.popen, signal.SIGKILL)
                process.popen.wait()
                timeout = process.spec.start_timeout_s
                return self._exited(
                    process, None, f"did not answer {process.spec.ready} within {timeout:g} s"
                )
        return None

    def _exited(self, process: _Process, code: int | None, how: str) -> Ending | None:
        """A process ended: the run ends with the trainer, a service is restarted while it may be."""
        assert process.popen is not None
        _kill_group(process.popen, signal.SIGKILL)  # what it started goes with it
        name = process.spec.name
        process.exit_code = code
        process.state = "exited"
        self._save()
        if not process.spec.restart:
            if code == 0:
                return Ending(0, f"{name} finished")
            return Ending(1, f"{name} {how}{self._tail(name)}")
        if process.restarts >= self.max_restarts:
            restarts = {0: "not restarted", 1: "restarted once"}.get(
                process.restarts, f"restarted {process.restarts} times"
            )
            return Ending(
                1, f"{name} {how}, {restarts} (--max-restarts {self.max_restarts}){self._tail(name)}"
            )
        process.restarts += 1
        process.state = "restarting"
        process.restart_at = time.monotonic() + RESTART_DELAY_S
        self.echo(f"{name} {how}: restarting it ({process.restarts} of {self.max_restarts})")
        self._save()
        return None

    def _launch(self, process: _Process) -> None:
        """Start (or start again) a process in its own session, its output appended to its log."""
        spec = process.spec
        env = {"COLUMNS": str(LOG_COLUMNS), **os.environ, "PYTHONUNBUFFERED": "1", **spec.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
        with self.log_path(spec.name).open("ab") as log:
            if process.restarts:
                log.write(f"--- vistarl up: restart {process.restarts} at {time.ctime()} ---\n".encode())
                log.flush()
            process.popen = subprocess.Popen(
                list(spec.argv), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        (self.out / "pids" / f"{spec.name}.pid").write_text(f"{process.popen.pid}\n")
        process.state = "starting" if spec.ready else "running"
        process.ready_by = time.monotonic() + spec.start_timeout_s
        process.exit_code = None
        if not process.restarts:
            self.echo(f"{spec.name}: started (pid {process.popen.pid}), log {self.log_path(spec.name)}")
        self._save()

    def _stop_all(self) -> None:
        """SIGTERM each part's processes, in the reverse of the start order, and SIGKILL those that outlive
        their grace period (all of them at once on a second signal)."""
        signals_seen = len(self.signals)
        for role in reversed(ROLES):
            alive = [p for p in self.processes if p.spec.role == role and _alive(p)]
            for process in alive:
                assert process.popen is not None
                _kill_group(process.popen, signal.SIGTERM)
            for process in alive:
                deadline = time.monotonic() + process.spec.stop_grace_s
                assert process.popen is not None
                while process.popen.poll() is None and time.monotonic() < deadline:
                    if len(self.signals) > signals_seen:  # asked again: no more waiting
                        break
                    time.sleep(0.1)
                _kill_group(process.popen, signal.SIGKILL)
                process.popen.wait()
                process.exit_code = process.popen.returncode
                process.state = "stopped"
            if alive:
                self.echo(f"stopped {', '.join(p.spec.name for p in alive)}")
        self._save()

    def _tail(self, name: str) -> str:
        """The last lines of a process's log, to quote in the run's ending."""
        return f"; the last lines of {self.log_path(name)}:\n{log_tail(self.log_path(name))}"

    def _save(self) -> None:
        """Write every process's state to `DIR/processes.json` (whole, or not at all)."""
        record = {
            "supervisor": os.getpid(),
            "updated": time.time(),
            "processes": {
                p.spec.name: {
                    "role": p.spec.role,
                    "pid": p.popen.pid if p.popen is not None else None,
                    "state": p.state,
                    "restarts": p.restarts,
                    "exit_code": p.exit_code,
                }
                for p in self.processes
            },
        }
        partial = self.out / f".{PROCESSES_FILE}.partial"
        partial.write_text(json.dumps(record, indent=1) + "\n")
        partial.replace(self.out / PROCESSES_FILE)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log (read from its end: logs grow long)."""
    if not path.is_file():
        return "(no log)"
    with path.open("rb") as log:
        log.seek(0, os.SEEK_END)
        log.seek(max(0, log.tell() - 64 * 1024))
        text = log.read().decode(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _alive(process: _Process) -> bool:
    """Whether a process was started and has not exited."""
    return process.popen is not None and process.popen.poll() is None


def _kill_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    """Send `sig` to the process's session (its group): it and whatever it started."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _answers(ready: str | None) -> bool:
    """Whether a readiness check passes: an `http://` URL answers 2xx, a `tcp://host:port` accepts."""
    if ready is None:
        return True
    where = urlsplit(ready)
    if where.scheme == "tcp":
        assert where.hostname is not None and where.port is not None
        with (
            contextlib.suppress(OSError),
            socket.create_connection((where.hostname, where.port), PROBE_TIMEOUT_S),
        ):
            return True
        return False
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(ready, timeout=PROBE_TIMEOUT_S).is_success
    return False
