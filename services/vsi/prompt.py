"""What the model reads: the system prompt (rules, actions, answer format) and each observation's text.

The question block follows VSI-Bench's evaluation prompt: "These are frames of a video.", the question,
then either the numeric post-prompt or "Options:" with the options and the letter post-prompt.
"""

from __future__ import annotations

from vistarl.services.vsi.camera import ACTION_DESCRIPTIONS, Action
from vistarl.services.vsi.question import VsiQuestion

ACTION_FORMAT = (
    "<action>NAME</action> with NAME one of " + ", ".join(a.value for a in Action) + "; or <answer>X</answer>"
)
OPTIONS_HEADER = "Options:"
NUMERIC_POST_PROMPT = "Please answer the question using a single word or phrase."
CHOICE_POST_PROMPT = "Answer with the option's letter from the given choices directly."


def system_prompt(max_turns: int = 15) -> str:
    """The rules of the room, the actions, and the answer format."""
    actions = "\n".join(f"- {action.value}: {text}" for action, text in ACTION_DESCRIPTIONS.items())
    return (
        "You are standing in a room and must answer a question about its layout. Every object is drawn as a "
        "coloured box with its category written on it; the floor has a 1 m grid. First you see frames of a "
        "video: a walk around the room. Then you see your own view, which you can change.\n"
        "Each turn, do exactly one of:\n"
        "1. Take one action, written <action>NAME</action>, where NAME is one of:\n"
        f"{actions}\n"
        "   A wall stops a step; you will be told.\n"
        "2. Answer, written <answer>X</answer>, where X is a number or an option's letter. This ends the "
        "episode.\n"
        f"You have at most {max_turns} turns; if you have not answered by then, you score 0. "
        "You may think briefly before the tag."
    )


def question_block(question: VsiQuestion) -> str:
    """The question as VSI-Bench's evaluation prompt states it."""
    if question.question_type.numeric:
        return f"{question.question}\n{NUMERIC_POST_PROMPT}"
    options = "\n".join(question.options or [])
    return f"{question.question}\n{OPTIONS_HEADER}\n{options}\n{CHOICE_POST_PROMPT}"


def reset_text(question: VsiQuestion, tour_frames: int, max_turns: int) -> str:
    """The first observation's text: what the images are, the question, and the turn budget."""
    video = (
        f"These are frames of a video: the first {tour_frames} images. The last image is your current view."
        if tour_frames
        else "The image is your current view."
    )
    return (
        f"{video}\n{question_block(question)}\n"
        f"Explore with <action>NAME</action> or answer with <answer>X</answer>. Turns left: {max_turns}."
    )


def turn_text(feedback: str, turns_left: int) -> str:
    """A later observation's text: what the last action did, and the turns left."""
    return f"{feedback}\nThe image is your current view. Turns left: {turns_left}."
