"""`PolicyTrainer` on real trajectories: what `update` and `imitate` (`imitation.py`) change, path by path.

Every test builds fresh trainers on the tiny checkpoint (one process, no FSDP) and trajectories from
conversations through the rollout's token tracks (`tests.learner_batches`). Expected values come from
the rewards, the masks and the models' own logprobs, never from the trainer's internals.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.learner_batches import conversation, generated_logprob, scored_by, trajectory
from tests.runners import SETTINGS
from vistarl.trainer.config import TrainConfig
from vistarl.trainer.learner.imitation import imitate
from vistarl.trainer.learner.models import Models, load_actor, load_critic, load_reference
from vistarl.trainer.learner.update import PolicyTrainer, zero_variance_share
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TurnEncoder
from vistarl.trainer.rollout.trajectory import Status, Trajectory

PROMPT = "Do you agree?"
REPLIES = ["yes indeed", "no", "yes, of course I do", "not at all"]


@pytest.fixture(scope="module")
def encoder(tiny_qwen25: Path) -> TurnEncoder:
    """The rollout's turn encoder on the tiny checkpoint's processor."""
    return TurnEncoder(VLProcessor.from_pretrained(tiny_qwen25))


@pytest.fixture(scope="module")
def processor(encoder: TurnEncoder) -> VLProcessor:
    return encoder.processor


def trainer_config(
    checkpoint: Path, samples: int, minibatches: int = 1, micro_batch_tokens: int = 512, **sections: Any
) -> TrainConfig:
    """One prompt's `samples` trajectories per step, in `minibatches` optimizer steps per epoch; `sections`
    update the model / algo / optim / rollout settings (TIS off, so a ratio is exactly the policy's)."""
    return TrainConfig.model_validate(
        {
            "model": {
                "path": str(checkpoint),
                "dtype": "float32",
                "gradient_checkpointing": False,
                **sections.get("model", {}),
            },
            "rollout": {
                "n_samples_per_prompt": samples,
                "rollout_batch_size": 1,
                "max_new_tokens": 16,
                "rollout_max_response_len": 16,
                "rollout_max_context_len": micro_batch_tokens,
                **sections.get("rollout", {}),
            },
            "algo": {"tis_cap": None, **sections.get("algo", {})},
            "optim": {"lr": 1e-3, "critic_lr": 1e-3, **sections.get("optim", {})},
            "train": {"global_batch_size": samples // minibatches, "micro_batch_tokens": micro_batch_tokens},
        }
    )


def make_trainer(cfg: TrainConfig, processor: VLProcessor, nudge: float = 0.0) -> PolicyTrainer:
    """A trainer with the models `cfg` needs, the actor's weights moved by seeded noise of size `nudge`."""
    path = cfg.model.path
    actor = load_actor(path)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in actor.parameters():
            parameter.add_(nudge * torch.randn(parameter.shape, generator=generator))
    models = Models(
        actor,
        load_reference(path) if cfg.algo.use_kl else None,
        load_critic(path) if cfg.algo.needs_critic else None,
    )
    return PolicyTrainer(cfg, models, processor, torch.device("cpu"))


def one_group(encoder: TurnEncoder, rewards: list[float]) -> list[Trajectory]:
    """One trajectory per reward, replying `REPLIES` in turn to the same prompt."""
    return [
        trajectory(encoder, conversation(PROMPT, [REPLIES[i % 4]]), f"e{i}", "g0", reward=r)
        for i, r in enumerate(rewards)
    ]


def generated_tokens(trajectories: list[Trajectory]) -> torch.Tensor:
    """How many tokens each trajectory generated."""
    return torch.tensor([float(sum(t.loss_mask)) for t in trajectories])


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    """How many steps AdamW has taken (0 before the first)."""
    steps = {int(state["step"]) for state in optimizer.state.values()}
    assert len(steps) <= 1
    return steps.pop() if steps else 0


def test_grpo_update_raises_the_rewarded_replies_and_reports_its_step(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    trainer = make_trainer(trainer_config(tiny_qwen25, 4), processor)
    rewards = [1.0, 0.0, 1.0, 0.0]
    batch = scored_by(trainer.actor, processor, one_group(encoder, rewards))
    aborted = trajectory(encoder, conversation(PROMPT, ["yes"]), "e8", "g0", 1.0, status=Status.ABORTED)
    failed = Trajectory(episode_id="e9", group_id="g0", policy_version=0, status=Status.FAILED)
    before = [generated_logprob(trainer.actor, processor, t) for t in batch]

    metrics = trainer.update(1, [*batch, aborted, failed])

    after = [generated_logprob(trainer.actor, processor, t) for t in batch]
    moved = [a - b for a, b in zip(after, before, strict=True)]
    assert all(m > 0 for m, r in zip(moved, rewards, strict=True) if r == 1.0), moved
    assert all(m < 0 for m, r in zip(moved, rewards, strict=True) if r == 0.0), moved
    assert all(math.isfinite(v) for v in metrics.values()), metrics
    assert metrics["train/trajectories"] == 4 and metrics["train/tokens"] == sum(
        len(t.train_ids) for t in batch
    )
    assert metrics["train/logprob_abs_diff"] < 1e-5, "the rollout logprobs are these weights' own"
    assert metrics["train/pg_clip_frac"] == 0 and abs(metrics["train/ppo_kl"]) < 1e-6, "one step: ratio 1"
    reward = torch.tensor(rewards)
    advantage = (reward - reward.mean()) / reward.std()
    tokens = generated_tokens(batch)
    assert metrics["train/pg_loss"] == pytest.approx(
        float(-(advantage * tokens).sum() / tokens.sum()), rel=1e-4
    )
    assert 0 < metrics["train/entropy"] <= math.log(trainer.actor.config.get_text_config().vocab_size)
    assert metrics["train/grad_norm"] > 0 and metrics["train/lr"] == pytest.approx(1e-3)
    assert "train/kl_ref" not in metrics and "train/vf_loss" not in metrics
    assert optimizer_steps(trainer.actor_optimizer) == 1


def test_nothing_trainable_is_skipped_and_changes_nothing(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    trainer = make_trainer(trainer_config(tiny_qwen25, 4), processor)
    played = one_group(encoder, [1.0, 0.0])
    unplayed = [
        Trajectory.from_dict({**played[0].to_dict(), "status": Status.ABORTED.value}),
        Trajectory.from_dict({**played[1].to_dict(), "loss_mask": [0] * len(played[1].loss_mask)}),
        Trajectory(episode_id="e9", group_id="g0", policy_version=0, status=Status.FAILED),
    ]
    before = weights(trainer.actor)
    assert trainer.update(1, unplayed) == {"train/skipped": 1.0}
    assert imitate(trainer, unplayed[1:]) == {"train/skipped": 1.0}
    assert optimizer_steps(trainer.actor_optimizer) == 0
    for name, tensor in weights(trainer.actor).items():
        assert torch.equal(tensor, before[name]), name


def test_imitate_lowers_the_nll_of_the_assistant_tokens(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    trainer = make_trainer(trainer_config(tiny_qwen25, 4), processor)
    batch = one_group(encoder, [0.0] * 4)
    tokens = float(generated_tokens(batch).sum())

    def nll() -> float:
        return -sum(generated_logprob(trainer.actor, processor, t) for t in batch) / tokens

    start = nll()
    reported = [imitate(trainer, batch)["train/nll"] for _ in range(2)]
    assert reported[0] == pytest.approx(start, rel=1e-5), "the first step reports the NLL before it"
    assert reported[0] > reported[1] > nll()


def test_imitate_gives_tokens_with_mask_zero_no_gradient(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    """Masking a reply's tokens steps exactly like cutting that reply off; training it steps otherwise."""
    both = trajectory(encoder, conversation(PROMPT, ["yes", "and again yes"]), "e0", "g0")
    first = trajectory(encoder, conversation(PROMPT, ["yes"]), "e0", "g0")
    cut = len(first.train_ids)
    assert both.train_ids[:cut] == first.train_ids and sum(both.loss_mask[cut:]) > 0
    masked = Trajectory.from_dict(
        {**both.to_dict(), "loss_mask": first.loss_mask + [0] * (len(both.loss_mask) - cut)}
    )

    trainer = make_trainer(trainer_config(tiny_qwen25, 4), processor)
    start = weights(trainer.actor)

    def gradients(t: Trajectory) -> dict[str, torch.Tensor]:
        """The gradient of one SFT step on `t` from the starting weights (left on them after the step)."""
        trainer.actor.load_state_dict(start)
        imitate(trainer, [t])
        return {n: p.grad.clone() for n, p in trainer.actor.named_parameters() if p.grad is not None}

    with_mask, without_tail, trained = gradients(masked), gradients(first), gradients(both)
    assert with_mask.keys() == without_tail.keys()
    for name, grad in with_mask.items():
        torch.testing.assert_close(grad, without_tail[name], rtol=1e-4, atol=1e-7, msg=name)
    gap = max(float((trained[n] - g).abs().max()) for n, g in with_mask.items())
    assert gap > 1e-3, "training the second reply changes the gradient, so the comparison means something"


def test_gae_update_trains_the_critic_toward_the_returns(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    cfg = trainer_config(tiny_qwen25, 4, algo={"advantage_estimator": "gae", "gamma": 1.0, "lam": 1.0})
    trainer = make_trainer(cfg, processor)
    assert trainer.critic is not None
    rewards = [1.0, 0.2, 0.6, 0.0]
    batch = scored_by(trainer.actor, processor, one_group(encoder, rewards))
    critic_before = weights(trainer.critic)

    history = [trainer.update(step, batch) for step in range(1, 4)]

    # The critic's head starts at zero, so every value is 0 and, with gamma = lam = 1, every token's
    # advantage and value target is its episode's reward.
    reward, tokens = torch.tensor(rewards), generated_tokens(batch)
    first = history[0]
    assert first["train/value_mean"] == 0.0
    assert first["train/pg_loss"] == pytest.approx(float(-(reward * tokens).sum() / tokens.sum()), rel=1e-4)
    assert first["train/vf_loss"] == pytest.approx(
        float(0.5 * (reward**2 * tokens).sum() / tokens.sum()), rel=1e-4
    )
    losses = [m["train/vf_loss"] for m in history]
    assert losses[0] > losses[1] > losses[2], losses
    target = float((reward * tokens).sum() / tokens.sum())
    values = [m["train/value_mean"] for m in history]
    assert values[0] < values[1] < values[2] < target, f"the values climb toward {target}: {values}"
    assert all(m["train/critic_grad_norm"] > 0 for m in history)
    moved = {n for n, t in weights(trainer.critic).items() if not torch.equal(t, critic_before[n])}
    assert "value_head.weight" in moved and any(n.startswith("model.") for n in moved)
    assert trainer.critic_optimizer is not None and optimizer_steps(trainer.critic_optimizer) == 3


def test_turn_gae_credits_each_turn_with_its_own_and_later_rewards(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    gamma_turn = 0.5
    algo = {"advantage_estimator": "turn_gae", "gamma": 1.0, "lam": 1.0, "gamma_turn": gamma_turn}
    trainer = make_trainer(trainer_config(tiny_qwen25, 2, algo=algo), processor)
    turn_rewards = [[1.0, 0.0, 0.5], [0.0, 1.0, 0.25]]
    batch = [
        trajectory(encoder, conversation(PROMPT, REPLIES[i : i + 3]), f"e{i}", "g0", turn_rewards=r)
        for i, r in enumerate(turn_rewards)
    ]

    metrics = trainer.update(1, batch)

    # Values start at 0, so turn k's tokens all get A_k = r_k + gamma_turn * A_{k+1}.
    total, count = 0.0, 0
    for t, rewards in zip(batch, turn_rewards, strict=True):
        credit = [0.0] * (len(rewards) + 1)
        for k in reversed(range(len(rewards))):
            credit[k] = rewards[k] + gamma_turn * credit[k + 1]
        for turn, mask in zip(t.turn_index, t.loss_mask, strict=True):
            total += credit[turn] * mask
            count += mask
    assert metrics["train/pg_loss"] == pytest.approx(-total / count, rel=1e-4)


def test_kl_term_pulls_the_policy_toward_the_reference(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    """Equal rewards give zero advantages, so the KL term is the whole loss."""
    cfg = trainer_config(tiny_qwen25, 4, algo={"kl_loss_coef": 1.0, "kl_loss_type": "k3"}, optim={"lr": 1e-4})
    trainer = make_trainer(cfg, processor, nudge=0.02)
    reference = trainer.reference
    assert reference is not None
    batch = one_group(encoder, [1.0] * 4)

    def gap() -> float:
        """Mean |policy - reference| logprob of the batch's generated tokens."""
        pairs = [
            (
                generated_logprob(trainer.actor, processor, t),
                generated_logprob(reference, processor, t),
            )
            for t in batch
        ]
        return sum(abs(a - b) for a, b in pairs) / float(generated_tokens(batch).sum())

    start = gap()
    kl = [trainer.update(step, batch)["train/kl_ref"] for step in range(1, 3)]
    assert start > 0.1, "the nudge puts the policy away from its reference"
    assert kl[0] > kl[1] > 0, kl
    assert gap() < start / 2


def test_an_entropy_target_adapts_the_bonus_from_the_measured_entropy(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    """Below its target the bonus weighs in and grows step by step; above it, it is off: the update is
    then the plain GRPO one, as without a bonus."""
    batch = one_group(encoder, [1.0, 0.0, 1.0, 0.0])
    entropy = {"entropy_coef": 0.01, "entropy_coef_step": 0.01, "entropy_coef_max": 0.05}
    below = make_trainer(trainer_config(tiny_qwen25, 4, algo={**entropy, "entropy_target": 100.0}), processor)
    coefs = [below.update(step, batch)["train/entropy_coef"] for step in (1, 2)]
    assert coefs == pytest.approx([0.01, 0.02])
    assert below.schedulers["entropy"].state_dict()["level"] == pytest.approx(0.03)

    above = make_trainer(trainer_config(tiny_qwen25, 4, algo={**entropy, "entropy_target": 1e-6}), processor)
    fixed = make_trainer(trainer_config(tiny_qwen25, 4, algo={"entropy_coef": 0.01}), processor)
    plain = make_trainer(trainer_config(tiny_qwen25, 4), processor)
    steps = [[t.update(1, batch) for t in (above, fixed, plain)]]
    assert [m["train/entropy_coef"] for m in steps[0]] == [0.01, 0.01, 0.0]
    assert steps[0][0]["train/entropy"] > 1e-6
    first = [weights(t.actor) for t in (above, fixed, plain)]
    assert all(torch.equal(first[0][k], first[1][k]) for k in first[0]), "the same bonus, the same step"
    assert any(not torch.equal(first[0][k], first[2][k]) for k in first[0]), "the bonus moved the weights"
    second = [t.update(2, batch)["train/entropy_coef"] for t in (above, fixed)]
    assert second == [0.0, 0.01]
    after = [weights(t.actor) for t in (above, fixed)]
    assert any(not torch.equal(after[0][k], after[1][k]) for k in after[0]), "above its target: no bonus"
    assert "entropy" not in plain.schedulers and "entropy" not in fixed.schedulers


def test_a_second_epoch_steps_again_on_ratios_that_have_moved(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    """One epoch of one mini-batch never clips (ratio 1: see the GRPO test); two step twice, and clip."""
    cfg = trainer_config(tiny_qwen25, 4, algo={"ppo_epochs": 2}, optim={"lr": 1e-2})
    trainer = make_trainer(cfg, processor)
    metrics = trainer.update(1, scored_by(trainer.actor, processor, one_group(encoder, [1.0, 0.0, 1.0, 0.0])))
    assert optimizer_steps(trainer.actor_optimizer) == 2
    # Metrics average both epochs; the first has ratio 1, so whatever clipped did so in the second.
    assert metrics["train/pg_clip_frac"] > 0 and abs(metrics["train/ppo_kl"]) > 1e-4


def test_micro_batches_change_neither_the_step_nor_its_metrics(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    """The same two mini-batches, each in one micro-batch or in one per trajectory."""
    batch = one_group(encoder, [1.0, 0.2, 0.6, 0.0])
    runs = []
    for budget in (512, max(len(t.train_ids) for t in batch)):
        cfg = trainer_config(
            tiny_qwen25, 4, minibatches=2, micro_batch_tokens=budget, algo={"advantage_estimator": "gae"}
        )
        trainer = make_trainer(cfg, processor)
        assert trainer.critic is not None
        before = [weights(trainer.actor), weights(trainer.critic)]
        metrics = trainer.update(1, scored_by(trainer.actor, processor, batch))
        runs.append((metrics, before, [weights(trainer.actor), weights(trainer.critic)]))
    (whole, before, after), (split, _, split_after) = runs
    for name, value in whole.items():
        if name.startswith("train/"):
            assert split[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for start, end, other in zip(before, after, split_after, strict=True):
        assert_same_step(start, end, other)


def assert_same_step(
    before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], other: dict[str, torch.Tensor]
) -> None:
    """`other` took the same step from `before` as `after` did, up to float noise: AdamW moves an element
    with a gradient near its epsilon by a noisy fraction of the learning rate, so single elements may
    differ by a few percent of a step, but the whole step by no more than 1e-3 of its length."""
    assert other.keys() == after.keys() == before.keys()
    step = sum(float((after[n] - before[n]).double().square().sum()) for n in before) ** 0.5
    gap = sum(float((other[n] - after[n]).double().square().sum()) for n in before) ** 0.5
    assert step > 0, "the step moved nothing, so the comparison would prove nothing"
    assert gap <= 1e-3 * step, f"steps differ by {gap:.3g}, {gap / step:.2%} of the step"


def actor_gradient(trainer: PolicyTrainer) -> torch.Tensor:
    """The actor's gradient after its last optimizer step, flattened (zeros where a parameter has none)."""
    return torch.cat(
        [
            (p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
            for p in trainer.actor.parameters()
        ]
    )


def test_fast_path_gives_the_loss_and_gradient_of_the_fp32_recompute(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    """bf16 compute with old logprobs from the update's own forward (the GPU default) against the reference
    path, float32 with a recompute pass: the same batch gives the same loss and gradient to bf16 tolerance."""
    steps = {}
    for name, old_logprobs, dtype in (
        ("reference", "recompute", "float32"),
        ("fast", "update_pass", "bfloat16"),
    ):
        cfg = trainer_config(
            tiny_qwen25,
            4,
            model={"compute_dtype": dtype},
            algo={"old_logprobs": old_logprobs},
            optim={"grad_clip": 1e9},  # no clipping: the raw gradients are compared
        )
        trainer = make_trainer(cfg, processor, nudge=0.02)
        batch = scored_by(load_actor(tiny_qwen25), processor, one_group(encoder, [1.0, 0.0, 0.5, 0.0]))
        metrics = trainer.update(1, batch)
        steps[name] = (metrics, actor_gradient(trainer))
    (reference, reference_grad), (fast, fast_grad) = steps["reference"], steps["fast"]
    assert reference["time/recompute"] > 0 and fast["time/recompute"] == 0.0
    assert reference_grad.norm() > 0
    assert fast["train/pg_loss"] == pytest.approx(
        reference["train/pg_loss"], abs=1e-2 * abs(reference["train/pg_loss"]) + 1e-4
    )
    assert fast["train/logprob_abs_diff"] == pytest.approx(
        reference["train/logprob_abs_diff"], rel=0.1, abs=1e-3
    )
    assert ((fast_grad - reference_grad).norm() / reference_grad.norm()).item() < 2e-2


@pytest.mark.parametrize(
    "sections",
    [
        {"algo": {"ppo_epochs": 2}},
        {"minibatches": 2},
        {"rollout": {"async_mode": True, "max_staleness": 1}},
        {"rollout": {"max_staleness": 1}},
    ],
    ids=["two-epochs", "two-mini-batches", "async", "stale-allowed"],
)
def test_old_logprobs_from_the_update_are_refused_off_policy(
    tiny_qwen25: Path, sections: dict[str, Any]
) -> None:
    """Off-policy updates must recompute: `update_pass` is a config error there, and `auto` recomputes."""
    minibatches = sections.pop("minibatches", 1)
    with pytest.raises(ValueError, match="needs an on-policy update"):
        trainer_config(
            tiny_qwen25,
            4,
            minibatches,
            algo={**sections.get("algo", {}), "old_logprobs": "update_pass"},
            **{k: v for k, v in sections.items() if k != "algo"},
        )
    auto = trainer_config(tiny_qwen25, 4, minibatches, **sections)
    assert not auto.old_logprobs_from_update


def test_old_logprobs_from_the_update_are_refused_for_episodes_of_two_policies(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    trainer = make_trainer(trainer_config(tiny_qwen25, 4, algo={"old_logprobs": "update_pass"}), processor)
    batch = scored_by(trainer.actor, processor, one_group(encoder, [1.0, 0.0, 1.0, 0.0]))
    stale = [Trajectory.from_dict({**batch[0].to_dict(), "policy_version": 1}), *batch[1:]]
    before = weights(trainer.actor)
    with pytest.raises(ValueError, match="policy versions \\[0, 1\\]"):
        trainer.update(1, stale)
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.actor).items())


def played_at(batch: list[Trajectory], **behaviour: Any) -> list[Trajectory]:
    """`batch` as if played with a default config's behaviour changed by `behaviour`."""
    changed = dataclasses.replace(SETTINGS.behaviour, **behaviour)
    return [dataclasses.replace(t, behaviour=changed) for t in batch]


def test_the_update_scores_episodes_at_the_temperature_they_were_played_at(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    """Episodes sampled at temperature 0.6 by the trainer's own weights, under a config that says 1.0: the
    recompute matches their rollout logprobs, as it does only at the temperature they carry."""
    cfg = trainer_config(tiny_qwen25, 4, algo={"old_logprobs": "recompute"})
    assert cfg.rollout.rollout_temperature == 1.0
    trainer = make_trainer(cfg, processor)
    batch = played_at(one_group(encoder, [1.0, 0.0, 0.5, 0.0]), temperature=0.6)
    scored = scored_by(trainer.actor, processor, batch)  # at each trajectory's own temperature
    assert (
        scored[0].rollout_logprobs
        != scored_by(trainer.actor, processor, played_at(batch))[0].rollout_logprobs
    )
    metrics = trainer.update(1, scored)
    assert metrics["train/logprob_abs_diff"] < 1e-5


@pytest.mark.parametrize(
    ("changed", "refusal"),
    [
        ({"temperature": 0.7}, "played otherwise"),
        ({"top_p": 0.9}, "played otherwise"),
        ({"top_k": 20}, "played otherwise"),
        ({"min_p": 0.1}, "played otherwise"),
        ({"max_staleness": 1}, "played otherwise"),
        (None, "record no behaviour"),
    ],
    ids=["temperature", "top-p", "top-k", "min-p", "staleness", "none"],
)
def test_episodes_played_otherwise_than_the_rest_are_refused(
    tiny_qwen25: Path,
    processor: VLProcessor,
    encoder: TurnEncoder,
    changed: dict[str, Any] | None,
    refusal: str,
) -> None:
    """One update has one behaviour policy: an episode sampled otherwise (or not known to be) is refused
    before anything moves."""
    trainer = make_trainer(trainer_config(tiny_qwen25, 4, algo={"old_logprobs": "recompute"}), processor)
    batch = scored_by(trainer.actor, processor, one_group(encoder, [1.0, 0.0, 1.0, 0.0]))
    odd = played_at(batch[:1], **changed) if changed else [dataclasses.replace(batch[0], behaviour=None)]
    before = weights(trainer.actor)
    with pytest.raises(ValueError, match=refusal):
        trainer.update(1, [*odd, *batch[1:]])
    assert all(torch.equal(before[k], v) for k, v in weights(trainer.actor).items())


def test_greedy_episodes_and_stale_ones_on_policy_are_refused(
    tiny_qwen25: Path, processor: VLProcessor, encoder: TurnEncoder
) -> None:
    """Greedy episodes have no logprobs to learn from; an update that takes its old logprobs from its own
    forward pass refuses episodes allowed to be stale, whatever its config says."""
    recompute = make_trainer(trainer_config(tiny_qwen25, 4, algo={"old_logprobs": "recompute"}), processor)
    batch = scored_by(recompute.actor, processor, one_group(encoder, [1.0, 0.0, 1.0, 0.0]))
    with pytest.raises(ValueError, match="played greedily"):
        recompute.update(1, played_at(batch, temperature=0.0))
    on_policy = make_trainer(trainer_config(tiny_qwen25, 4, algo={"old_logprobs": "update_pass"}), processor)
    with pytest.raises(ValueError, match="leave to be 2 versions stale"):
        on_policy.update(1, played_at(batch, max_staleness=2))


def test_zero_variance_groups_are_the_groups_whose_episodes_share_one_reward(encoder: TurnEncoder) -> None:
    same = one_group(encoder, [1.0, 1.0, 1.0])
    mixed = [
        trajectory(encoder, conversation(PROMPT, [reply]), f"m{i}", "g1", reward=reward)
        for i, (reply, reward) in enumerate(zip(REPLIES, [1.0, 0.0, 1.0], strict=False))
    ]
    assert zero_variance_share([*same, *mixed]) == 0.5
    assert zero_variance_share(mixed) == 0.0
