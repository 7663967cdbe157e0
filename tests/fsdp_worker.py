"""Training steps of the tiny actor on a fixed batch under FSDP2 (gloo), for `tests/test_fsdp.py`.

    torchrun --nproc-per-node 2 tests/fsdp_worker.py CHECKPOINT OUT_DIR    # sharded
    python tests/fsdp_worker.py CHECKPOINT OUT_DIR                          # plain module
    torchrun --nproc-per-node 1 tests/fsdp_worker.py CHECKPOINT OUT_DIR keep-gathered

The first two take one step, the batch split across ranks by `plan_micro_batches`; rank 0 writes the
loss, the gradient norm, the plan and the updated weights (safetensors) to OUT_DIR. The third trains
one rank twice, with and without `keep_gathered`, and writes both runs' weights and logprobs.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tests.vl_samples import make_sample
from trainer.learner.fsdp import full_state_dict, init_distributed, set_last_micro_batch, shard_model
from trainer.learner.logprobs import token_logprobs
from trainer.learner.models import load_actor
from trainer.learner.packing import SequenceSample, pack_sequences, plan_micro_batches
from trainer.learner.vision_passes import VisionPasses
from trainer.rollout.processor import VLProcessor

MICRO_BATCH_TOKENS = 128
TEMPERATURE = 0.9
ENTROPY_COEF = 0.01
LR = 1e-3
VISION_GROUP = 2  # micro-batches per vision-tower pass, as the trainer's `train.vision_pass_micro_batches`


def training_samples(processor: VLProcessor) -> list[SequenceSample]:
    """Five sequences, two with an image; with 2 ranks, one micro-step has images on one rank only."""
    rng = np.random.default_rng(7)
    return [
        make_sample(processor, rng, 20, 30, [(56, 56)]),
        make_sample(processor, rng, 30, 40),
        make_sample(processor, rng, 10, 25, [(56, 84)]),
        make_sample(processor, rng, 15, 20),
        make_sample(processor, rng, 8, 12),
    ]


def train_step(checkpoint: Path, out_dir: Path) -> None:
    """Accumulate the policy-gradient + entropy loss over this rank's micro-batches, clip, AdamW step."""
    torch.manual_seed(0)
    distributed = init_distributed(timeout=timedelta(seconds=60))
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    processor = VLProcessor.from_pretrained(checkpoint)
    actor = shard_model(load_actor(checkpoint), torch.device("cpu"), gradient_checkpointing=True)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=LR, weight_decay=0.0)
    samples = training_samples(processor)
    plan = plan_micro_batches([len(s.train_ids) for s in samples], world, MICRO_BATCH_TOKENS)
    scored_tokens = sum(sum(s.loss_mask) for s in samples)
    loss_sum = torch.zeros(())
    batches = [
        pack_sequences([samples[i] for i in m], processor, actor.model.get_rope_index) for m in plan[rank]
    ]
    vision = VisionPasses(actor, batches, VISION_GROUP)
    for i, batch in enumerate(batches):
        scores = token_logprobs(
            actor, batch, TEMPERATURE, with_entropy=True, image_features=vision.features(i)
        )
        assert scores.entropy is not None
        token_loss = -scores.logprobs * batch.advantages - ENTROPY_COEF * scores.entropy
        loss = (token_loss * batch.loss_mask).sum() / scored_tokens
        (loss * world).backward()  # FSDP averages gradients over ranks; the loss is a global sum
        vision.backward(i)
        loss_sum += loss.detach()
    grad_norm = torch.nn.utils.clip_grad_norm_(actor.parameters(), max_norm=1e6)
    optimizer.step()
    if distributed:
        dist.all_reduce(loss_sum)
        grad_norm = grad_norm.full_tensor()  # type: ignore[attr-defined]
    weights = full_state_dict(actor)
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.clone().contiguous() for k, v in weights.items()}, str(out_dir / "weights.safetensors")
        )
        report = {"loss": loss_sum.item(), "grad_norm": grad_norm.item(), "world": world, "plan": plan}
        (out_dir / "result.json").write_text(json.dumps(report))
    if distributed:
        dist.destroy_process_group()


def keep_gathered_steps(checkpoint: Path, out_dir: Path) -> None:
    """Two optimizer steps of two micro-batches, each after a no-grad pass (as the trainer's recompute),
    then a last no-grad pass; once with gathered weights kept through each step, once without."""
    init_distributed(timeout=timedelta(seconds=60))
    processor = VLProcessor.from_pretrained(checkpoint)
    samples = training_samples(processor)
    results: dict[str, torch.Tensor] = {}
    for keep in (True, False):
        torch.manual_seed(0)
        actor = shard_model(
            load_actor(checkpoint), torch.device("cpu"), gradient_checkpointing=True, keep_gathered=keep
        )
        optimizer = torch.optim.AdamW(actor.parameters(), lr=LR, weight_decay=0.0)
        plan = plan_micro_batches([len(s.train_ids) for s in samples], 1, MICRO_BATCH_TOKENS)[0]
        batches = [
            pack_sequences([samples[i] for i in m], processor, actor.model.get_rope_index) for m in plan
        ]
        assert len(batches) >= 2
        for step in range(3):
            with torch.no_grad():
                results[f"{keep}/logprobs/{step}"] = token_logprobs(actor, batches[0], TEMPERATURE).logprobs
            if step == 2:
                break
            vision = VisionPasses(actor, batches, VISION_GROUP)
            for i, batch in enumerate(batches):
                set_last_micro_batch(actor, i == len(batches) - 1)
                scores = token_logprobs(actor, batch, TEMPERATURE, image_features=vision.features(i))
                (-(scores.logprobs * batch.advantages).sum()).backward()
                vision.backward(i)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        results |= {f"{keep}/weights/{k}": v for k, v in full_state_dict(actor).items()}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.clone().contiguous() for k, v in results.items()}, str(out_dir / "runs.safetensors"))
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[3:] == ["keep-gathered"]:
        keep_gathered_steps(Path(sys.argv[1]), Path(sys.argv[2]))
    else:
        train_step(Path(sys.argv[1]), Path(sys.argv[2]))
