"""The loop's modes and bookkeeping with a scripted policy (`ScriptedEngine`, whose replies depend only on
each job's sampling seed): aborted episodes left out, async rollouts, the next step begun during the
update."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from vistarl.trainer.config import RolloutConfig, TrainConfig
from vistarl.trainer.eval import eval_starts
from vistarl.trainer.learner.update import PolicyTrainer
from vistarl.trainer.rollout.engines.base import GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.prompts import PromptSource
from vistarl.trainer.run.schedule import StepSchedule
from vistarl.trainer.run.train import run_training


def odd_seeds_count(index: int, request: GenerateRequest) -> str:
    """Episodes with an odd sampling seed count up (reward 1), the others say something else (-0.1)."""
    return "inc" if (request.sampling.sampling_seed or 0) % 2 else "wait"


def scripted_config(checkpoint: Path, run_dir: Path, steps: int) -> TrainConfig:
    """GRPO on the counter env in process (target 1): 2 starts x 4 samples a step, 2 mini-batches."""
    return TrainConfig.model_validate(
        {
            "model": {"path": str(checkpoint), "dtype": "float32", "gradient_checkpointing": False},
            "env": {"name": "tests.envs.counter", "serve": False, "options": {"target": 1}},
            "rollout": {
                "n_samples_per_prompt": 4,
                "rollout_batch_size": 2,
                "max_turns": 1,
                "max_new_tokens": 8,
                "rollout_max_response_len": 8,
                "rollout_max_context_len": 512,
            },
            "algo": {"advantage_estimator": "grpo", "tis_cap": None},
            "optim": {"lr": 1e-3, "warmup_steps": 3},
            "train": {
                "steps": steps,
                "global_batch_size": 4,
                "micro_batch_tokens": 512,
                "seed": 3,
                "save_samples": 0,
                "run_dir": str(run_dir),
            },
            "logging": {"tensorboard": False},
        }
    )


def with_changes(cfg: TrainConfig, section: str, **changes: object) -> TrainConfig:
    """A validated copy of `cfg` with keys of one section changed."""
    return TrainConfig.model_validate(
        {**cfg.model_dump(), section: {**getattr(cfg, section).model_dump(), **changes}}
    )


def aborts_every_third(index: int, request: GenerateRequest) -> str | None:
    """Like `odd_seeds_count`, but no reply (an ABORTED episode) when the sampling seed is a multiple of 3."""
    return None if (request.sampling.sampling_seed or 0) % 3 == 0 else odd_seeds_count(index, request)


async def test_aborted_episodes_are_counted_and_left_out_of_the_update(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    cfg = scripted_config(tiny_qwen25, tmp_path / "run", steps=2)
    console = Console(file=io.StringIO(), width=200)
    result = await run_training(cfg, engine=ScriptedEngine(processor, aborts_every_third), console=console)
    assert [r["step"] for r in result.history] == [1, 2]
    aborted = sum(r["rollout/status/ABORTED"] for r in result.history)
    scored = sum(r["rollout/status/COMPLETED"] + r["rollout/status/TRUNCATED"] for r in result.history)
    assert aborted > 0 and scored > 0 and aborted + scored == 16
    printed = console.file.getvalue()  # each step says why its episodes were left out
    for record in result.history:
        count = int(record["rollout/status/ABORTED"])
        note = (
            f"step {record['step']}: {count} of 8 episodes ABORTED: engine aborted: the script has no reply"
        )
        assert (note in printed) == (count > 0)
    assert sum(r["train/trajectories"] for r in result.history) == scored
    assert all(r["rollout/missing"] == 0 for r in result.history)


def aborts_the_first_try(index: int, request: GenerateRequest) -> str | None:
    """No reply (ABORTED) for the first 8 requests, a step's first try of one turn each; then as
    `odd_seeds_count`."""
    return None if index < 8 else odd_seeds_count(index, request)


async def test_a_try_played_again_is_counted_with_how_its_episodes_ended(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    cfg = scripted_config(tiny_qwen25, tmp_path / "run", steps=1)
    result = await run_training(cfg, engine=ScriptedEngine(processor, aborts_the_first_try))
    (record,) = result.history
    assert record["rollout/unusable_tries"] == 1 and record["rollout/unusable/ABORTED"] == 8
    assert record["rollout/status/ABORTED"] == 0 and record["rollout/episodes"] == 8  # the try trained on
    assert "rollout/unusable/missing" not in record  # only the endings that happened


async def test_async_mode_trains_on_episodes_one_version_old_and_evaluates(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    cfg = with_changes(
        scripted_config(tiny_qwen25, tmp_path / "run", steps=2), "rollout", async_mode=True, max_staleness=1
    )
    cfg = with_changes(with_changes(cfg, "train", eval_every=2), "env", eval_seeds=(1000, 1003))
    result = await run_training(cfg, engine=ScriptedEngine(processor, odd_seeds_count))
    assert [r["rollout/policy_lag"] for r in result.history] == [0.0, 1.0]
    assert "eval/episodes" not in result.history[0] and result.history[1]["eval/episodes"] == 3
    assert len(list((tmp_path / "run" / "eval" / "step-000002").glob("episode-*/trajectory.json"))) == 3
    assert [r["policy_version"] for r in result.history] == [1.0, 2.0]
    assert all(r["rollout/stale"] == 0 and r["rollout/episodes"] == 8 for r in result.history)


@dataclass(eq=False)
class ArrivalsEngine(ScriptedEngine):
    """A scripted engine that notes the weight version each request found when it arrived."""

    arrivals: list[str] = field(default_factory=list, init=False)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.arrivals.append(self.weight_version)
        return await super().generate(request)


def test_the_schedule_puts_the_next_steps_jobs_where_the_rollout_config_says() -> None:
    """(before the update, after the push, generation held, waiting for the packing, the version they are
    played by while 4 serves) for each schedule, and the schedule each setting of the flags names."""
    assert {
        schedule: (
            schedule.enqueues_before_update,
            schedule.enqueues_after_push,
            schedule.holds_generation,
            schedule.waits_for_packing,
            schedule.next_version(4),
        )
        for schedule in StepSchedule
    } == {
        StepSchedule.SYNCHRONOUS: (False, True, False, False, 5),
        StepSchedule.OVERLAPPED_RESETS: (True, False, True, True, 5),
        StepSchedule.ASYNCHRONOUS: (True, False, False, False, 4),
        StepSchedule.LAST: (False, False, False, False, 5),  # enqueues nothing
    }
    named = [
        StepSchedule.of(RolloutConfig(async_mode=asynchronous, overlap_resets=overlap, max_staleness=1))
        for asynchronous, overlap in ((False, False), (False, True), (True, False), (True, True))
    ]
    assert named == [
        StepSchedule.SYNCHRONOUS,
        StepSchedule.OVERLAPPED_RESETS,
        *[StepSchedule.ASYNCHRONOUS] * 2,
    ]


@pytest.mark.parametrize("overlap", [True, False])
async def test_the_next_steps_episodes_start_during_the_update_and_generate_from_its_weights(
    tiny_qwen25: Path, tmp_path: Path, overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    cfg = scripted_config(tiny_qwen25, tmp_path / "run", steps=2)
    engine = ArrivalsEngine(processor, odd_seeds_count)
    arrived_at_packing: list[int] = []
    pack = PolicyTrainer.pack

    def slow_pack(self: PolicyTrainer, *args: Any, **kwargs: Any) -> Any:
        if not arrived_at_packing:  # resets started before step 1's packing would arrive during it
            time.sleep(1.0)
        arrived_at_packing.append(len(engine.arrivals))
        return pack(self, *args, **kwargs)

    monkeypatch.setattr(PolicyTrainer, "pack", slow_pack)
    result = await run_training(with_changes(cfg, "rollout", overlap_resets=overlap), engine=engine)
    # With the overlap, step 2's requests arrive while version 0 still serves (their resets and prompts ran
    # during step 1's update, once it had packed: its packing's torch calls would wait for the GIL behind
    # them), and are held until version 1 answers them; without it they arrive after the push. Either way
    # no episode lags and none is stale.
    assert arrived_at_packing[0] == 8 and arrived_at_packing[-1] == 16
    assert engine.arrivals == (["0"] * 16 if overlap else ["0"] * 8 + ["1"] * 8)
    assert [r["rollout/policy_lag"] for r in result.history] == [0.0, 0.0]
    assert all(r["rollout/stale"] == 0 and r["rollout/episodes"] == 8 for r in result.history)


async def test_overlapped_resets_never_follow_a_failed_update_and_follow_one_that_packed_nothing() -> None:
    enqueued: list[str] = []

    async def enqueue() -> None:
        enqueued.append("next step")

    async def failing(packed: Any = None) -> dict[str, float]:
        raise RuntimeError("CUDA out of memory")

    async def skipping(packed: Any = None) -> dict[str, float]:  # no trainable rows: nothing to pack
        return {"train/skipped": 1.0}

    with pytest.raises(RuntimeError, match="out of memory"):
        await StepSchedule.OVERLAPPED_RESETS.around_update(failing, enqueue)
    assert enqueued == []
    assert await StepSchedule.OVERLAPPED_RESETS.around_update(skipping, enqueue) == {"train/skipped": 1.0}
    assert enqueued == ["next step"]


async def test_a_run_that_need_not_save_its_last_step_leaves_no_checkpoint(
    tiny_qwen25: Path, tmp_path: Path
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    cfg = with_changes(scripted_config(tiny_qwen25, tmp_path / "run", steps=1), "train", save_last=False)
    result = await run_training(cfg, engine=ScriptedEngine(processor, odd_seeds_count))
    assert [r["step"] for r in result.history] == [1]
    assert result.checkpoint is None and not (tmp_path / "run" / "checkpoints").exists()


def test_async_mode_needs_room_for_one_version_of_lag(tiny_qwen25: Path, tmp_path: Path) -> None:
    cfg = scripted_config(tiny_qwen25, tmp_path / "run", steps=1)
    with pytest.raises(ValueError, match="max_staleness >= 1"):
        with_changes(cfg, "rollout", async_mode=True, max_staleness=0)


def test_training_seeds_skip_the_held_out_ranges(tiny_qwen25: Path, tmp_path: Path) -> None:
    cfg = with_changes(scripted_config(tiny_qwen25, tmp_path, steps=1), "env", eval_seeds=(3, 6))
    seeds = [start["seed"] for start in PromptSource(cfg).take(0, 8)]
    assert seeds == [0, 1, 2, 6, 7, 8, 9, 10]
    cfg = with_changes(cfg, "env", confirm_seeds=(8, 10))
    assert [start["seed"] for start in PromptSource(cfg).take(0, 8)] == [0, 1, 2, 6, 7, 10, 11, 12]


async def test_dataset_rows_become_samples_in_a_shuffled_resumable_order(tmp_path: Path) -> None:
    from vistarl.services.sokoban import ENV_FACTORY, SokobanEnv
    from vistarl.services.sokoban.dataset import write_dataset
    from vistarl.services.sokoban.options import SokobanOptions

    paths = write_dataset(tmp_path, n_train=3, n_test=1, base_seed=0, options=SokobanOptions(cell_size=16))
    cfg = TrainConfig.model_validate({"env": {"dataset": str(paths["train"]), "options": {"max_steps": 7}}})
    source = await PromptSource.create(cfg, "sokoban")
    starts = source.take(0, 6)
    levels = [str(start["sample"]["extra_info"]["env_config"]) for start in starts]
    assert sorted(levels[:3]) == sorted(levels[3:]) and len(set(levels[:3])) == 3, (
        "each epoch visits every row once"
    )
    assert source.take(4, 2) == starts[4:6]
    for start in starts:
        assert "seed" not in start and start["options"] == {"max_steps": 7}
        sample = ENV_FACTORY.sample_model.model_validate(start["sample"])  # type: ignore[union-attr]
        options = SokobanOptions.model_validate(start["options"])
        env = ENV_FACTORY.create(options, None, sample)
        assert isinstance(env, SokobanEnv) and env.options.max_steps == 7

    leaky = TrainConfig.model_validate({"env": {"dataset": str(paths["test"]), "eval_seeds": [0, 1000]}})
    with pytest.raises(ValueError, match="a held-out seed"):
        await PromptSource.create(leaky, "sokoban")


async def test_a_task_split_gives_task_ids_of_the_envs_own_split() -> None:
    cfg = TrainConfig.model_validate({"env": {"name": "geo3k", "task_split": "train"}})
    source = await PromptSource.create(cfg, "geo3k")
    starts = source.take(0, 4)
    assert all(start["task_id"].startswith("train/") for start in starts)
    assert len({start["task_id"] for start in starts}) == 4
    missing = TrainConfig.model_validate({"env": {"name": "geo3k", "task_split": "nope"}})
    with pytest.raises(ValueError, match="nope"):
        await PromptSource.create(missing, "geo3k")


async def test_a_held_out_split_the_env_lacks_is_an_error_naming_the_key() -> None:
    missing = TrainConfig.model_validate({"env": {"name": "geo3k", "eval_split": "nope"}})
    with pytest.raises(ValueError, match=r"env.eval_split 'nope': the env holds no tasks there .*'test'"):
        await eval_starts(missing, "geo3k")
    held_out = TrainConfig.model_validate({"env": {"name": "geo3k", "eval_split": "test"}})
    assert [start["task_id"] for start in await eval_starts(held_out, "geo3k", 3)] == [
        "test/0",
        "test/1",
        "test/2",
    ]
