"""What the model reads: the system prompt (the seed's processed-data instruction), the problem, and the
tool's feedback messages, one per row of the step table in docs/geo3k.md."""

from __future__ import annotations

import random
from collections.abc import Sequence

from vistarl.services.geo3k.sample import IMAGE_PLACEHOLDER, LETTERS

CALL_FORMAT = '<tool_call>{"name": "calc_score", "arguments": {"answer": "<your answer>"}}</tool_call>'
ACTION_FORMAT = f"{CALL_FORMAT} to check an answer; Answer: \\boxed{{<your answer>}} for the final answer"
FINAL_ANSWER_FORM = "Answer: \\boxed{$Answer}"

SYSTEM_PROMPT = (
    "You are a math and geometry expert. Solve the user's problem carefully and check your work.\n\n"
    "Follow this protocol:\n"
    "1) First reason step by step, as an internal monologue inside <think>...</think> tags.\n"
    "2) When you have an answer, call the `calc_score` tool (also called `calc_geo3k_reward`) at least "
    "once to check it before you finalize. Write the call exactly like this, with a JSON object inside "
    f"the tags:\n    {CALL_FORMAT}\n"
    f"   In the same message, right after the call, also give the answer as {FINAL_ANSWER_FORM}.\n"
    "3) Use the tool's feedback to refine your solution if needed.\n"
    f"4) Give the final answer as {FINAL_ANSWER_FORM}, where $Answer is the answer to the problem."
)

NO_TOOL_CALL = "No tool call detected; ending the episode."
CALL_HINT = (
    f"Call `calc_score` (or `calc_geo3k_reward`) as {CALL_FORMAT} (JSON inside the tags) "
    "to check your solution."
)
WRONG_HINT = (
    "Your answer is wrong. You may need to reason in a different way. "
    "Don't repeat your answer unless necessary."
)
LAST_CHANCE = (
    "Since you have only one chance left to answer, don't call the tool again. Give your final answer "
    f"in the form {FINAL_ANSWER_FORM}, where $Answer is your final answer to this problem."
)


def problem_text(problem: str, choices: Sequence[str] | None) -> str:
    """The problem without its image placeholders (the images go first in the message), then the choices."""
    text = problem.replace(IMAGE_PLACEHOLDER, "").strip()
    if not choices:
        return text
    lines = [f"{letter}. {choice}" for letter, choice in zip(LETTERS, choices, strict=False)]
    return text + "\nChoices:\n" + "\n".join(lines)


def unsupported_tool(name: str) -> str:
    """A call to a tool other than the checker."""
    return f"Tool `{name}` is not supported. {CALL_HINT}"


def missing_answer() -> str:
    """A call to the checker without an answer."""
    return f"Tool call detected but no `answer` was provided. {CALL_HINT}"


def correct_answer(answer: str) -> str:
    """The checker's reply to a correct answer."""
    return (
        f"calc_score result: 1.0. Parsed answer '{answer}' matches the reference. "
        "You can now stop reasoning and provide the final solution in \\boxed{}."
    )


def recorded_answer(answer: str, last_chance: bool) -> str:
    """The format-only checker's reply to a well-formed call: recorded, not a word on whether it is right."""
    text = (
        f"calc_score: the call is well formed and answer '{answer}' is recorded. This checker does not say "
        f"whether an answer is right; give your final answer as {FINAL_ANSWER_FORM}."
    )
    return f"{text} {LAST_CHANCE}" if last_chance else text


def wrong_answer(answer: str, last_chance: bool) -> str:
    """The checker's reply to a wrong answer, with the final-answer warning on the last chance."""
    text = f"calc_score result: 0.0. Parsed answer '{answer}' does not match the reference. {WRONG_HINT}"
    return f"{text} {LAST_CHANCE}" if last_chance else text


def random_reply(conversation: str, rng: random.Random) -> str:
    """The random player's reply (`vistarl eval --dummy`): a `calc_score` call on a random small integer,
    or (one time in three) a final answer of one."""
    guess = rng.randint(1, 20)
    if rng.random() < 1 / 3:
        return FINAL_ANSWER_FORM.replace("$Answer", str(guess))
    return CALL_FORMAT.replace("<your answer>", str(guess))
