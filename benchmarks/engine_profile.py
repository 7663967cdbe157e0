"""Where a decode step of the HF engine spends its time, by part of the model: torch's profiler over the
engine's own static-cache decode.

    python3 -m benchmarks.engine_profile --shape qwen2_5_vl_3b --checkpoints runs/shapes --device cuda

`--rows` greedy text requests of `--new-tokens` each, all at once, through `HFEngine` only (so an older
engine can be measured by the same script):
(a) eager (`cuda_graphs=False`, a static cache of `--cache-len` positions): the device time of every kernel
    of the decode steps, attributed to the part of the model whose forward launched it (module hooks open
    a profiler range around each): attention over the cache (everything in the attention layers but the
    projections' matrix products: the mask, any copies of the cache, softmax, the attention kernel, the
    cache writes), the q/k/v/o projections, the MLPs, the LM head, the rest of the text model (norms,
    embeddings, rotary tables), and what runs outside the model (sampling and the cache's bookkeeping), each
    in ms per step, with the positions each row attends and the attention kernels named;
(b) as the engine runs on a GPU (CUDA graphs): wall ms per decode step, from two rounds of `--new-tokens`
    and half as many (their difference cancels the prompt pass), against the kernels' own time from (a):
    the rest is the host between steps and launch gaps;
(c) with `--prompt-pass`, instead: `--rows` first turns of Sokoban and Geo3k episodes (new levels each
    round) sent at once for one token each: the wall time of their prompt passes, the device time of the
    vision tower's attention, MLPs and merger and of the text model's prefill by part, and (`--out DIR`) a
    report of what the device sat idle behind (benchmarks/gpu_profile.py's).

    python3 -m benchmarks.engine_profile --shape qwen2_5_vl_3b --checkpoints runs/shapes --device cuda \
        --prompt-pass --rows 16 --out runs/prompt-profile

Not counted in (a): the prompt pass's kernels inside the model. The LM head's one call for the first
tokens is counted with the decode steps (1 in `--new-tokens`).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.engine_generate import TEXT_PROMPT, checkpoint_for, dtype_of, image_prompts, shape_parser
from benchmarks.gpu_profile import profiled_idle_report
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams

DECODE = "decode: text model"
PREFILL = "prompt pass"
VISION = "vision tower"
PARTS = ("attention", "mlp", "lm head", "vision attention", "vision mlp", "vision merger")
GEMM_NAMES = ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")


async def greedy_round(engine: HFEngine, rows: int, new_tokens: int) -> float:
    """Wall seconds for `rows` greedy text requests of `new_tokens` each, sent at once."""
    ids = list(engine.processor.tokenizer.encode(TEXT_PROMPT))
    return await timed_round(engine, [(ids, [])] * rows, new_tokens)


async def timed_round(
    engine: HFEngine, prompts: Sequence[tuple[list[int], list[str]]], new_tokens: int
) -> float:
    """Wall seconds for `prompts` (ids, images) sent at once, `new_tokens` greedy tokens each."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    await asyncio.gather(
        *(
            engine.generate(GenerateRequest(engine_ids=ids, images=images, sampling=params))
            for ids, images in prompts
        )
    )
    return time.perf_counter() - started


def hook_ranges(model: nn.Module) -> Callable[[], None]:
    """Open a profiler range around each attention layer, MLP, the LM head and the text model (named for a
    decode step or the prompt pass by its query length), and around the vision tower, its blocks'
    attention and MLPs and its merger; returns what removes the hooks."""
    text_model = model.model.language_model  # type: ignore[union-attr]
    visual = model.model.visual  # type: ignore[union-attr]
    handles = []
    ranges: list[Any] = []

    def enter(name: str | Callable[[tuple[Any, ...], dict[str, Any]], str]) -> Callable[..., None]:
        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            label = name if isinstance(name, str) else name(args, kwargs)
            ranges.append(record_function(label).__enter__())

        return pre

    def leave(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        ranges.pop().__exit__(None, None, None)

    def text_label(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        tokens = kwargs.get("input_ids")
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        return DECODE if tokens is not None and tokens.shape[1] == 1 else PREFILL

    targets: list[tuple[nn.Module, str | Callable[..., str]]] = [(text_model, text_label)]
    targets += [(model.lm_head, "lm head"), (visual, VISION), (visual.merger, "vision merger")]  # type: ignore[list-item]
    for layer in text_model.layers:
        targets += [(layer.self_attn, "attention"), (layer.mlp, "mlp")]
    for block in visual.blocks:
        targets += [(block.attn, "vision attention"), (block.mlp, "vision mlp")]
    for module, name in targets:
        handles.append(module.register_forward_pre_hook(enter(name), with_kwargs=True))
        handles.append(module.register_forward_hook(leave, with_kwargs=True))
    return lambda: [handle.remove() for handle in handles]  # type: ignore[func-returns-value]


def attribute(
    events: Any, device: bool, phase: str = DECODE
) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Microseconds per part of `phase` (the decode steps, or the prompt pass and its vision tower) and per
    attention kernel name: the kernels' device time, or on the CPU each op's own CPU time."""
    parts: collections.Counter[str] = collections.Counter()
    attention_kernels: collections.Counter[str] = collections.Counter()
    for event in events:
        timed = event.kernels if device else [_Timed(event.name, event.self_cpu_time_total)]
        for kernel in timed:
            labels = []
            parent = event
            while parent is not None:
                labels.append(parent.name)
                parent = parent.cpu_parent
            if (PREFILL if phase == DECODE else DECODE) in labels or (phase == DECODE and VISION in labels):
                continue
            part = next((label for label in labels if label in PARTS), None)
            if part in ("attention", "vision attention"):
                if any(name in kernel.name.lower() for name in GEMM_NAMES):
                    part += " projections"
                else:
                    attention_kernels[kernel.name[:90]] += kernel.duration
            parts[part or rest_of(labels)] += kernel.duration
    return parts, attention_kernels


def rest_of(labels: list[str]) -> str:
    """The part of a kernel outside the named layers: the vision tower's or the text model's own, or none."""
    if VISION in labels:
        return "vision tower: patch embedding, norms, rotary"
    if DECODE in labels or PREFILL in labels:
        return "text model: norms, embeddings, rotary"
    return "outside the model"


@dataclasses.dataclass(frozen=True)
class _Timed:
    """A CPU op timed like a kernel: its name and its own microseconds."""

    name: str
    duration: float


async def eager_profile(checkpoint: str, args: argparse.Namespace) -> float:
    """(a): print the device ms per decode step of each part; returns their sum."""
    engine = HFEngine.from_pretrained(
        checkpoint,
        device=args.device,
        max_batch_size=args.rows,
        cuda_graphs=False,
        static_cache_len=args.cache_len,
    )
    await greedy_round(engine, args.rows, 4)  # warm-up
    positions: list[int] = []
    remove = hook_ranges(engine.model)

    def attended(module: nn.Module, args_: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        mask = kwargs.get("attention_mask")
        if mask is not None and mask.dim() == 4 and mask.shape[-2] == 1:  # a decode step's mask
            positions.append(int(mask.shape[-1]))

    first_layer = engine.model.model.language_model.layers[0].self_attn
    record = first_layer.register_forward_pre_hook(attended, with_kwargs=True)
    events = (await profiled(engine, greedy_round(engine, args.rows, args.new_tokens))).events()
    remove()
    record.remove()
    await engine.close()
    steps = args.new_tokens - 1
    on_gpu = engine.device.type == "cuda"
    print(f"(a) eager decode, {args.rows} rows, {steps} steps: {clock(on_gpu)} ms per step by part")
    total = print_parts(*attribute(events, on_gpu), steps, "step")
    lengths = collections.Counter(positions)
    print(f"  positions each row attends (steps at each): {dict(lengths.most_common(4))}")
    return total


async def profiled(engine: HFEngine, work: Awaitable[Any]) -> Any:
    """The profiler's events over `work`, recorded on the engine's model thread (the profiler records the
    thread that starts it), with the device's kernels on a GPU."""
    on_gpu = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    prof = profile(activities=activities)
    on_model_thread = functools.partial(asyncio.get_running_loop().run_in_executor, engine._executor)
    await on_model_thread(prof.__enter__)
    await work
    await on_model_thread(functools.partial(prof.__exit__, None, None, None))
    return prof


def clock(on_gpu: bool) -> str:
    return "device" if on_gpu else "CPU"


def print_parts(
    parts: collections.Counter[str], kernels: collections.Counter[str], count: int, unit: str
) -> float:
    """Print each part's ms per `unit` (of `count`) and the attention kernels; returns the parts' sum."""
    total = sum(parts.values())
    for part, micros in parts.most_common():
        print(f"  {part:<44} {micros / count / 1e3:8.2f} ms  {micros / total:6.1%}")
    print(f"  {'total':<44} {total / count / 1e3:8.2f} ms")
    for name, micros in kernels.most_common(5):
        print(f"  attention kernel {micros / count / 1e3:7.2f} ms/{unit}  {name}")
    return total / count / 1e3


async def graph_steps(checkpoint: str, args: argparse.Namespace) -> float:
    """(b): wall ms per decode step as the engine runs by default (CUDA graphs on a GPU)."""
    engine = HFEngine.from_pretrained(checkpoint, device=args.device, max_batch_size=args.rows)
    half = args.new_tokens // 2
    for new in (args.new_tokens, half):
        await greedy_round(engine, args.rows, new)  # warm-up: every bucket's graph captured
    full = min([await greedy_round(engine, args.rows, args.new_tokens) for _ in range(2)])
    part = min([await greedy_round(engine, args.rows, half) for _ in range(2)])
    await engine.close()
    return (full - part) / (args.new_tokens - half) * 1e3


async def prompt_profile(checkpoint: str, args: argparse.Namespace) -> None:
    """(c): `--rows` image prompts (new levels each round) sent at once for one token each: the wall time
    of their prompt passes, each part's device time, and what the device sat idle behind (`--out`)."""
    engine = HFEngine.from_pretrained(
        checkpoint, device=args.device, dtype=dtype_of(args), max_batch_size=args.rows
    )
    prompts = await image_prompts(engine.processor, 3 * args.rows)
    rounds = [prompts[i * args.rows : (i + 1) * args.rows] for i in range(3)]
    await timed_round(engine, rounds[0], 1)  # warm-up
    before = dataclasses.replace(engine.stats)
    wall_s = await timed_round(engine, rounds[1], 1)
    passes = engine.stats.since(before)
    remove = hook_ranges(engine.model)
    prof = await profiled(engine, timed_round(engine, rounds[2], 1))
    remove()
    await engine.close()
    on_gpu = engine.device.type == "cuda"
    tokens = passes.computed_prompt_tokens
    print(
        f"(c) {args.rows} image prompts, {tokens} prompt tokens, in {passes.prompt_passes} prompt passes:"
        f" {wall_s * 1e3:.1f} ms wall, {passes.prompt_s * 1e3:.1f} ms of it in the passes (the rest:"
        f" preparing the prompts and queueing);"
        f" {clock(on_gpu)} ms by part (profiled round):"
    )
    kernels_ms = print_parts(*attribute(prof.events(), on_gpu, PREFILL), 1, "round")
    print(f"    wall minus the kernels' own time: {wall_s * 1e3 - kernels_ms:.1f} ms (host and launch gaps)")
    if args.out and on_gpu:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "prompt_pass_idle.txt").write_text(profiled_idle_report(prof))
        print(f"    what the device sat idle behind: {args.out / 'prompt_pass_idle.txt'}")


def main() -> None:
    parser = shape_parser(__doc__, rows=128)
    parser.add_argument("--cache-len", type=int, default=4096, help="the eager pass's static cache")
    parser.add_argument("--prompt-pass", action="store_true", help="(c) only: image prompts' prompt passes")
    parser.add_argument("--out", type=Path, help="(c): where the idle report goes")
    args = parser.parse_args()
    checkpoint = checkpoint_for(args)
    if args.prompt_pass:
        asyncio.run(prompt_profile(checkpoint, args))
        return
    kernels_ms = asyncio.run(eager_profile(checkpoint, args))
    wall_ms = asyncio.run(graph_steps(checkpoint, args))
    rate = args.rows / wall_ms * 1e3
    print(f"(b) as served: {wall_ms:.2f} ms per decode step of {args.rows} rows ({rate:.0f} tokens/s);")
    print(
        f"    the kernels' own time {kernels_ms:.2f} ms, host and launch gaps {wall_ms - kernels_ms:.2f} ms"
    )


if __name__ == "__main__":
    main()
