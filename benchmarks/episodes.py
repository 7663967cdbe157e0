"""The episodes the server benchmarks play, per env: what each reset asks for, and the responses sent.

An `Episodes` gives the reset body of the n-th episode and that episode's responses, so that every load
(in process, over HTTP, against a peer server) plays the same episodes. Sokoban walks Up/Right/Down/Left
on the level of seed n until the episode ends; Geo3k answers problem n with a tool call (right or wrong),
a right one and the boxed answer; VSI looks around in room n twice, then answers.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from math_verify import parse

from vistarl.services.geo3k.generator import generate

SOKOBAN_MOVES = tuple(f"<answer>{move}</answer>" for move in ("Up", "Right", "Down", "Left"))
VSI_TURNS = ("<action>rotate_left</action>", "<action>move_forward</action>", "<answer>2</answer>")


@dataclass(frozen=True)
class Episodes:
    """How a benchmark plays env `env`: the `/reset` body of episode n, and the responses of episode n
    (sent until the episode ends)."""

    env: str
    reset: Callable[[int], dict[str, Any]]
    responses: Callable[[int], Iterable[str]]


@dataclass(frozen=True)
class Task:
    """A generated Geo3k problem's seed and the answers a model might give to it."""

    seed: int
    reference: str
    decimal: str
    wrong: str

    def turns(self, first_right: bool) -> tuple[str, str, str]:
        """An episode's three responses: a tool call (right or wrong), a right one, the boxed answer."""
        return (
            _tool_call(self.reference if first_right else self.wrong),
            _tool_call(self.reference),
            f"So the answer is settled. Answer: \\boxed{{{self.reference}}}",
        )


def _tool_call(answer: str) -> str:
    payload = json.dumps({"name": "calc_score", "arguments": {"answer": answer}})
    return f"Checking my result.\n<tool_call>{payload}</tool_call>\nAnswer: \\boxed{{{answer}}}"


def tasks(count: int) -> list[Task]:
    """Geo3k tasks for the first `count` seeds."""
    made = []
    for seed in range(count):
        problem = generate(seed)
        others = [choice for choice in problem.choices or [] if choice != problem.answer]
        value = float(parse(f"\\boxed{{{problem.answer}}}")[0])
        wrong = others[0] if others else f"{problem.answer} + 1"
        made.append(Task(seed, problem.answer, f"{value:.6f}", wrong))
    return made


def sokoban() -> Episodes:
    """The level of seed n, walked Up/Right/Down/Left until the episode ends."""
    return Episodes("sokoban", lambda n: {"seed": n}, lambda n: itertools.cycle(SOKOBAN_MOVES))


def geo3k(problems: int = 200) -> Episodes:
    """Problem n (of `problems`, in turn): the three turns of `Task.turns`, the first right on even n."""
    all_tasks = tasks(problems)

    def task(n: int) -> Task:
        return all_tasks[n % len(all_tasks)]

    return Episodes("geo3k", lambda n: {"seed": task(n).seed}, lambda n: task(n).turns(n % 2 == 0))


def vsi() -> Episodes:
    """The question of seed n: two moves, then an answer."""
    return Episodes("vsi", lambda n: {"seed": n}, lambda n: VSI_TURNS)


EPISODES: dict[str, Callable[[], Episodes]] = {"sokoban": sokoban, "geo3k": geo3k, "vsi": vsi}
