"""SFT's step: one supervised optimizer step on the generated tokens of a batch of trajectories (solver
demonstrations, a run's kept episodes). It minimises their negative log-likelihood, token-mean over the
batch, through the optimizer step the PPO update takes (`PolicyTrainer.pack` and `optimize`: the same
packing, micro-batches, vision passes, clipping and schedule), without advantages, critic or reference."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

from vistarl.trainer.learner.logprobs import token_logprobs
from vistarl.trainer.learner.update import Micro, PolicyTrainer, Sums
from vistarl.trainer.modeling.image_features import ImageFeatures
from vistarl.trainer.rollout.trajectory import Trajectory

__all__ = ["imitate"]


def imitate(trainer: PolicyTrainer, trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """One SFT optimizer step of `trainer`'s actor on `trajectories`; a critic, if loaded, is left alone.
    Every rank calls it with the same list."""
    rows = sorted((t for t in trajectories if any(t.loss_mask)), key=lambda t: t.episode_id)
    if not rows:
        return {"train/skipped": 1.0}
    started = time.perf_counter()
    sums = Sums(["nll"])
    denominator = float(sum(sum(r.loss_mask) for r in rows))
    micros = trainer.pack(rows, list(range(len(rows))))
    backward = functools.partial(_nll_backward, trainer)
    images = any(r.images for r in rows)
    norm = trainer.optimize(micros, denominator, sums, backward, critic=False, images=images)
    return trainer.step_metrics(rows, sums, [norm], started)


def _nll_backward(
    trainer: PolicyTrainer, micro: Micro, features: ImageFeatures | None, denominator: float, sums: Sums
) -> None:
    """The negative log-likelihood of one micro-batch's generated tokens, backpropagated (a zero loss on a
    rank's empty bin, which still joins the collectives)."""
    with trainer.autocast():
        scores = token_logprobs(
            trainer.actor, micro.batch, 1.0, compiled=trainer.cfg.model.compile, image_features=features
        )
    mask = micro.batch.loss_mask
    nll = -(scores.logprobs * mask).sum()
    (nll / denominator * trainer.world).backward()
    if micro.rows:
        sums.add({"nll": nll.detach() / mask.sum()}, mask.sum())
