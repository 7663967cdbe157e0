"""Policy, KL, entropy, TIS and value losses against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from vistarl.trainer.config import AlgoConfig
from vistarl.trainer.learner.logprobs import chunked_logprobs
from vistarl.trainer.learner.losses import (
    actor_loss,
    aggregate_loss,
    kl_penalty,
    logprob_abs_diff,
    masked_mean,
    ppo_policy_loss,
    tis_weights,
    value_loss,
)


def _logp_pair(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """New and old logprobs, `[1, N]`, whose ratios are `ratios`; the new ones require grad."""
    old = torch.full((1, len(ratios)), -1.0)
    new = (old + torch.tensor([[math.log(r) for r in ratios]])).requires_grad_()
    return new, old


def _close(actual: torch.Tensor, expected: float) -> None:
    value = float(actual.detach())
    assert math.isclose(value, expected, rel_tol=1e-5, abs_tol=1e-6), (value, expected)


def test_masked_mean_ignores_masked_entries_even_when_not_finite() -> None:
    values = torch.tensor([[1.0, float("inf")], [3.0, float("nan")]])
    mask = torch.tensor([[1, 0], [1, 0]])
    _close(masked_mean(values, mask), 2.0)
    assert masked_mean(values, mask, dim=-1).tolist() == [1.0, 3.0]
    _close(masked_mean(values, torch.zeros(2, 2)), 0.0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 3 + 4) / 4),
        ("seq-mean-token-sum", ((1 + 2 + 3) + 4) / 2),
        ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),
    ],
)
def test_aggregation_modes(mode: str, expected: float) -> None:
    loss_mat = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])  # the empty third row does not count
    _close(aggregate_loss(loss_mat, mask, mode), expected)  # type: ignore[arg-type]


def test_aggregation_denominator_lets_micro_batches_add_up() -> None:
    loss_mat = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    whole = aggregate_loss(loss_mat, mask, "token-mean")
    parts = sum(
        aggregate_loss(loss_mat[i : i + 1], mask[i : i + 1], "token-mean", denominator=3) for i in (0, 1)
    )
    _close(parts, float(whole))
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate_loss(loss_mat, mask, "sum")  # type: ignore[arg-type]


def test_kl_estimators() -> None:
    logp = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-1.5, -1.0])
    log_r = [0.5, -1.0]
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx(log_r)
    assert kl_penalty(logp, ref, "k2").tolist() == pytest.approx([0.5 * x * x for x in log_r])
    assert kl_penalty(logp, ref, "k3").tolist() == pytest.approx([math.exp(-x) - 1 + x for x in log_r])


def test_k3_is_clamped_to_ten() -> None:
    far = kl_penalty(torch.tensor([-30.0, 0.0]), torch.tensor([0.0, 0.0]), "k3")
    assert far.tolist() == [10.0, 0.0]


def test_clip_uses_eps_low_below_and_eps_high_above() -> None:
    ratios = [1.25, 1.5, 0.7, 0.9]
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    logp, old = _logp_pair(ratios)
    mask = torch.ones(1, 4)
    loss, metrics = ppo_policy_loss(logp, old, advantages, mask, eps_clip=0.2, eps_clip_high=0.28)
    # 1.25 < 1 + 0.28 stays unclipped; 1.5 clips to 1.28; 0.7 clips to 0.8 (A < 0); 0.9 stays.
    per_token = [-1.25, -1.28, 0.8, 0.9]
    _close(loss, sum(per_token) / 4)
    _close(metrics["pg_clip_frac"], 2 / 4)
    loss.backward()
    assert logp.grad is not None
    expected_grad = [-1.25 / 4, 0.0, 0.0, 0.9 / 4]  # d(-A * ratio)/dlogp = -A * ratio; clipped tokens get 0
    assert logp.grad[0].tolist() == pytest.approx(expected_grad, abs=1e-6)


def test_symmetric_clip_would_clip_what_clip_higher_keeps() -> None:
    logp, old = _logp_pair([1.25])
    advantages, mask = torch.ones(1, 1), torch.ones(1, 1)
    _, symmetric = ppo_policy_loss(logp, old, advantages, mask, eps_clip=0.2, eps_clip_high=0.2)
    _, higher = ppo_policy_loss(logp, old, advantages, mask, eps_clip=0.2, eps_clip_high=0.28)
    assert float(symmetric["pg_clip_frac"]) == 1.0
    assert float(higher["pg_clip_frac"]) == 0.0


def test_dual_clip_caps_only_negative_advantages() -> None:
    logp, old = _logp_pair([5.0, 5.0, 2.0])
    advantages = torch.tensor([[-1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    kwargs = {"eps_clip": 0.2, "eps_clip_high": 0.28}
    plain, _ = ppo_policy_loss(logp, old, advantages, mask, **kwargs)
    dual, metrics = ppo_policy_loss(logp, old, advantages, mask, dual_clip_c=3.0, **kwargs)
    _close(plain, (5.0 - 1.28 + 2.0) / 3)
    _close(dual, (3.0 - 1.28 + 2.0) / 3)  # only the A < 0 token with ratio above c = 3 is capped
    _close(metrics["dual_clip_frac"], 1 / 3)


def test_tis_weights_are_capped_and_detached() -> None:
    old = torch.tensor([[math.log(3.0), math.log(0.5), 0.0]], requires_grad=True)
    rollout = torch.zeros(1, 3)
    weights = tis_weights(old, rollout, cap=2.0)
    assert weights[0].tolist() == pytest.approx([2.0, 0.5, 1.0])
    assert not weights.requires_grad


def test_logprob_abs_diff_counts_response_tokens_only() -> None:
    old = torch.tensor([[-1.0, -2.0, -3.0]])
    rollout = torch.tensor([[-1.1, -1.8, 0.0]])
    _close(logprob_abs_diff(old, rollout, torch.tensor([[1, 1, 0]])), (0.1 + 0.2) / 2)


def test_chunk_entropy_is_the_softmax_entropy() -> None:
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    targets = torch.tensor([0, 0])
    scores = chunked_logprobs(
        torch.nn.Identity(), logits, targets, temperature=1.0, chunk_size=1, with_entropy=True
    )
    assert scores.entropy is not None
    assert scores.entropy.tolist() == pytest.approx([math.log(4), 0.0], abs=1e-6)
    assert scores.logprobs.tolist() == pytest.approx([-math.log(4), 0.0], abs=1e-6)


def test_actor_loss_combines_tis_kl_and_entropy() -> None:
    algo = AlgoConfig(
        eps_clip=0.2, eps_clip_high=0.28, kl_loss_coef=0.1, kl_loss_type="k1", entropy_coef=0.01, tis_cap=2.0
    )
    logp, old = _logp_pair([1.1, 0.9])
    advantages = torch.tensor([[1.0, -2.0]])
    mask = torch.ones(1, 2)
    rollout = old - torch.tensor([[math.log(3.0), math.log(0.5)]])  # TIS weights min(3, 2) = 2 and 0.5
    ref = old.clone()  # so log r = log ratio
    entropy = torch.tensor([[1.0, 3.0]])
    loss, metrics = actor_loss(
        logp, old, advantages, mask, algo, ref_logp=ref, entropy=entropy, rollout_logp=rollout
    )

    pg = (2.0 * (-1.0 * 1.1) + 0.5 * (2.0 * 0.9)) / 2
    kl = (math.log(1.1) + math.log(0.9)) / 2
    _close(metrics["pg_loss"], pg)
    _close(metrics["kl_ref"], kl)
    _close(metrics["entropy"], 2.0)
    _close(metrics["tis_weight_mean"], 1.25)
    _close(metrics["logprob_abs_diff"], (math.log(3.0) + math.log(2.0)) / 2)
    _close(loss, pg + 0.1 * kl - 0.01 * 2.0)
    assert all(not value.requires_grad for value in metrics.values())
    assert loss.requires_grad


def test_actor_loss_without_kl_only_measures_it() -> None:
    logp, old = _logp_pair([1.0])
    advantages, mask = torch.ones(1, 1), torch.ones(1, 1)
    ref = old - 0.5
    loss, metrics = actor_loss(logp, old, advantages, mask, AlgoConfig(tis_cap=None), ref_logp=ref)
    _close(metrics["kl_ref"], math.exp(-0.5) - 1 + 0.5)
    _close(loss, -1.0)
    assert "tis_weight_mean" not in metrics and "logprob_abs_diff" not in metrics


def test_actor_loss_requires_the_inputs_its_config_uses() -> None:
    logp, old = _logp_pair([1.0])
    ones = torch.ones(1, 1)
    with pytest.raises(ValueError, match="ref_logp"):
        actor_loss(logp, old, ones, ones, AlgoConfig(kl_loss_coef=0.1))
    with pytest.raises(ValueError, match="entropy"):
        actor_loss(logp, old, ones, ones, AlgoConfig(entropy_coef=0.01))


def test_value_loss_is_clipped_around_old_values() -> None:
    values = torch.tensor([[1.0, 0.0, 0.6]], requires_grad=True)
    old_values = torch.tensor([[0.5, 0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.0, 2.0]])
    loss, metrics = value_loss(values, old_values, returns, torch.ones(1, 3), clip=0.2)
    # V_clip = 0.7, 0.3, 0.6; per token 0.5 * max((V - R)^2, (V_clip - R)^2).
    per_token = [0.5 * max(1.0, 1.3**2), 0.5 * max(0.0, 0.3**2), 0.5 * 1.4**2]
    _close(loss, sum(per_token) / 3)
    _close(metrics["vf_clip_frac"], 2 / 3)
    loss.backward()
    assert values.grad is not None
    assert values.grad[0].tolist() == pytest.approx([0.0, 0.0, (0.6 - 2.0) / 3])
