"""What the model reads: the system prompt with the rules and answer format, and each observation's text."""

from __future__ import annotations

from collections.abc import Sequence

IMAGE_HINT = "(Refer to the image for the grid layout.)"
ACTION_FORMAT = "<answer>Up, Left</answer>: up to 3 of Up, Down, Left, Right, separated by commas"


def system_prompt(max_actions: int = 3) -> str:
    """The rules of the game, both legends (image and text grid), and the answer format."""
    return (
        "You are a Sokoban solver. Push every box onto a target.\n"
        "In the image: brick-red cells are walls, black cells are floor, a red outlined square with a red "
        "diamond is a target, a yellow crate with an X is a box (outlined red when it sits on a target), "
        "and the green figure is you.\n"
        "In a text grid: # wall, space floor, . target, $ box, * box on target, @ you, + you on target.\n"
        "Rules:\n"
        "1. Each move goes one cell Up, Down, Left or Right.\n"
        "2. Walking into a box pushes it one cell, if the cell behind it is free. You cannot pull a box, "
        "push two boxes at once, or walk through walls.\n"
        "3. A move into a wall or a blocked push does nothing and is penalised; pushing a box off a target "
        "is penalised too.\n"
        "4. If your last move failed, choose a different direction.\n"
        f"Answer with up to {max_actions} moves in order, for example <answer>Up, Left</answer>. "
        "You may think briefly first, then give the answer block."
    )


def observation_text(grid: str | None, last_actions: Sequence[str]) -> str:
    """The seed's observation text: the XSB grid (or a pointer to the image) and the moves just taken."""
    actions = ", ".join(last_actions) if last_actions else "None"
    return (
        f"[Observation]\n{grid if grid is not None else IMAGE_HINT}\n"
        f"Valid last actions: {actions}\n"
        "Provide your next move(s) using Up, Down, Left, Right."
    )
