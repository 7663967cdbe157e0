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
    the rest is the host between steps and launch gaps.
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
from collections.abc import Callable
from typing import Any

from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.engine_generate import TEXT_PROMPT, checkpoint_for, shape_parser
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams

DECODE = "decode: text model"
PREFILL = "prompt pass"
PARTS = ("attention", "mlp", "lm head")
GEMM_NAMES = ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")


async def greedy_round(engine: HFEngine, rows: int, new_tokens: int) -> float:
    """Wall seconds for `rows` greedy text requests of `new_tokens` each, sent at once."""
    ids = list(engine.processor.tokenizer.encode(TEXT_PROMPT))
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    await asyncio.gather(
        *(engine.generate(GenerateRequest(engine_ids=ids, sampling=params)) for _ in range(rows))
    )
    return time.perf_counter() - started


def hook_ranges(model: nn.Module) -> Callable[[], None]:
    """Open a profiler range around each attention layer, MLP, the LM head and the text model (named for a
    decode step or the prompt pass by its query length); returns what removes the hooks."""
    text_model = model.model.language_model  # type: ignore[union-attr]
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
    targets.append((model.lm_head, "lm head"))  # type: ignore[arg-type]
    for layer in text_model.layers:
        targets += [(layer.self_attn, "attention"), (layer.mlp, "mlp")]
    for module, name in targets:
        handles.append(module.register_forward_pre_hook(enter(name), with_kwargs=True))
        handles.append(module.register_forward_hook(leave, with_kwargs=True))
    return lambda: [handle.remove() for handle in handles]  # type: ignore[func-returns-value]


def attribute(events: Any, device: bool) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Microseconds per part (decode steps only) and per attention kernel name: the kernels' device time,
    or on the CPU each op's own CPU time."""
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
            if PREFILL in labels:
                continue
            part = next((label for label in labels if label in PARTS), None)
            if part == "attention":
                if any(name in kernel.name.lower() for name in GEMM_NAMES):
                    part = "attention projections"
                else:
                    attention_kernels[kernel.name[:90]] += kernel.duration
            rest = "text model: norms, embeddings, rotary" if DECODE in labels else "outside the model"
            parts[part or rest] += kernel.duration
    return parts, attention_kernels


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
    on_gpu = engine.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    prof = profile(activities=activities)
    on_model_thread = functools.partial(asyncio.get_running_loop().run_in_executor, engine._executor)
    await on_model_thread(prof.__enter__)  # the profiler records the thread that starts it: the engine's
    await greedy_round(engine, args.rows, args.new_tokens)
    await on_model_thread(functools.partial(prof.__exit__, None, None, None))
    remove()
    record.remove()
    await engine.close()
    steps = args.new_tokens - 1
    parts, kernels = attribute(prof.events(), on_gpu)
    total = sum(parts.values()) / steps / 1e3
    clock = "device" if on_gpu else "CPU"
    print(f"(a) eager decode, {args.rows} rows, {steps} steps: {clock} ms per step by part")
    for part, micros in parts.most_common():
        print(f"  {part:<40} {micros / steps / 1e3:8.2f} ms  {micros / sum(parts.values()):6.1%}")
    print(f"  {'total':<40} {total:8.2f} ms")
    lengths = collections.Counter(positions)
    print(f"  positions each row attends (steps at each): {dict(lengths.most_common(4))}")
    for name, micros in kernels.most_common(5):
        print(f"  attention kernel {micros / steps / 1e3:7.2f} ms/step  {name}")
    return total


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


def main() -> None:
    parser = shape_parser(__doc__, rows=128)
    parser.add_argument("--cache-len", type=int, default=4096, help="the eager pass's static cache")
    args = parser.parse_args()
    checkpoint = checkpoint_for(args)
    kernels_ms = asyncio.run(eager_profile(checkpoint, args))
    wall_ms = asyncio.run(graph_steps(checkpoint, args))
    rate = args.rows / wall_ms * 1e3
    print(f"(b) as served: {wall_ms:.2f} ms per decode step of {args.rows} rows ({rate:.0f} tokens/s);")
    print(
        f"    the kernels' own time {kernels_ms:.2f} ms, host and launch gaps {wall_ms - kernels_ms:.2f} ms"
    )


if __name__ == "__main__":
    main()
