"""One `vistarl up` a directory: the supervisor holds an exclusive `fcntl.flock` on `DIR/up.lock` for as long
as it lives, and the kernel drops it when the process ends, however it ends (SIGKILL included), so a dead
run never leaves its directory locked. The file holds the holder's pid, for `vistarl down` and for the
message that refuses a second run. The supervisor's children do not inherit the lock: `subprocess.Popen`
closes their copies of its descriptors, so a process left running by a killed supervisor holds nothing.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType

__all__ = ["LOCK_FILE", "DirectoryInUse", "RunLock", "held_by"]

LOCK_FILE = "up.lock"


class DirectoryInUse(RuntimeError):
    """Another live `vistarl up` runs in the directory."""

    def __init__(self, out: Path, pid: int) -> None:
        who = f"vistarl up (pid {pid})" if pid else "vistarl up"
        super().__init__(
            f"{out} is in use by a live {who}: stop it with `vistarl down {out}`, or give another --out"
        )


class RunLock:
    """The lock of directory `out`, held from `acquire` (or entering the `with` block) until this process ends
    or leaves the block."""

    def __init__(self, out: Path) -> None:
        self.path = out / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock and write this process's pid in it; `DirectoryInUse` when a live process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryInUse(self.path.parent, _pid(self.path)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays: a later run takes the same one)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def held_by(out: Path) -> int | None:
    """The pid of the live `vistarl up` that holds `out`'s lock (0 in the instant before it writes it), or
    None when no process holds it."""
    path = out / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _pid(path)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _pid(path: Path) -> int:
    """The pid a lock file holds; 0 when it holds none yet."""
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0
