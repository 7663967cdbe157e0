"""The HF engine's fast path against its reference path and the trainer, on one card, in the model's dtype.

    python3 -m benchmarks.engine_parity --shape qwen2_5_vl_3b --checkpoints runs/shapes --device cuda

`--rows` greedy requests of `--new-tokens` each, text and image prompts (benchmarks/engine_generate.py),
through the engine as it runs by default (the static cache in CUDA graphs on a GPU) and through HF's
eager decode over a growing cache (`cuda_graphs=False`, no static cache). Printed: the rows whose ids
agree in full, the first position where the others part, the largest logprob difference over the tokens
both paths share before they part, and the largest difference between the fast path's logprobs and the
trainer's recompute of the same sequences (`vistarl.trainer.learner.logprobs.sequence_logprobs`: the judge of
the engine's logprobs), over the first `--judged` rows of each kind. Random weights make near ties
common, so in bf16 two paths may part at a tie; the trainer's check has no such limit. `--dtype fp32` runs
both paths (and the trainer's recompute) in fp32, where they should part only where bf16 rounding made
them part.
"""

from __future__ import annotations

import argparse
import asyncio

import torch

from benchmarks.engine_generate import PROMPTS, checkpoint_for, dtype_of, shape_parser
from vistarl.trainer.learner.logprobs import sequence_logprobs
from vistarl.trainer.rollout.engines.base import GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams


async def results(engine: HFEngine, requests: list[GenerateRequest]) -> list[GenerateResult]:
    return list(await asyncio.gather(*(engine.generate(request) for request in requests)))


@torch.no_grad()
def judged(engine: HFEngine, request: GenerateRequest, result: GenerateResult) -> float:
    """The largest |engine - trainer| logprob over `result`'s tokens (the trainer's pass, without its
    autograd graph)."""
    processor = engine.processor
    grids = [processor.image_grid(image) for image in request.images]
    prompt = processor.expand_image_pads(request.engine_ids, grids)
    mask = [0] * len(prompt) + [1] * len(result.output_ids)
    scored = sequence_logprobs(
        engine.model, processor, prompt + result.output_ids, request.images, 1.0, mask=mask
    )
    expected = scored[torch.tensor(mask, dtype=torch.bool)]
    return float((torch.tensor(result.logprobs) - expected).abs().max())


async def compare(checkpoint: str, args: argparse.Namespace) -> None:
    dtype = dtype_of(args)
    fast = HFEngine.from_pretrained(checkpoint, device=args.device, dtype=dtype, max_batch_size=args.rows)
    reference = HFEngine.from_pretrained(
        checkpoint, device=args.device, dtype=dtype, max_batch_size=args.rows, cuda_graphs=False
    )
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    try:
        for kind, build in PROMPTS.items():
            prompts = await build(fast.processor, args.rows)
            requests = [
                GenerateRequest(engine_ids=ids, images=images, sampling=params) for ids, images in prompts
            ]
            ours, theirs = await results(fast, requests), await results(reference, requests)
            parted, gap = [], 0.0
            for mine, other in zip(ours, theirs, strict=True):
                pairs = enumerate(zip(mine.output_ids, other.output_ids, strict=True))
                same = next((i for i, (a, b) in pairs if a != b), len(mine.output_ids))
                if same < len(mine.output_ids):
                    parted.append(same)
                shared = torch.tensor(mine.logprobs[:same]) - torch.tensor(other.logprobs[:same])
                gap = max(gap, float(shared.abs().max()) if same else 0.0)
            trainer = max(
                judged(fast, r, o) for r, o in list(zip(requests, ours, strict=True))[: args.judged]
            )
            print(
                f"{kind}: {len(ours) - len(parted)}/{len(ours)} rows with equal ids"
                f" (the others part at tokens {sorted(parted)[:8]}); largest logprob difference before"
                f" parting {gap:.4f}; largest |engine - trainer| logprob {trainer:.4f}",
                flush=True,
            )
    finally:
        await fast.close()
        await reference.close()


def main() -> None:
    parser = shape_parser(__doc__, rows=32)
    parser.add_argument("--judged", type=int, default=4, help="rows of each kind the trainer recomputes")
    args = parser.parse_args()
    asyncio.run(compare(checkpoint_for(args), args))


if __name__ == "__main__":
    main()
