"""Advantage estimators against values worked out by hand with plain Python arithmetic."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vistarl.trainer.learner.advantages import (
    broadcast_to_tokens,
    compute_advantages,
    gae,
    group_advantages,
    last_token_mask,
    mc_returns,
    outcome_to_token_rewards,
    turn_end_positions,
    turn_gae,
)


def _assert_close(actual: torch.Tensor, expected: list[float] | list[list[float]]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), rtol=1e-5, atol=1e-6)


def test_grpo_uses_group_mean_and_unbiased_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 3.0, 0.5, 0.0, 2.0])
    group_ids = torch.tensor([7, 7, 7, 3, 3, 3])  # ids need not be 0-based or sorted
    first, second = [1.0, 0.0, 3.0], [0.5, 0.0, 2.0]
    expected = [
        (r - statistics.mean(group)) / (statistics.stdev(group) + 1e-6)
        for group in (first, second)
        for r in group
    ]
    _assert_close(group_advantages(rewards, group_ids), expected)


def test_dr_grpo_subtracts_the_mean_only() -> None:
    rewards = torch.tensor([1.0, 0.0, 4.0, 2.0])
    group_ids = torch.tensor([0, 1, 0, 1])  # interleaved groups
    _assert_close(group_advantages(rewards, group_ids, scale_by_std=False), [-1.5, -1.0, 1.5, 1.0])


def test_identical_rewards_give_exactly_zero_and_no_nan() -> None:
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 5.0])
    group_ids = torch.tensor([0, 0, 0, 1, 2])  # groups 1 and 2 have a single member
    advantages = group_advantages(rewards, group_ids)
    assert torch.equal(advantages, torch.zeros(5))


def test_group_advantages_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="group_ids"):
        group_advantages(torch.zeros(4), torch.zeros(3))


@settings(max_examples=50, deadline=None)
@given(
    rewards=st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=12),
    num_groups=st.integers(1, 4),
)
def test_grpo_advantages_are_finite_and_centred_per_group(rewards: list[float], num_groups: int) -> None:
    group_ids = torch.arange(len(rewards)) % num_groups
    advantages = group_advantages(torch.tensor(rewards), group_ids)
    assert torch.isfinite(advantages).all()
    for group in range(num_groups):
        assert abs(float(advantages[group_ids == group].sum())) < 1e-3


def test_outcome_rewards_broadcast_and_land_on_last_token() -> None:
    mask = torch.tensor([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 0, 0]])
    assert last_token_mask(mask).tolist() == [[False, False, False, False, True, False], [False] * 6]
    _assert_close(outcome_to_token_rewards(torch.tensor([2.0, 3.0]), mask), [[0, 0, 0, 0, 2, 0], [0] * 6])
    _assert_close(
        broadcast_to_tokens(torch.tensor([-0.5, 1.0]), mask), [[0, -0.5, -0.5, 0, -0.5, 0], [0] * 6]
    )


def test_gae_skips_observation_tokens() -> None:
    # Response tokens at 1, 2 and 4; position 3 is an observation token whose value must be ignored.
    mask = torch.tensor([[0, 1, 1, 0, 1]])
    values = torch.tensor([[9.0, 0.5, 0.4, 9.0, 0.3]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    gamma, lam = 0.9, 0.8
    a4 = 1.0 - 0.3
    a2 = (gamma * 0.3 - 0.4) + gamma * lam * a4
    a1 = (gamma * 0.4 - 0.5) + gamma * lam * a2
    result = gae(rewards, values, mask, gamma, lam)
    _assert_close(result.advantages, [[0, a1, a2, 0, a4]])
    assert result.returns is not None
    _assert_close(result.returns, [[0, a1 + 0.5, a2 + 0.4, 0, a4 + 0.3]])


def test_mc_returns_discount_over_response_tokens() -> None:
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])
    rewards = outcome_to_token_rewards(torch.tensor([2.0, -1.0]), mask)
    _assert_close(mc_returns(rewards, mask, gamma=0.5), [[0.5, 1.0, 0.0, 2.0], [-0.25, -0.5, -1.0, 0.0]])


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(st.floats(-5, 5, allow_nan=False), min_size=6, max_size=6),
    rewards=st.lists(st.floats(-5, 5, allow_nan=False), min_size=6, max_size=6),
    mask=st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_gae_with_lambda_one_returns_the_reward_to_go(
    values: list[float], rewards: list[float], mask: list[bool]
) -> None:
    mask_t = torch.tensor([mask])
    result = gae(torch.tensor([rewards]), torch.tensor([values]), mask_t, gamma=1.0, lam=1.0)
    assert result.returns is not None
    kept = [r if m else 0.0 for r, m in zip(rewards, mask, strict=True)]
    expected = [sum(kept[t:]) if mask[t] else 0.0 for t in range(6)]
    torch.testing.assert_close(result.returns, torch.tensor([expected]), rtol=1e-4, atol=1e-4)


def test_turn_gae_matches_hand_computation() -> None:
    # Turn 0 generates positions 1-2, an observation sits at 3, turn 1 generates positions 4-5.
    mask = torch.tensor([[0, 1, 1, 0, 1, 1]])
    turn_index = torch.tensor([[-1, 0, 0, -1, 1, 1]])
    values = torch.tensor([[0.0, 0.2, 0.5, 7.0, 0.1, 0.4]])
    turn_rewards = torch.tensor([[0.3, 1.0]])
    gamma, lam, gamma_turn = 0.99, 0.9, 0.95

    turn1 = 1.0 - 0.4
    turn0 = 0.3 + gamma_turn * 0.4 - 0.5 + gamma_turn * lam * turn1
    pos5 = (turn1 + 0.4) - 0.4
    pos4 = (gamma * 0.4 - 0.1) + gamma * lam * pos5
    pos2 = (turn0 + 0.5) - 0.5
    pos1 = (gamma * 0.5 - 0.2) + gamma * lam * pos2

    result = turn_gae(turn_rewards, values, mask, turn_index, gamma, lam, gamma_turn)
    _assert_close(result.advantages, [[0, pos1, pos2, 0, pos4, pos5]])
    assert math.isclose(pos2, turn0) and math.isclose(pos5, turn1)
    assert result.returns is not None
    _assert_close(result.returns, [[0, pos1 + 0.2, pos2 + 0.5, 0, pos4 + 0.1, pos5 + 0.4]])


def test_turn_gae_skips_turns_without_tokens() -> None:
    mask = torch.tensor([[1, 1, 0, 0]])
    turn_index = torch.tensor([[0, 0, 1, 1]])
    assert turn_end_positions(mask, turn_index, 2).tolist() == [[1, -1]]
    values = torch.tensor([[0.1, 0.2, 0.0, 0.0]])
    result = turn_gae(torch.tensor([[1.0, 50.0]]), values, mask, turn_index, 1.0, 1.0, 0.95)
    _assert_close(result.advantages, [[(1.0 - 0.2) + (0.2 - 0.1), 1.0 - 0.2, 0, 0]])


def test_turn_gae_rejects_turn_index_out_of_range() -> None:
    mask = torch.tensor([[1, 1]])
    with pytest.raises(ValueError, match="turn_index"):
        turn_gae(torch.zeros(1, 2), torch.zeros(1, 2), mask, torch.tensor([[0, 2]]), 1.0, 1.0, 0.95)


def test_compute_advantages_dispatches_each_estimator() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 1, 1]])
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0])
    group_ids = torch.tensor([0, 0, 1, 1])
    values = torch.full((4, 3), 0.5)

    grpo = compute_advantages("grpo", mask, rewards=rewards, group_ids=group_ids)
    scale = 0.5 / (statistics.stdev([1.0, 0.0]) + 1e-6)
    _assert_close(grpo.advantages, [[scale, scale, 0], [-scale, 0, 0], [0, 0, 0], [0, 0, 0]])
    assert grpo.returns is None

    dr = compute_advantages("dr_grpo", mask, rewards=rewards, group_ids=group_ids)
    _assert_close(dr.advantages, [[0.5, 0.5, 0], [-0.5, 0, 0], [0, 0, 0], [0, 0, 0]])

    mc = compute_advantages("mc", mask, rewards=rewards, gamma=1.0)
    _assert_close(mc.advantages, [[1, 1, 0], [0, 0, 0], [0, 2, 2], [2, 2, 2]])

    critic = compute_advantages("gae", mask, rewards=rewards, values=values, gamma=1.0, lam=1.0)
    _assert_close(critic.advantages, [[0.5, 0.5, 0], [-0.5, 0, 0], [0, 1.5, 1.5], [1.5, 1.5, 1.5]])

    turn_index = torch.zeros(4, 3, dtype=torch.long)
    turns = compute_advantages(
        "turn_gae", mask, values=values, turn_rewards=rewards[:, None], turn_index=turn_index, lam=1.0
    )
    torch.testing.assert_close(turns.advantages, critic.advantages)


def test_compute_advantages_names_missing_inputs_and_unknown_estimators() -> None:
    mask = torch.ones(2, 2)
    with pytest.raises(ValueError, match="needs group_ids"):
        compute_advantages("grpo", mask, rewards=torch.zeros(2))
    with pytest.raises(ValueError, match="needs values"):
        compute_advantages("gae", mask, rewards=torch.zeros(2))
    with pytest.raises(ValueError, match="needs turn_rewards"):
        compute_advantages("turn_gae", mask, values=torch.zeros(2, 2), turn_index=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'"):
        compute_advantages("ppo", mask, rewards=torch.zeros(2))
