"""The memory estimate (`trainer/learner/memory_budget.py`) against the models' real parameter counts, the
3B shape's known sizes and a measured peak, and the check that refuses a run that cannot fit, as a function
and through `vistarl train`, before any model loads."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vistarl.cli.main import app
from vistarl.devtools.model_shapes import SHAPES, qwen_vl_config
from vistarl.trainer.config import TrainConfig, load_config
from vistarl.trainer.learner.memory_budget import (
    GIB,
    MemoryBudgetError,
    ModelCounts,
    check_budget,
    estimate_budget,
    model_counts,
    preflight,
)
from vistarl.trainer.learner.models import load_actor, load_critic

REPO = Path(__file__).resolve().parents[1]
VSI = REPO / "configs" / "vsi.yaml"
H200_GIB = 139.8  # what torch.cuda.mem_get_info reports as an H200's total
VSI_RUN = [  # scripts/run_system_gpu.sh vsi's sizing, its engine a server elsewhere
    "rollout.rollout_batch_size=8",
    "train.global_batch_size=8",
    "rollout.concurrency=4",
    "rollout.max_turns=8",
    "env.options.max_turns=8",
    "rollout.engine=sglang:http://127.0.0.1:30000",
]
RAN_OUT = [  # the sizing whose step 2 ran out of memory on an H200 (docs/benchmarks.md)
    *VSI_RUN,
    "model.checkpoint_scope=mlp",
    "train.micro_batch_tokens=12288",
    "train.vision_pass_micro_batches=4",
    "train.optimizer_state_dtype=float32",
]


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def counts_3b() -> ModelCounts:
    """The Qwen2.5-VL-3B shape's counts, from its config alone."""
    return ModelCounts.of(qwen_vl_config("qwen2_5_vl", SHAPES["qwen2_5_vl_3b"]))


def ppo_config(checkpoint: Path, **train: object) -> TrainConfig:
    """PPO with a critic, a KL term's reference, and the embedded engine, on `checkpoint`."""
    return TrainConfig.model_validate(
        {
            "model": {"path": str(checkpoint)},
            "algo": {"advantage_estimator": "gae", "kl_loss_coef": 0.1},
            "train": train,
        }
    )


def test_counts_are_the_loaded_models_own(tiny_qwen25: Path, tiny_qwen3: Path) -> None:
    for checkpoint in (tiny_qwen25, tiny_qwen3):
        counts = model_counts(checkpoint)
        actor, critic = load_actor(checkpoint), load_critic(checkpoint)
        assert counts.params == numel(actor)
        assert counts.critic_params == numel(critic)
        assert counts.vision_params == numel(actor.model.visual)
        assert counts.embedding_params == actor.model.get_input_embeddings().weight.numel()
        assert counts.layer_params == numel(actor.model.language_model.layers[0])


def test_the_lasting_parts_are_the_counted_parameters_times_their_bytes(tiny_qwen25: Path) -> None:
    """float32 weights, and AdamW's two moments at 4 or 2 bytes, of every model; halved on two ranks;
    the critic's gone from the GPU when offloaded, the frozen tower's state from the actor's."""
    counts = model_counts(tiny_qwen25)
    n, c = counts.params, counts.critic_params
    parts = estimate_budget(ppo_config(tiny_qwen25), counts).parts
    assert parts[("actor", "weights")] == parts[("reference", "weights")] == 4 * n
    assert parts[("actor", "AdamW state")] == 8 * n
    assert parts[("critic", "weights")] == 4 * c and parts[("critic", "AdamW state")] == 8 * c
    assert parts[("engine", "weights")] == 2 * n  # model.dtype bfloat16

    halved = estimate_budget(ppo_config(tiny_qwen25, optimizer_state_dtype="bfloat16"), counts, 2).parts
    assert halved[("actor", "weights")] == 2 * n and halved[("actor", "AdamW state")] == 2 * n

    offloaded = estimate_budget(ppo_config(tiny_qwen25, optimizer_offload="critic"), counts).parts
    assert ("critic", "weights") not in offloaded and ("critic", "AdamW state") not in offloaded

    frozen = ppo_config(tiny_qwen25)
    frozen.model.freeze_vision = True
    frozen_parts = estimate_budget(frozen, counts).parts
    assert frozen_parts[("actor", "AdamW state")] == 8 * (n - counts.vision_params)


def test_the_3b_shape_needs_what_its_parameters_say(counts_3b: ModelCounts) -> None:
    """3.755B parameters (docs/fsdp.md): PPO at 3B holds 120 GB of weights and AdamW state before a
    gradient or an activation, more than an H200 has; bfloat16 moments take 30 GB of it."""
    assert 3.75e9 < counts_3b.params < 3.76e9
    assert counts_3b.critic_params == counts_3b.params + counts_3b.hidden + 1  # tied lm_head, new value head
    cfg = load_config(VSI, RAN_OUT)
    budget = estimate_budget(cfg, counts_3b)
    lasting = sum(size for (_, part), size in budget.parts.items() if part in ("weights", "AdamW state"))
    assert lasting == 12 * (counts_3b.params + counts_3b.critic_params)
    assert budget.total > H200_GIB * GIB
    lighter = estimate_budget(load_config(VSI, [*RAN_OUT, "train.optimizer_state_dtype=bfloat16"]), counts_3b)
    assert budget.total - lighter.total == pytest.approx(
        4 * (counts_3b.params + counts_3b.critic_params), rel=0.1
    )


def test_the_estimate_is_at_or_above_the_measured_3b_update(counts_3b: ModelCounts) -> None:
    """benchmarks/train_step.py's default (GRPO's actor alone, 4 micro-batches of 8,192 tokens, MLP-scope
    checkpointing, fused AdamW) peaked at 71.7 GiB on an H100 (docs/benchmarks.md): the estimate may be
    above a measured peak, by its bounds, but never below it."""
    cfg = TrainConfig.model_validate(
        {
            "model": {"checkpoint_scope": "mlp"},
            "rollout": {"n_samples_per_prompt": 16, "rollout_batch_size": 1, "rollout_max_context_len": 2048,
                        "rollout_max_response_len": 1024, "engine": "sglang:http://127.0.0.1:1"},
            "train": {"micro_batch_tokens": 8192},
        }
    )  # fmt: skip
    tensors = estimate_budget(cfg, counts_3b).tensors / GIB
    assert 71.7 <= tensors <= 71.7 * 1.25


def test_a_run_that_cannot_fit_is_refused_naming_what_to_change(counts_3b: ModelCounts) -> None:
    cfg = load_config(VSI, RAN_OUT)
    with pytest.raises(MemoryBudgetError) as refused:
        check_budget(cfg, counts_3b, 90 * GIB, where="free on cuda:0 at start")
    message = str(refused.value)
    assert "does not fit the 90.0 GiB planned for (free on cuda:0 at start)" in message
    assert "critic: weights 14.0, AdamW state 28.0" in message
    assert "--set train.optimizer_state_dtype=bfloat16" in message
    assert "--set train.optimizer_offload=critic" in message
    assert re.search(r"together, [\d.]+ GiB: --set ", message), "no set of changes that fits"
    assert "train.memory_check=warn" in message


def test_the_run_systems_vsi_sizing_fits_one_h200_beside_its_engine(counts_3b: ModelCounts) -> None:
    """The script's VSI sizing leaves room on one H200 for an engine server's 3B weights and KV cache."""
    sizing = [
        "model.checkpoint_scope=layer",
        "train.micro_batch_tokens=12288",
        "train.optimizer_state_dtype=bfloat16",
        "train.vision_pass_micro_batches=2",
    ]
    engine_gib = 12.0
    budget = check_budget(load_config(VSI, [*VSI_RUN, *sizing]), counts_3b, (H200_GIB - engine_gib) * GIB)
    assert budget.total < (H200_GIB - engine_gib) * GIB


def test_the_trainer_checks_before_loading_and_honours_warn_and_off(
    tiny_qwen25: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cpu = torch.device("cpu")
    assert preflight(ppo_config(tiny_qwen25), tiny_qwen25, cpu) is None  # on the CPU, nothing to plan for
    with pytest.raises(MemoryBudgetError, match=re.escape("train.gpu_memory_gib=0.01")):
        preflight(ppo_config(tiny_qwen25, gpu_memory_gib=0.01), tiny_qwen25, cpu)
    with caplog.at_level(logging.WARNING):
        warned = preflight(
            ppo_config(tiny_qwen25, gpu_memory_gib=0.01, memory_check="warn"), tiny_qwen25, cpu
        )
    assert warned is not None and "does not fit" in caplog.text
    assert (
        preflight(ppo_config(tiny_qwen25, gpu_memory_gib=0.01, memory_check="off"), tiny_qwen25, cpu) is None
    )
    fits = preflight(ppo_config(tiny_qwen25, gpu_memory_gib=80), tiny_qwen25, cpu)
    assert fits is not None and fits.total < 80 * GIB


def test_vistarl_train_refuses_a_run_that_cannot_fit(tiny_qwen25: Path, tmp_path: Path) -> None:
    overrides = [
        f"model.path={tiny_qwen25}",
        f"train.run_dir={tmp_path / 'run'}",
        "train.gpu_memory_gib=0.05",
        "env.url=http://127.0.0.1:1",  # never reached: the check comes first
    ]
    config = REPO / "configs" / "sokoban_tiny.yaml"
    args = ["train", "--config", str(config), *(arg for o in overrides for arg in ("--set", o))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "training failed" in result.output
    assert "does not fit the 0.1 GiB planned for (train.gpu_memory_gib=0.05)" in result.output
    assert not list((tmp_path / "run").glob("checkpoints/*"))


@pytest.mark.parametrize("ranks", [1, 4])
def test_each_ranks_engine_is_counted_at_its_share_of_the_episodes_and_its_prefix_cache(ranks: int) -> None:
    """Colocated, each rank's engine batches its share of every in-process worker's episodes, and keeps
    a prefix cache up to its bound: the KV cache counted is that many rows of the context, not one
    worker's `rollout.concurrency`."""
    counts = ModelCounts.of(qwen_vl_config("qwen3_vl", SHAPES["qwen3_vl_2b"]))  # 112 KiB a position
    cfg = TrainConfig.model_validate(
        {
            "model": {"path": "unused"},
            "rollout": {
                "engine": "hf",
                "local_workers": 2,
                "concurrency": 128,
                "rollout_max_context_len": 4096,
            },
        }
    )
    parts = estimate_budget(cfg, counts, ranks).parts
    rows = 2 * 128 // ranks
    assert parts[("engine", "KV cache")] == rows * 4096 * 112 * 2**10
    assert parts[("engine", "prefix cache")] == cfg.rollout.prefix_cache_mb * 2**20
    cfg.rollout.prefix_cache = False
    assert ("engine", "prefix cache") not in estimate_budget(cfg, counts, ranks).parts
