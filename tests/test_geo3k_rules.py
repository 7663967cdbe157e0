"""Geo3k's step table, tool-call parsing, final-answer reward and state round trip, on generated problems."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from vistarl.services.geo3k import ENV_FACTORY, Geo3kEnv, Geo3kOptions, Geo3kSample, build_env
from vistarl.services.geo3k.generator import generate
from vistarl.services.geo3k.sample import LETTERS
from vistarl.services.geo3k.tool_call import TOOL_NAMES

pytestmark = pytest.mark.usefixtures("geo3k_graders")


def call(
    answer: Any, name: str = "calc_score", *, nested: bool = False, string_arguments: bool = False
) -> str:
    """A model turn holding one tool call, laid out in one of the accepted ways."""
    arguments: Any = {"answer": answer}
    if string_arguments:
        arguments = json.dumps(arguments)
    payload = (
        {"function": {"name": name, "arguments": arguments}}
        if nested
        else {"name": name, "arguments": arguments}
    )
    return f"Let me check.\n<tool_call>{json.dumps(payload)}</tool_call>"


def wrong(answer: str) -> str:
    """An answer that differs from `answer` by one."""
    return f"{answer} + 1"


def started(seed: int = 11, **options: Any) -> Geo3kEnv:
    env = Geo3kEnv(Geo3kOptions(**options), seed)
    env.reset()
    return env


NOT_CALLS = [
    "The answer is 5.",
    "<tool_call>{'name': 'calc_score', 'arguments': {'answer': '5'}}</tool_call>",
    '<tool_call>{"name": "calc_score", "arguments": {"answer": "5"},}</tool_call>',
    '<tool_call>{"arguments": {"answer": "5"}}</tool_call>',
    '{"name": "calc_score", "arguments": {"answer": "5"}}',
]


@pytest.mark.parametrize("text", NOT_CALLS)
def test_no_valid_tool_call_ends_the_episode(text: str) -> None:
    env = started()
    result = env.step(text)
    info = result.info
    assert result.terminated and not result.truncated
    assert info["outcome"] == "no_tool_call" and info["tool_score"] is None
    assert result.observation == {"text": "No tool call detected; ending the episode.", "images": []}


@pytest.mark.parametrize("final_turn", [False, True])
def test_unsupported_tool_shows_the_format_and_ends_only_on_the_last_turn(final_turn: bool) -> None:
    env = started(max_turns=1 if final_turn else 3)
    result = env.step(call(env.answer, name="calculator"))
    obs, info = result.observation, result.info
    assert result.truncated is final_turn and not result.terminated and info["outcome"] == "unsupported_tool"
    assert "`calculator` is not supported" in obs["text"] and "<tool_call>" in obs["text"]
    assert info["tool_score"] is None and env.metrics()["tool_calls"] == 0


@pytest.mark.parametrize("arguments", [{"answer": ""}, {"answer": "   "}, {}, {"value": "3"}])
def test_empty_answer_shows_the_format(arguments: dict[str, str]) -> None:
    env = started()
    payload = json.dumps({"name": "calc_score", "arguments": arguments})
    result = env.step(f"<tool_call>{payload}</tool_call>")
    obs = result.observation
    assert not result.done and result.info["outcome"] == "missing_answer"
    assert "no `answer` was provided" in obs["text"] and "<tool_call>" in obs["text"]


@pytest.mark.parametrize("name", ["calc_score", "calc_geo3k_reward"])
def test_a_correct_call_scores_one_and_asks_for_the_boxed_answer(name: str) -> None:
    env = started()
    result = env.step(call(env.answer, name=name))
    obs, info = result.observation, result.info
    assert not result.done and info["outcome"] == "correct" and info["tool_score"] == 1.0
    assert obs["images"] == [] and "calc_score result: 1.0" in obs["text"]
    assert f"'{env.answer}' matches the reference" in obs["text"] and "\\boxed{}" in obs["text"]
    assert result.reward == 0.0 and "episode_reward" not in info


def test_a_wrong_call_scores_zero_and_the_warning_starts_at_turn_max_turns_minus_2() -> None:
    env = started(max_turns=4)
    texts = []
    for turn in range(4):
        result = env.step(call(wrong(env.answer)))
        assert result.info["outcome"] == "wrong" and result.info["tool_score"] == 0.0
        assert result.done is result.truncated is (turn == 3)
        texts.append(result.observation["text"])
    assert all("does not match the reference" in text for text in texts)
    warned = ["one chance left" in text and "Answer: \\boxed{$Answer}" in text for text in texts]
    assert warned == [False, False, True, True]


def test_call_layouts_nested_and_string_arguments() -> None:
    env = started()
    nested = env.step(call(env.answer, nested=True)).info
    as_string = env.step(call(env.answer, string_arguments=True)).info
    assert nested["outcome"] == as_string["outcome"] == "correct"


def test_malformed_string_arguments_are_a_missing_answer() -> None:
    env = started()
    payload = json.dumps({"name": "calc_score", "arguments": "{answer: 5"})
    result = env.step(f"<tool_call>{payload}</tool_call>")
    assert not result.done and result.info["outcome"] == "missing_answer"


def test_of_several_calls_the_last_wins() -> None:
    env = started()
    right_last = env.step(call(wrong(env.answer)) + call(env.answer)).info
    wrong_last = env.step(call(env.answer) + call(wrong(env.answer))).info
    assert right_last["tool_call"]["answer"] == env.answer and right_last["outcome"] == "correct"
    assert wrong_last["outcome"] == "wrong"


def test_without_a_boxed_answer_the_last_tool_answer_is_the_reward() -> None:
    env = started()
    env.step(call(env.answer))
    env.step(call(wrong(env.answer)))
    result = env.step("I will stop here.")
    info = result.info
    assert result.done and info["final_answer_source"] == "tool" and info["episode_reward"] == 0.0


def test_the_boxed_answer_of_the_last_turn_is_the_reward() -> None:
    env = started()
    env.step(call(wrong(env.answer)))
    result = env.step(f"So the answer is settled. Answer: \\boxed{{{env.answer}}}")
    info = result.info
    assert result.done and info["final_answer_source"] == "boxed" and info["final_answer"] == env.answer
    assert info["episode_reward"] == result.reward == 1.0 and info["metrics"]["success"]


def test_a_boxed_answer_in_the_feedback_is_never_graded() -> None:
    env = started()
    feedback = env.step(call(env.answer)).observation
    assert "\\boxed{}" in feedback["text"]
    env.step(call(wrong(env.answer)))
    result = env.step("Thanks.")
    info = result.info
    assert result.done and info["episode_reward"] == 0.0 and info["final_answer"] == wrong(env.answer)
    assert env.metrics()["boxed_final_answer"] is False


def test_turn_rewards_are_zero_until_the_final_turn() -> None:
    env = started()
    rewards = [env.step(call(env.answer)).reward for _ in range(3)]
    assert rewards == [0.0, 0.0, 1.0] and env.done


def test_the_vime_option_ends_on_a_correct_call() -> None:
    env = started(end_on_correct=True)
    done_wrong = env.step(call(wrong(env.answer))).done
    result = env.step(call(env.answer))
    info = result.info
    assert (
        not done_wrong
        and result.terminated
        and info["episode_reward"] == 1.0
        and info["final_answer_source"] == "tool"
    )


def test_step_before_reset_or_after_done_raises() -> None:
    env = Geo3kEnv(seed=3)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("hi")
    env.reset()
    env.step("no call")
    with pytest.raises(RuntimeError, match="over"):
        env.step("again")


def multiple_choice_seed() -> int:
    return next(seed for seed in range(1000) if generate(seed).choices)


@pytest.mark.parametrize("show_choices", [True, False])
def test_a_choice_letter_counts_only_when_the_choices_are_shown(show_choices: bool) -> None:
    env = started(multiple_choice_seed(), show_choices=show_choices)
    assert env.choices is not None
    letter = LETTERS[env.choices.index(env.answer)]
    obs, _ = env.reset()
    assert (f"{letter}. {env.answer}" in obs["text"]) is show_choices
    by_letter = env.step(call(f"({letter})")).info
    by_value = env.step(call(env.answer)).info
    assert (
        by_letter["outcome"] == ("correct" if show_choices else "wrong") and by_value["outcome"] == "correct"
    )


def test_a_wrong_letter_is_wrong() -> None:
    env = started(multiple_choice_seed())
    assert env.choices is not None
    letter = next(LETTERS[i] for i, choice in enumerate(env.choices) if choice != env.answer)
    assert env.step(call(letter)).info["outcome"] == "wrong"


def test_first_observation_is_the_problem_with_its_diagram() -> None:
    env = Geo3kEnv(seed=4)
    obs, info = env.reset()
    assert "<image>" not in obs["text"] and obs["text"].startswith(env.problem.replace("<image>", "").strip())
    assert len(obs["images"]) == 1 and info["seed"] == 4 and env.answer not in json.dumps(info)
    message = env.format_observation(obs)
    assert [part["type"] for part in message["content"]] == ["image_url", "text"]


def test_a_sample_is_played_like_a_generated_problem() -> None:
    generated = generate(21)
    env = Geo3kEnv(Geo3kOptions(), sample=Geo3kSample.model_validate(generated.sample()))
    obs, info = env.reset()
    assert info["seed"] is None and info["id"] == "generated-21"
    assert obs["images"][0].tobytes() == generated.image.tobytes()
    assert env.step(call(generated.answer)).info["outcome"] == "correct"


def test_the_factory_builds_from_a_seed_or_a_sample_and_publishes_the_tool() -> None:
    options = Geo3kOptions()
    sample = Geo3kSample.model_validate(generate(12).sample())
    assert ENV_FACTORY.create(options, 12, None).answer == ENV_FACTORY.create(options, None, sample).answer
    with pytest.raises(ValueError, match="not both"):
        ENV_FACTORY.create(options, 12, sample)
    (tool,) = ENV_FACTORY.tools
    assert tool["type"] == "function" and tool["function"]["name"] in TOOL_NAMES
    assert tool["function"]["parameters"]["required"] == ["answer"]


def test_build_env_takes_the_seeds_arguments_and_options() -> None:
    env = build_env(args=SimpleNamespace(max_turns=2), seed=9)
    assert env.options.max_turns == 2 and env.answer == generate(9).answer
    assert build_env(args=SimpleNamespace(max_turns=2), max_turns=4).options.max_turns == 4
    row = generate(10).sample()
    assert build_env(sample=row).answer == row["answer"]
    with pytest.raises(TypeError, match="mapping"):
        build_env(sample=["not", "a", "row"])
    with pytest.raises(ValueError, match="max_turns"):
        build_env(max_turns=0)


def random_turn(rng: random.Random, env: Geo3kEnv) -> str:
    """One of the kinds of turns a model produces."""
    kinds = [
        lambda: call(env.answer),
        lambda: call(wrong(env.answer), name=rng.choice(["calc_score", "calc_geo3k_reward"])),
        lambda: call(env.answer, name="search"),
        lambda: call(""),
        lambda: f"Answer: \\boxed{{{env.answer}}}",
        lambda: call(wrong(env.answer)) + f" Answer: \\boxed{{{env.answer}}}",
    ]
    return rng.choice(kinds)()


@pytest.mark.parametrize("episode", range(12))
def test_restore_continues_identically_after_every_step(episode: int) -> None:
    rng = random.Random(episode)
    options = Geo3kOptions(max_turns=rng.randint(1, 4), end_on_correct=rng.random() < 0.3)
    sample = Geo3kSample.model_validate(generate(episode).sample()) if episode % 3 == 0 else None
    env = Geo3kEnv(options, None if sample else 1000 + episode, sample)
    env.reset()
    turns, results = [], []
    while not env.done:
        turns.append(random_turn(rng, env))
        results.append(env.step(turns[-1]))
    replay = Geo3kEnv(options, None if sample else 1000 + episode, sample)
    replay.reset()
    for played in range(len(turns) + 1):
        state = json.loads(json.dumps(replay.state()))
        restored = Geo3kEnv.from_state(state)
        assert restored.state() == state
        assert [restored.step(turn) for turn in turns[played:]] == results[played:]
        assert restored.state() == env.state()
        if played < len(turns):
            replay.step(turns[played])


def test_the_oracle_checker_lets_the_choices_be_tried_one_by_one() -> None:
    """The reward-hacking risk of the seed's checker (docs/geo3k.md, "What the checker tells")."""
    env = started(max_turns=8)
    letters = env.shown_letters
    outcomes = [env.step(call(letter)).info["outcome"] for letter in letters]
    assert outcomes.count("correct") == 1 and outcomes.count("wrong") == len(letters) - 1


def test_the_format_checker_tells_only_that_the_call_was_well_formed() -> None:
    right, wrong_env = started(calc_score="format"), started(calc_score="format")
    right_result, wrong_result = right.step(call(right.answer)), wrong_env.step(call(wrong(right.answer)))
    right_obs, info = right_result.observation, right_result.info
    wrong_obs, wrong_info = wrong_result.observation, wrong_result.info
    assert not right_result.done and info["outcome"] == wrong_info["outcome"] == "recorded"
    assert info["tool_score"] is wrong_info["tool_score"] is None
    assert right_obs["text"].replace(right.answer, "X") == wrong_obs["text"].replace(wrong(right.answer), "X")
    assert "well formed" in right_obs["text"] and "does not say" in right_obs["text"]
    assert info["metrics"]["tool_calls"] == 1 and info["metrics"]["correct_tool_calls"] == 0
    for env, expected in ((right, 1.0), (wrong_env, 0.0)):
        last = env.step("Done.")
        final = last.info
        assert last.done and final["episode_reward"] == expected and final["final_answer_source"] == "tool"


def test_end_on_correct_needs_the_oracle() -> None:
    with pytest.raises(ValidationError, match="end_on_correct needs calc_score: oracle"):
        Geo3kOptions(calc_score="format", end_on_correct=True)
