"""Policy and value losses: PPO clip with clip-higher and dual clip, KL to the reference, entropy, TIS.

Everything works on padded `[B, T]` tensors with a response `mask` (1 on generated tokens). Each
loss returns a scalar plus a metrics dict of detached 0-dim tensors, so the trainer can reduce
them across ranks in one collective before logging.
"""

from __future__ import annotations

import torch

from vistarl.trainer.config import AlgoConfig, KLType, LossAggMode

Metrics = dict[str, torch.Tensor]

LOG_RATIO_LIMIT = 20.0
K3_LIMIT = 10.0


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of `values` where `mask` is 1; masked-out entries never leak, even when inf or NaN."""
    kept = torch.where(mask.bool(), values, 0.0)
    return kept.sum() if dim is None else kept.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 where nothing is selected."""
    count = mask.to(values.dtype).sum() if dim is None else mask.to(values.dtype).sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def aggregate_loss(
    loss_mat: torch.Tensor, mask: torch.Tensor, mode: LossAggMode, denominator: float | None = None
) -> torch.Tensor:
    """Reduce a per-token `[B, T]` loss to a scalar.

    `token-mean` averages over all response tokens; `seq-mean-token-sum` (Dr.GRPO) averages the
    per-sequence sums; `seq-mean-token-mean` (GRPO) averages the per-sequence means. Rows without a
    response token do not count. `denominator` replaces the local token or sequence count, e.g. with
    the mini-batch's, so that the losses of its micro-batches add up to the mini-batch loss.
    """
    has_tokens = mask.bool().any(dim=-1)
    if mode == "token-mean":
        total, count = masked_sum(loss_mat, mask), mask.to(loss_mat.dtype).sum()
    elif mode == "seq-mean-token-sum":
        total, count = masked_sum(loss_mat, mask, dim=-1).sum(), has_tokens.sum()
    elif mode == "seq-mean-token-mean":
        total, count = masked_mean(loss_mat, mask, dim=-1).sum(), has_tokens.sum()
    else:
        raise ValueError(f"unknown loss_agg_mode {mode!r}")
    return total / (denominator if denominator is not None else count.clamp(min=1))


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLType) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled tokens, with `log r = logp - ref_logp`.

    k1 = log r; k2 = (log r)^2 / 2; k3 = exp(-log r) - 1 + log r, clamped to [-10, 10] (low variance,
    never negative).
    """
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        clamped = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        return (torch.exp(-clamped) - 1 + clamped).clamp(-K3_LIMIT, K3_LIMIT)
    raise ValueError(f"unknown kl_loss_type {kind!r}")


def tis_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling: `min(pi_trainer_old / pi_rollout, cap)` per token, detached."""
    return torch.exp(old_logp - rollout_logp).clamp(max=cap).detach()


def logprob_abs_diff(old_logp: torch.Tensor, rollout_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean |trainer logprob - engine logprob| over response tokens: the rollout/trainer mismatch."""
    return masked_mean((old_logp - rollout_logp).abs(), mask).detach()


def ppo_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float,
    dual_clip_c: float | None = None,
    loss_agg_mode: LossAggMode = "token-mean",
    token_weights: torch.Tensor | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """PPO clipped surrogate with ratio bounds `[1 - eps_clip, 1 + eps_clip_high]`.

    With `dual_clip_c`, the loss of a token with negative advantage is capped at `-A * c`, so a huge
    ratio cannot blow it up. `token_weights` (e.g. TIS weights) scale each token's loss.
    """
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_clip, 1 + eps_clip_high)
    loss_mat = torch.maximum(unclipped, clipped)
    metrics: Metrics = {
        "pg_clip_frac": masked_mean((clipped > unclipped).float(), mask),
        "ppo_kl": masked_mean(-log_ratio, mask),
    }
    if dual_clip_c is not None:
        cap = -advantages * dual_clip_c
        dual = (advantages < 0) & (loss_mat > cap)
        loss_mat = torch.where(dual, cap, loss_mat)
        metrics["dual_clip_frac"] = masked_mean(dual.float(), mask)
    if token_weights is not None:
        loss_mat = loss_mat * token_weights
    loss = aggregate_loss(loss_mat, mask, loss_agg_mode, denominator)
    metrics["pg_loss"] = loss
    return loss, _detached(metrics)


def actor_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    algo: AlgoConfig,
    *,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    rollout_logp: torch.Tensor | None = None,
    denominator: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """The actor's full loss under `algo`: PPO surrogate (TIS-weighted) + KL to the reference - entropy.

    `rollout_logp` (the engine's logprobs) enables the `logprob_abs_diff` metric and, when
    `algo.tis_cap` is set, TIS weights. `ref_logp` is required when `algo.use_kl`, and `entropy`
    when `algo.entropy_coef > 0`; when given otherwise they are only measured.
    """
    metrics: Metrics = {}
    weights = None
    if rollout_logp is not None:
        metrics["logprob_abs_diff"] = logprob_abs_diff(old_logp, rollout_logp, mask)
        if algo.tis_cap is not None:
            weights = tis_weights(old_logp, rollout_logp, algo.tis_cap)
            metrics["tis_weight_mean"] = masked_mean(weights, mask)
    loss, pg_metrics = ppo_policy_loss(
        logp,
        old_logp,
        advantages,
        mask,
        eps_clip=algo.eps_clip,
        eps_clip_high=algo.eps_clip_high,
        dual_clip_c=algo.dual_clip_c,
        loss_agg_mode=algo.loss_agg_mode,
        token_weights=weights,
        denominator=denominator,
    )
    metrics.update(pg_metrics)
    if algo.use_kl and ref_logp is None:
        raise ValueError("algo.kl_loss_coef > 0 needs ref_logp")
    if ref_logp is not None:
        kl_mat = kl_penalty(logp, ref_logp, algo.kl_loss_type)
        metrics["kl_ref"] = masked_mean(kl_mat, mask)
        if algo.use_kl:
            loss = loss + algo.kl_loss_coef * aggregate_loss(kl_mat, mask, algo.loss_agg_mode, denominator)
    if algo.entropy_coef > 0 and entropy is None:
        raise ValueError("algo.entropy_coef > 0 needs entropy")
    if entropy is not None:
        metrics["entropy"] = masked_mean(entropy, mask)
        if algo.entropy_coef > 0:
            loss = loss - algo.entropy_coef * aggregate_loss(entropy, mask, algo.loss_agg_mode, denominator)
    metrics["loss"] = loss
    return loss, _detached(metrics)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float,
    loss_agg_mode: LossAggMode = "token-mean",
    denominator: float | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Clipped critic loss: `0.5 * max((V - R)^2, (V_clip - R)^2)`, V_clip within `clip` of the old value."""
    clipped_values = old_values + (values - old_values).clamp(-clip, clip)
    unclipped_sq = (values - returns).square()
    clipped_sq = (clipped_values - returns).square()
    loss_mat = 0.5 * torch.maximum(unclipped_sq, clipped_sq)
    loss = aggregate_loss(loss_mat, mask, loss_agg_mode, denominator)
    metrics: Metrics = {
        "vf_loss": loss,
        "vf_clip_frac": masked_mean((clipped_sq > unclipped_sq).float(), mask),
        "value_mean": masked_mean(values, mask),
    }
    return loss, _detached(metrics)


def _detached(metrics: Metrics) -> Metrics:
    """The metrics cut from the autograd graph."""
    return {name: value.detach() for name, value in metrics.items()}
