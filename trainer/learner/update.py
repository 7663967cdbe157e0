"""One PPO-family update on a step's trajectories, each rank on its share: recompute, advantages, epochs.

`PolicyTrainer` holds a rank's actor (and reference, critic) with their AdamW optimizers, and the
optimizer step that this update and SFT's imitation step (`imitation.py`) share: `pack`, `optimize`,
`step_metrics`. `update`
takes a step's trajectories (the same list on every rank), keeps the trainable ones (`Trajectory.trainable`:
COMPLETED or TRUNCATED with at least one generated token) in episode-id order, takes the sampling they were
played with from them (`Trajectory.behaviour`, one for all: episodes sampled otherwise are refused, as are
stale ones when the update's own forward pass gives the old logprobs), and

1. shuffles them (reproducibly per step) into `samples_per_step / mini_batch_size` mini-batches,
   each split into micro-batches of at most `train.micro_batch_tokens` tokens balanced across
   ranks, and packs this rank's micro-batches;
2. recomputes old logprobs (and reference logprobs, critic values) without gradients, and the
   mean |trainer - rollout| logprob mismatch; where the update is exactly on-policy
   (`TrainConfig.old_logprobs_from_update`), the old logprobs are instead the update's own forward pass,
   detached, and no actor recompute runs (docs/algorithms.md);
3. computes advantages (`compute_advantages`; group baselines use every rank's rewards, value-based
   estimators only this rank's rows, which are the ones it trains on);
4. runs `algo.ppo_epochs` passes: one optimizer step per mini-batch, accumulating its micro-batches
   (losses normalised by the mini-batch's token or sequence count, times the world size because
   FSDP averages gradients over ranks), clipping to `optim.grad_clip`: the actor's micro-batches and
   step first, then the critic's, so that one model's gradients and gathered weights are on the GPU
   at a time (docs/fsdp.md, "Memory").

The vision tower runs once per `train.vision_pass_micro_batches` micro-batches (`VisionPasses`), in
the recompute and in the update. Forward passes compute in `model.compute_dtype` over float32 master
weights (bfloat16 autocast on one GPU; FSDP's mixed precision when sharded), gradients stay float32,
and AdamW's moments are float32 or bfloat16 (`train.optimizer_state_dtype`, `optimizers.py`).

Metrics come back reduced over ranks, token-weighted.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from vistarl.trainer.config import AlgoConfig, TrainConfig
from vistarl.trainer.learner.advantages import compute_advantages
from vistarl.trainer.learner.checkpoint import Schedule
from vistarl.trainer.learner.entropy_control import EntropyControl
from vistarl.trainer.learner.fsdp import free_gathered, is_distributed, set_last_micro_batch, shard_model
from vistarl.trainer.learner.logprobs import TokenScores, token_logprobs, token_values
from vistarl.trainer.learner.losses import actor_loss, masked_sum, value_loss
from vistarl.trainer.learner.models import ActorModel, CriticModel, Models
from vistarl.trainer.learner.optimizers import Params, build_optimizer
from vistarl.trainer.learner.packing import (
    PackedBatch,
    SequenceSample,
    pack_sequences,
    plan_micro_batches,
)
from vistarl.trainer.learner.vision_passes import VisionPasses
from vistarl.trainer.modeling.device import host_to_device
from vistarl.trainer.modeling.image_features import ImageFeatures
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.trajectory import Behaviour, Trajectory
from vistarl.trainer.seeds import generator, permutation

__all__ = ["Backward", "Micro", "PolicyTrainer", "Sums", "warmup"]


@dataclass
class Micro:
    """One packed micro-batch of this rank and its per-token tensors (`[T]`, aligned with the row);
    `share`: its part of its mini-batch's loss denominator (its generated tokens, or its sequences)."""

    rows: list[int]
    batch: PackedBatch
    share: float
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    values: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None


Backward = Callable[["Micro", "ImageFeatures | None", float, "Sums"], None]
"""A loss over one micro-batch, backpropagated: (micro-batch, image features, denominator, metric sums)."""


@dataclass
class Sums:
    """Token-weighted sums of a fixed list of metrics, reduced over ranks in one collective.

    The sums stay on the device until `reduced`, so adding a micro-batch's metrics never waits for the
    GPU. The list is the same on every rank (a rank whose micro-batches are all empty still takes part).
    """

    names: list[str]
    totals: dict[str, torch.Tensor] = field(default_factory=dict)
    weights: dict[str, torch.Tensor] = field(default_factory=dict)

    def add(self, metrics: dict[str, torch.Tensor], weight: torch.Tensor) -> None:
        weight = weight.detach().double()
        for name, value in metrics.items():
            value = torch.as_tensor(value, device=weight.device).detach().double()
            self.totals[name] = self.totals.get(name, 0.0) + value * weight
            self.weights[name] = self.weights.get(name, 0.0) + weight

    def add_losses(self, losses: dict[str, torch.Tensor], denominator: float, share: float) -> None:
        """Add losses that one micro-batch holding `share` of its mini-batch's `denominator` computed over
        that whole denominator: as the micro-batch's own mean, weighted by its share, so the reduced value
        is the mini-batch's loss however it was split into micro-batches and ranks."""
        for name, loss in losses.items():
            self.add({name: loss * (denominator / share)}, loss.new_full((), share))

    def reduced(self, device: torch.device) -> dict[str, float]:
        """`train/<name>`: each metric's weighted mean over every rank's micro-batches."""
        names = self.names
        zero = torch.zeros((), dtype=torch.float64, device=device)
        packed = torch.stack(
            [self.totals.get(n, zero).to(device) for n in names]
            + [self.weights.get(n, zero).to(device) for n in names]
        )
        if is_distributed():
            dist.all_reduce(packed)
        values = packed.tolist()
        return {f"train/{n}": values[i] / max(values[len(names) + i], 1e-12) for i, n in enumerate(names)}


def metric_names(cfg: TrainConfig, reference: bool, critic: bool) -> list[str]:
    """The metrics `actor_loss` (and `value_loss`) report under this config, found by running them once."""
    one = torch.zeros(1, 1)
    mask = torch.ones(1, 1)
    _, metrics = actor_loss(
        one, one, one, mask, cfg.algo, ref_logp=one if reference else None, entropy=one, rollout_logp=one
    )
    names = {"logprob_abs_diff", *metrics} - {"loss"}
    if critic:
        _, values = value_loss(one, one, one, mask, clip=cfg.algo.value_clip)
        names |= {*values, "critic_grad_norm"}
    return sorted(names)


class PolicyTrainer:
    """The models and optimizers of one rank, and `update`, the PPO-family step on a batch of trajectories."""

    def __init__(
        self, cfg: TrainConfig, models: Models, processor: VLProcessor, device: torch.device
    ) -> None:
        self.cfg = cfg
        self.processor = processor
        self.device = device
        self.rank = dist.get_rank() if is_distributed() else 0
        self.world = dist.get_world_size() if is_distributed() else 1
        self.compute_dtype = compute_dtype(cfg.model.compute_dtype, device)
        trained: dict[str, Any] = {
            "compute_dtype": self.compute_dtype,
            "gradient_checkpointing": cfg.model.gradient_checkpointing,
            "uncheckpointed_layers": cfg.model.uncheckpointed_layers,
            "checkpoint_scope": cfg.model.checkpoint_scope,
            "compiled": cfg.model.compile,
            "keep_gathered": self.world == 1,  # one rank: a shard is the whole model, gathering is pure cost
        }
        self.actor = shard_model(models.actor, device, vision_frozen=cfg.model.freeze_vision, **trained)
        self.reference = (
            shard_model(
                models.reference, device, compiled=cfg.model.compile, compute_dtype=self.compute_dtype
            )
            if models.reference is not None
            else None
        )
        self.critic = (
            shard_model(models.critic, device, offload=cfg.train.optimizer_offload == "critic", **trained)
            if models.critic is not None
            else None
        )
        self.actor_optimizer = self._optimizer(_trainable(self.actor.parameters()), cfg.optim.lr)
        self.critic_optimizer: torch.optim.Optimizer | None = None
        self.optimizers: dict[str, torch.optim.Optimizer] = {"actor": self.actor_optimizer}
        if self.critic is not None:
            self.critic_optimizer = self._optimizer(_trainable(self.critic.parameters()), cfg.optim.critic_lr)
            self.optimizers["critic"] = self.critic_optimizer
        schedule = warmup(cfg.optim.warmup_steps)
        self.lr_schedulers = {name: LambdaLR(opt, schedule) for name, opt in self.optimizers.items()}
        self.entropy_control = EntropyControl(cfg.algo)
        self.metric_names = metric_names(cfg, self.reference is not None, self.critic is not None)
        self.old_from_update = cfg.old_logprobs_from_update

    def _optimizer(self, params: Params, lr: float) -> torch.optim.Optimizer:
        """AdamW over `params` (parameters, or named groups of them), its state in
        `train.optimizer_state_dtype`."""
        train = self.cfg.train
        return build_optimizer(params, lr, self.cfg.optim, train.optimizer_state_dtype, train.seed)

    def regroup_actor(self, groups: Mapping[str, Sequence[torch.nn.Parameter]]) -> None:
        """Rebuild the actor's AdamW, before its first step, with one parameter group per entry of `groups`
        (its key as the group's `name`), so that a `LambdaLR` can give each group its own rate."""
        chosen = [{"params": _trainable(params), "name": name} for name, params in groups.items()]
        optimizer = self._optimizer(chosen, self.cfg.optim.lr)
        self.actor_optimizer = self.optimizers["actor"] = optimizer
        self.lr_schedulers["actor"] = LambdaLR(optimizer, warmup(self.cfg.optim.warmup_steps))

    @property
    def schedulers(self) -> dict[str, Schedule]:
        """What a checkpoint saves and a resume restores besides the weights and optimizers: the learning
        rates' schedules, and the entropy bonus's weight when it adapts."""
        adaptive = self.cfg.algo.entropy_target is not None
        return {**self.lr_schedulers, **({"entropy": self.entropy_control} if adaptive else {})}

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Forward passes in bfloat16 over the float32 weights where `model.compute_dtype` asks for it and
        FSDP's mixed precision does not already give it."""
        if self.compute_dtype != torch.bfloat16 or (is_distributed() and self.device.type == "cuda"):
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    def update(
        self, step: int, trajectories: Sequence[Trajectory], packed: Callable[[], object] | None = None
    ) -> dict[str, float]:
        """The update of the module docstring; every rank calls it with the same trajectories, and
        `packed` once they are packed (what may then compete for the host without delaying the update).

        They are taken in episode-id order, not arrival order, so that a step is reproducible.
        """
        rows = sorted((t for t in trajectories if t.trainable), key=lambda t: t.episode_id)
        if not rows:
            return {"train/skipped": 1.0}
        temperature = _played_with(rows, on_policy=self.old_from_update).temperature
        minis = self._mini_batches(step, len(rows))
        micros = [self.pack(rows, mini) for mini in minis]
        if packed is not None:
            packed()
        every = [m for mini in micros for m in mini]
        sums = Sums(self.metric_names)
        started, recompute_s = time.perf_counter(), 0.0
        if not self.old_from_update:
            self._recompute(every, sums, temperature)
            recompute_s = self._elapsed(started)
        started, reference_s = time.perf_counter(), 0.0
        if self.reference is not None or self.critic is not None:
            self._reference_and_values(every, temperature)
            reference_s = self._elapsed(started)
        started = time.perf_counter()
        self._advantages(rows, every)
        # the entropy bonus's weight is the step's, one for all its micro-batches and epochs
        algo = self.cfg.algo.model_copy(update={"entropy_coef": self.entropy_control.coef})
        actor_backward = functools.partial(self._actor_backward, algo=algo, temperature=temperature)
        grad_norms: list[float] = []
        epochs = generator(self.cfg.train.seed, step)
        for _ in range(self.cfg.algo.ppo_epochs):
            for index in torch.randperm(len(minis), generator=epochs).tolist():
                mini = minis[index]
                denominator, images = self._denominator(rows, mini), any(rows[i].images for i in mini)
                grad_norms.append(
                    self.optimize(micros[index], denominator, sums, actor_backward, images=images)
                )
        metrics = self.step_metrics(rows, sums, grad_norms, started)
        self.entropy_control.observe(metrics["train/entropy"])
        return {
            **metrics,
            "train/entropy_coef": algo.entropy_coef,
            "time/recompute": recompute_s,
            "time/reference": reference_s,
            "train/zero_variance_groups": zero_variance_share(rows),
        }

    def _elapsed(self, started: float) -> float:
        """Seconds since `started`, once the device has finished the work queued since (one sync a part)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - started

    def step_metrics(
        self, rows: list[Trajectory], sums: Sums, grad_norms: list[float], started: float
    ) -> dict[str, float]:
        """The loss metrics reduced over ranks, and the step's gradient norm, learning rate and sizes."""
        return {
            **sums.reduced(self.device),
            "train/grad_norm": sum(grad_norms) / len(grad_norms),
            "train/lr": self.actor_optimizer.param_groups[0]["lr"],
            "train/trajectories": float(len(rows)),
            "train/tokens": float(sum(len(r.train_ids) for r in rows)),
            "time/update": time.perf_counter() - started,
        }

    def _mini_batches(self, step: int, count: int) -> list[list[int]]:
        """Trajectory indices, shuffled per step, in `samples_per_step / mini_batch_size` parts."""
        parts = self.cfg.rollout.samples_per_step // self.cfg.mini_batch_size
        order = permutation(count, self.cfg.train.seed, step)
        return [chunk for chunk in (order[i::parts] for i in range(parts)) if chunk]

    def pack(self, rows: list[Trajectory], mini: list[int]) -> list[Micro]:
        """This rank's micro-batches of one mini-batch, balanced by token budget across ranks and packed."""
        plan = plan_micro_batches(
            [len(rows[i].train_ids) for i in mini], self.world, self.cfg.train.micro_batch_tokens
        )
        micros = []
        for bin_ in plan[self.rank]:
            members = [mini[j] for j in bin_]
            if not members and self.world == 1:
                continue
            batch = pack_sequences(
                [_sequence(rows[i]) for i in members],
                self.processor,
                self.actor.model.get_rope_index,
                dummy_image=self.world > 1,
                pin_memory=self.device.type == "cuda",
            )
            micros.append(Micro(members, batch.to(self.device), self._denominator(rows, members)))
        return micros

    @torch.no_grad()
    def _recompute(self, micros: list[Micro], sums: Sums, temperature: float) -> None:
        """Old logprobs of every micro-batch (at the sampler's `temperature`), and the rollout mismatch
        metric."""
        group = self.cfg.train.vision_pass_micro_batches
        actor = VisionPasses(self.actor, [micro.batch for micro in micros], group)
        for i, micro in enumerate(micros):
            with self.autocast():
                micro.old_logp = self._logprobs(self.actor, micro, actor.features(i), temperature).logprobs
            _add_mismatch(sums, micro.old_logp, micro.batch)
            actor.backward(i)  # frees a finished group's features (nothing to backpropagate)

    @torch.no_grad()
    def _reference_and_values(self, micros: list[Micro], temperature: float) -> None:
        """Reference logprobs (at the sampler's `temperature`) and old values of every micro-batch, where a
        reference or critic is loaded."""
        batches = [micro.batch for micro in micros]
        group = self.cfg.train.vision_pass_micro_batches
        if self.reference is not None:
            reference = VisionPasses(self.reference, batches, group)
            for i, micro in enumerate(micros):
                with self.autocast():
                    micro.ref_logp = self._logprobs(
                        self.reference, micro, reference.features(i), temperature
                    ).logprobs
                reference.backward(i)
        if self.critic is not None:
            critic = VisionPasses(self.critic, batches, group)
            for i, micro in enumerate(micros):
                with self.autocast():
                    micro.values = token_values(self.critic, micro.batch, image_features=critic.features(i))
                critic.backward(i)
            free_gathered(self.critic)  # the actor trains first: its weights alone are gathered then

    def _logprobs(
        self,
        model: ActorModel,
        micro: Micro,
        features: ImageFeatures | None,
        temperature: float,
        *,
        with_entropy: bool = False,
    ) -> TokenScores:
        """`model`'s logprobs (and entropies) of a micro-batch's generated tokens at the sampler's
        `temperature`."""
        return token_logprobs(
            model,
            micro.batch,
            temperature,
            with_entropy=with_entropy,
            compiled=self.cfg.model.compile,
            image_features=features,
        )

    def _advantages(self, rows: list[Trajectory], micros: list[Micro]) -> None:
        """Advantages over all usable trajectories (values known only for this rank's rows, which are
        the only ones it uses), into each micro-batch with its value targets, on the device."""
        lengths = [len(r.train_ids) for r in rows]
        width = max(lengths)
        mask = _padded([r.loss_mask for r in rows], width)
        values = torch.zeros_like(mask)
        for micro in micros:
            if micro.values is not None:
                for b, piece in zip(micro.rows, _split(micro.values.cpu(), micro.batch), strict=True):
                    values[b, : lengths[b]] = piece
        turns = max(max(len(r.turn_rewards), max(r.turn_index) + 1) for r in rows)
        groups = {group: g for g, group in enumerate(dict.fromkeys(r.group_id for r in rows))}
        algo = self.cfg.algo
        result = compute_advantages(
            algo.advantage_estimator,
            mask,
            rewards=torch.tensor([r.episode_reward for r in rows]),
            group_ids=torch.tensor([groups[r.group_id] for r in rows]),
            values=values if algo.needs_critic else None,
            turn_rewards=_padded([r.turn_rewards for r in rows], turns),
            turn_index=_padded([r.turn_index for r in rows], width).long(),
            gamma=algo.gamma,
            lam=algo.lam,
            gamma_turn=algo.gamma_turn,
        )
        for micro in micros:
            micro.advantages = host_to_device(_row_tensor(result.advantages, micro, lengths), self.device)
            if result.returns is not None:
                micro.returns = host_to_device(_row_tensor(result.returns, micro, lengths), self.device)

    def _denominator(self, rows: list[Trajectory], mini: list[int]) -> float:
        """What a mini-batch's summed losses are divided by: its generated tokens, or its sequences (a
        micro-batch's share of it, for its members)."""
        if self.cfg.algo.loss_agg_mode == "token-mean":
            return float(sum(sum(rows[i].loss_mask) for i in mini))
        return float(len(mini))

    def optimize(
        self,
        micros: list[Micro],
        denominator: float,
        sums: Sums,
        actor_backward: Backward,
        critic: bool = True,
        images: bool = True,
    ) -> float:
        """One optimizer step of the actor, then one of the critic (when it trains): each accumulates the
        micro-batches' losses, clips, steps and advances its learning-rate schedule; returns the actor's
        gradient norm. The actor's gradients are freed before the critic's pass and the critic's after its
        step, so the two models' gradients and gathered weights never share the GPU (docs/fsdp.md,
        "Memory"). Without `images` in the mini-batch (on any rank), the vision towers are left out of the
        step (`_without_vision_gradients`)."""
        self.actor_optimizer.zero_grad(set_to_none=True)
        norm = self._step_model(self.actor, "actor", micros, actor_backward, denominator, sums, images)
        if critic and self.critic is not None and self.critic_optimizer is not None:
            self.actor_optimizer.zero_grad(set_to_none=True)
            critic_norm = self._step_model(
                self.critic, "critic", micros, self._critic_backward, denominator, sums, images
            )
            self.critic_optimizer.zero_grad(set_to_none=True)
            sums.add({"critic_grad_norm": torch.tensor(critic_norm)}, torch.ones(()))
        return norm

    def _step_model(
        self,
        model: ActorModel | CriticModel,
        name: str,
        micros: list[Micro],
        backward: Backward,
        denominator: float,
        sums: Sums,
        images: bool,
    ) -> float:
        """`model`'s pass over the micro-batches (`backward` on each), then its clip, optimizer step and
        schedule step; returns its gradient norm before clipping."""
        group = self.cfg.train.vision_pass_micro_batches
        vision = VisionPasses(model, [micro.batch for micro in micros], group)
        for i, micro in enumerate(micros):
            set_last_micro_batch(model, i == len(micros) - 1)
            with self.autocast():
                features = vision.features(i)
            backward(micro, features, denominator, sums)
            vision.backward(i)
        if not images:
            _without_vision_gradients(model)
        norm = clip_gradients(model.parameters(), self.cfg.optim.grad_clip)
        self.optimizers[name].step()
        self.lr_schedulers[name].step()
        return norm

    def _actor_backward(
        self,
        micro: Micro,
        features: ImageFeatures | None,
        denominator: float,
        sums: Sums,
        *,
        algo: AlgoConfig,
        temperature: float,
    ) -> None:
        """The actor's loss under this step's `algo` on one micro-batch at the sampler's `temperature`,
        backpropagated (a zero loss on a rank's empty bin, whose forward and backward still have to join the
        other ranks' collectives)."""
        batch = micro.batch
        with self.autocast():
            scores = self._logprobs(self.actor, micro, features, temperature, with_entropy=True)
        if not micro.rows:
            (scores.logprobs.sum() * 0.0).backward()
            return
        if self.old_from_update:  # on-policy: this forward is the policy that sampled (ratio exactly 1)
            micro.old_logp = scores.logprobs.detach()
            _add_mismatch(sums, micro.old_logp, batch)
        pad = batch.to_padded
        mask = pad(batch.loss_mask)
        assert micro.old_logp is not None and micro.advantages is not None and scores.entropy is not None
        loss, metrics = actor_loss(
            pad(scores.logprobs),
            pad(micro.old_logp),
            pad(micro.advantages),
            mask,
            algo,
            ref_logp=pad(micro.ref_logp) if micro.ref_logp is not None else None,
            entropy=pad(scores.entropy),
            rollout_logp=pad(batch.rollout_logprobs),
            denominator=denominator,
        )
        (loss * self.world).backward()
        sums.add({k: v for k, v in metrics.items() if k not in ("loss", "pg_loss")}, mask.sum())
        sums.add_losses({"pg_loss": metrics["pg_loss"]}, denominator, micro.share)

    def _critic_backward(
        self, micro: Micro, features: ImageFeatures | None, denominator: float, sums: Sums
    ) -> None:
        """The critic's value loss on one micro-batch, backpropagated (zero on an empty bin, as above)."""
        assert self.critic is not None
        batch = micro.batch
        with self.autocast():
            values = token_values(self.critic, batch, image_features=features)
        if not micro.rows:
            (values.sum() * 0.0).backward()
            return
        assert micro.values is not None and micro.returns is not None
        pad = batch.to_padded
        mask = pad(batch.loss_mask)
        critic_loss, critic_metrics = value_loss(
            pad(values),
            pad(micro.values),
            pad(micro.returns),
            mask,
            clip=self.cfg.algo.value_clip,
            loss_agg_mode=self.cfg.algo.loss_agg_mode,
            denominator=denominator,
        )
        (critic_loss * self.world).backward()
        sums.add({k: v for k, v in critic_metrics.items() if k != "vf_loss"}, mask.sum())
        sums.add_losses({"vf_loss": critic_metrics["vf_loss"]}, denominator, micro.share)


def zero_variance_share(rows: Sequence[Trajectory]) -> float:
    """The share of groups whose trainable episodes all have one reward: a group baseline gives them zero
    advantage, so they add no policy gradient (a measure of how much of a GRPO step is spent for nothing)."""
    rewards: dict[str, set[float]] = {}
    for row in rows:
        rewards.setdefault(row.group_id, set()).add(row.episode_reward)
    return sum(len(values) == 1 for values in rewards.values()) / len(rewards)


def compute_dtype(name: str, device: torch.device) -> torch.dtype:
    """`model.compute_dtype` resolved: `auto` is bfloat16 on a GPU and float32 on the CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def _played_with(rows: Sequence[Trajectory], *, on_policy: bool) -> Behaviour:
    """The one `Behaviour` the episodes were played with: the update scores them at its temperature. Refused
    (ValueError) for episodes that record none, that were sampled otherwise than each other (one update has
    one behaviour policy), greedily, or, `on_policy` (old logprobs from the update's own forward pass), by
    more than one policy or with leave to be stale."""
    missing = [t.episode_id for t in rows if t.behaviour is None]
    if missing:
        raise ValueError(f"episodes {missing[:3]} record no behaviour: the sampling they were played with")
    played = {t.behaviour: t.episode_id for t in rows if t.behaviour is not None}
    if len(played) > 1:
        differ = "; ".join(f"{episode}: {behaviour}" for behaviour, episode in played.items())
        raise ValueError(f"one update takes episodes of one behaviour; these were played otherwise: {differ}")
    (behaviour,) = played
    if behaviour.temperature == 0:
        raise ValueError(
            "the episodes were played greedily (temperature 0): they have no logprobs to learn from"
        )
    versions = sorted({t.policy_version for t in rows})
    if on_policy and (len(versions) > 1 or behaviour.max_staleness):
        raise ValueError(
            f"the update takes its old logprobs from its own forward pass, which is right only on-policy, "
            f"but its episodes come from policy versions {versions} with leave to be "
            f"{behaviour.max_staleness} versions stale: use algo.old_logprobs=recompute"
        )
    return behaviour


def _add_mismatch(sums: Sums, logp: torch.Tensor, batch: PackedBatch) -> None:
    """Add the micro-batch's mean |trainer - rollout| logprob over its generated tokens."""
    mask = batch.loss_mask
    tokens = mask.sum()
    diff = masked_sum((logp - batch.rollout_logprobs).abs(), mask) / tokens.clamp(min=1)
    sums.add({"logprob_abs_diff": diff}, tokens)


def _sequence(trajectory: Trajectory) -> SequenceSample:
    """What packing needs of a trajectory: its trainer track, loss mask, rollout logprobs and images."""
    return SequenceSample(
        train_ids=trajectory.train_ids,
        loss_mask=trajectory.loss_mask,
        images=trajectory.images,
        rollout_logprobs=trajectory.rollout_logprobs,
    )


def _trainable(parameters: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
    """The parameters that take gradients (a frozen vision tower's do not)."""
    return [p for p in parameters if p.requires_grad]


def _padded(rows: Sequence[Sequence[float]], width: int) -> torch.Tensor:
    """Right-padded float32 `[B, width]`, filled on the host in numpy (no torch call a row)."""
    out = np.zeros((len(rows), width), dtype=np.float32)
    for b, values in enumerate(rows):
        out[b, : len(values)] = values
    return torch.from_numpy(out)


def _split(values: torch.Tensor, batch: PackedBatch) -> list[torch.Tensor]:
    """A packed row's `[T]` values split per sequence (the dummy tail dropped)."""
    return list(values[: int(batch.cu_seqlens[-1])].split(batch.cu_seqlens.diff().tolist()))


def _row_tensor(padded: torch.Tensor, micro: Micro, lengths: list[int]) -> torch.Tensor:
    """A micro-batch's `[T]` row assembled from `[B, width]` per-trajectory values on the host (0 on the
    dummy tail), in numpy (no torch call a row)."""
    values = padded.numpy()
    pieces = [values[b, : lengths[b]] for b in micro.rows]
    tail = micro.batch.num_tokens - sum(lengths[b] for b in micro.rows)
    return torch.from_numpy(np.concatenate([*pieces, np.zeros(tail, dtype=values.dtype)]))


def _without_vision_gradients(*models: ActorModel | CriticModel | None) -> None:
    """Drop the vision towers' gradients. In a mini-batch without images they are the dummy images'
    exact zeros (under FSDP, docs/fsdp.md), and AdamW would still move a tower by its momentum, where one
    rank, whose tower never ran, leaves it as it is."""
    for model in models:
        if model is not None:
            for parameter in model.model.visual.parameters():
                parameter.grad = None


def clip_gradients(parameters: Iterator[torch.nn.Parameter], max_norm: float) -> float:
    """Clip the gradient norm (FSDP-aware); returns the norm before clipping."""
    grads = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    return float(norm)


def warmup(steps: int) -> Callable[[int], float]:
    """`LambdaLR`'s factor for linear warmup over `steps` optimizer steps, then a constant rate."""
    return lambda done: min(1.0, (done + 1) / steps) if steps else 1.0
