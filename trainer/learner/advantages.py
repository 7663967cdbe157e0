"""Advantage estimators: GRPO, Dr.GRPO, GAE, Monte-Carlo returns and turn-level (bi-level) GAE.

All functions are pure torch on padded `[B, T]` tensors aligned with the trainer's token ids, with a
`mask` that is 1 on generated (response) tokens and 0 elsewhere. Only mask-1 positions take part:
observation tokens between two turns are skipped, so a multi-turn trajectory is one sequence of
response tokens. Outputs are 0 at mask-0 positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP_STD_EPS = 1e-6


@dataclass(frozen=True)
class Advantages:
    """Per-token advantages, plus value targets (`returns`) for the estimators that train a critic."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None


def broadcast_to_tokens(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Give every response token of trajectory b the scalar `values[b]`: `[B]` to `[B, T]`."""
    return values.to(torch.float32)[:, None] * mask.to(torch.float32)


def last_token_mask(mask: torch.Tensor) -> torch.Tensor:
    """A bool `[B, T]` mask that marks the last mask-1 position of each row (none for an empty row)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, -1).amax(dim=1, keepdim=True)
    return (positions == last) & mask.bool()


def outcome_to_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each trajectory's scalar reward on its last response token: `[B]` to `[B, T]`."""
    return rewards.to(torch.float32)[:, None] * last_token_mask(mask).to(torch.float32)


def group_advantages(
    rewards: torch.Tensor, group_ids: torch.Tensor, scale_by_std: bool = True, eps: float = GROUP_STD_EPS
) -> torch.Tensor:
    """GRPO `(r - mean) / (std + eps)` per group, or Dr.GRPO `r - mean` when `scale_by_std` is False.

    `std` is the unbiased sample standard deviation (divisor n - 1), as `torch.std` computes it; a
    group of one has std 0. Each reward is first shifted by its group's maximum, so a group of
    identical rewards gives exactly 0 rather than rounding noise divided by eps.
    """
    if rewards.shape != group_ids.shape or rewards.dim() != 1:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_ids {tuple(group_ids.shape)} must be [B]")
    _, group, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    values = rewards.to(torch.float64)
    num_groups = counts.numel()
    group_max = values.new_full((num_groups,), -torch.inf).scatter_reduce(0, group, values, "amax")
    shifted = values - group_max[group]
    count = counts.to(torch.float64)[group]
    centered = shifted - values.new_zeros(num_groups).index_add(0, group, shifted)[group] / count
    if not scale_by_std:
        return centered.to(torch.float32)
    sum_sq = values.new_zeros(num_groups).index_add(0, group, centered**2)[group]
    std = (sum_sq / (count - 1).clamp(min=1)).sqrt()
    return (centered / (std + eps)).to(torch.float32)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    segment_end: torch.Tensor | None = None,
) -> Advantages:
    """Generalized advantage estimation over the mask-1 positions of each row of `[B, T]` tensors.

    `A_t = d_t + gamma*lam*A_next` with `d_t = r_t + gamma*V_next - V_t`, where "next" is the next mask-1
    position. Bootstrapping stops after the last one and after every position in `segment_end`.
    Returns advantages and value targets `A + V`.
    """
    if not rewards.shape == values.shape == mask.shape:
        shapes = f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)}, mask {tuple(mask.shape)}"
        raise ValueError(f"gae needs equal shapes, got {shapes}")
    active = mask.bool()
    stops = torch.zeros_like(active) if segment_end is None else segment_end.bool()
    rewards, values = rewards.to(torch.float32), values.to(torch.float32)
    advantages = torch.zeros_like(rewards)
    next_value = rewards.new_zeros(rewards.shape[0])
    next_adv = rewards.new_zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        carry = (~stops[:, t]).to(torch.float32)
        delta = rewards[:, t] + gamma * carry * next_value - values[:, t]
        adv = delta + gamma * lam * carry * next_adv
        advantages[:, t] = torch.where(active[:, t], adv, 0.0)
        next_value = torch.where(active[:, t], values[:, t], next_value)
        next_adv = torch.where(active[:, t], adv, next_adv)
    returns = torch.where(active, advantages + values, 0.0)
    return Advantages(advantages, returns)


def mc_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted reward-to-go over mask-1 positions: GAE with lam = 1 and no critic."""
    return gae(rewards, torch.zeros_like(rewards, dtype=torch.float32), mask, gamma, lam=1.0).advantages


def turn_end_positions(mask: torch.Tensor, turn_index: torch.Tensor, num_turns: int) -> torch.Tensor:
    """`[B, K]` position of each turn's last response token, or -1 for a turn without one."""
    active = mask.bool()
    in_range = (turn_index >= 0) & (turn_index < num_turns)
    if bool((active & ~in_range).any()):
        raise ValueError(f"turn_index must lie in [0, {num_turns}) at every response token")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    source = torch.where(active, positions, -1)
    ends = torch.full((mask.shape[0], num_turns), -1, dtype=torch.long, device=mask.device)
    return ends.scatter_reduce(1, _turn_of_token(mask, turn_index), source, "amax")


def turn_gae(
    turn_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    turn_index: torch.Tensor,
    gamma: float,
    lam: float,
    gamma_turn: float,
) -> Advantages:
    """Bi-level GAE: GAE across turns, then token-level GAE inside each turn seeded with its advantage.

    Turn level: with r_k the reward of turn k and V_k the critic value at its last response token,
    `A_k = r_k + gamma_turn*V_{k+1} - V_k + gamma_turn*lam*A_{k+1}`. Token level: the last token of turn k
    gets the reward `A_k + V_k` (so its advantage is A_k) and earlier tokens of the turn get 0;
    bootstrapping stops at turn ends. `turn_rewards` is `[B, K]`; `turn_index` is `[B, T]`.
    Turns without a response token are skipped, together with their reward.
    """
    ends = turn_end_positions(mask, turn_index, turn_rewards.shape[1])
    has_turn = ends >= 0
    values = values.to(torch.float32)
    turn_values = torch.where(has_turn, values.gather(1, ends.clamp(min=0)), 0.0)
    turn_level = gae(turn_rewards.to(torch.float32), turn_values, has_turn, gamma_turn, lam).advantages
    token_turn = _turn_of_token(mask, turn_index)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    is_end = mask.bool() & (positions == ends.gather(1, token_turn))
    seeded = torch.where(is_end, (turn_level + turn_values).gather(1, token_turn), 0.0)
    return gae(seeded, values, mask, gamma, lam, segment_end=is_end)


def _turn_of_token(mask: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """`turn_index` as a gather index: the token's turn at response tokens, 0 elsewhere."""
    return torch.where(mask.bool(), turn_index, 0).long()


def compute_advantages(
    estimator: str,
    mask: torch.Tensor,
    *,
    rewards: torch.Tensor | None = None,
    group_ids: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    turn_rewards: torch.Tensor | None = None,
    turn_index: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    gamma_turn: float = 0.95,
) -> Advantages:
    """Dispatch on `estimator` (the config's `algo.advantage_estimator`); return `[B, T]` advantages.

    Inputs: `rewards` `[B]` episode rewards (grpo, dr_grpo, gae, mc); `group_ids` `[B]` (grpo,
    dr_grpo); `values` `[B, T]` critic values (gae, turn_gae); `turn_rewards` `[B, K]` and
    `turn_index` `[B, T]` (turn_gae). A missing input is a ValueError naming it.
    """

    def need(value: torch.Tensor | None, name: str) -> torch.Tensor:
        if value is None:
            raise ValueError(f"advantage estimator {estimator!r} needs {name}")
        return value

    if estimator in ("grpo", "dr_grpo"):
        scores = group_advantages(
            need(rewards, "rewards"), need(group_ids, "group_ids"), scale_by_std=estimator == "grpo"
        )
        return Advantages(broadcast_to_tokens(scores, mask))
    if estimator == "mc":
        return Advantages(mc_returns(outcome_to_token_rewards(need(rewards, "rewards"), mask), mask, gamma))
    if estimator == "gae":
        token_rewards = outcome_to_token_rewards(need(rewards, "rewards"), mask)
        return gae(token_rewards, need(values, "values"), mask, gamma, lam)
    if estimator == "turn_gae":
        return turn_gae(
            need(turn_rewards, "turn_rewards"),
            need(values, "values"),
            mask,
            need(turn_index, "turn_index"),
            gamma,
            lam,
            gamma_turn,
        )
    raise ValueError(f"unknown advantage estimator {estimator!r} (known: grpo, dr_grpo, gae, mc, turn_gae)")
