"""What an episode plays, whatever the env: the `EpisodeEnv` contract and its one error, `EnvError`.

Both handles meet it: `env_handle.EnvHandle` (a vistarl env, over HTTP or in process) and
`openenv_env.OpenEnvHandle` (an OpenEnv server), so the episode loop cannot tell them apart. It lives apart
from both so that `env_handle`, which opens an OpenEnv handle on first use, and `openenv_env` import it
rather than each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from vistarl.clients.protocol import StepResponse
from vistarl.trainer.rollout.job import EpisodeJob


class EnvError(RuntimeError):
    """The environment failed: it raised, overran its timeout, or its server failed or is unreachable."""


class EpisodeEnv(Protocol):
    """What an episode plays: one session of an env, reset from the job, stepped with each reply, closed at
    the end. `system_prompt` is valid once `reset` has returned."""

    system_prompt: str

    async def reset(self, job: EpisodeJob) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start the job's task: the first observation as a user message, and the env's info."""
        ...

    async def step(self, text: str) -> tuple[dict[str, Any], StepResponse]:
        """Send the model's reply: the next observation's message, and the turn (reward, done, info)."""
        ...

    async def close(self) -> None:
        """End the session; never raises, safe to call twice."""
        ...


def opening_messages(env: EpisodeEnv, message: dict[str, Any]) -> list[dict[str, Any]]:
    """An episode's opening context: the env's system prompt, if it has one, then its first observation
    (`message`, from `reset`)."""
    system = [{"role": "system", "content": env.system_prompt}] if env.system_prompt else []
    return [*system, message]


@contextlib.contextmanager
def env_errors(what: str) -> Iterator[None]:
    """Re-raise any failure of an env call (but not cancellation) as `EnvError` naming the call."""
    try:
        yield
    except EnvError:
        raise
    except TimeoutError as exc:
        raise EnvError(f"env {what} timed out") from exc
    except Exception as exc:
        raise EnvError(f"env {what} failed: {type(exc).__name__}: {exc}") from exc
