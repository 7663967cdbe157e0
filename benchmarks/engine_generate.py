"""Generation throughput of the HF engine under concurrent requests, as rollout workers drive it, beside
transformers' own `generate`, the same engine over HTTP, and the card's floor.

    .venv/bin/python -m benchmarks.engine_generate                           # tiny Qwen2.5-VL on this CPU
    python3 -m benchmarks.engine_generate --shape qwen2_5_vl_3b --device cuda --requests 32 128 \\
        --prompts text image --new-tokens 256 --hf-generate --serve          # one GPU, docs/benchmarks.md
    .venv/bin/python -m benchmarks.engine_generate --engine hf:http://127.0.0.1:30000 --model DIR

`--shape` measures a released model's shape with random weights, written to `--checkpoints`/SHAPE (on
the GPU, in bfloat16) unless it is there already; `--engine hf:DIR` any checkpoint; `--engine URL` a running
server (`hf:` or `sglang:`). Prompts: `text` is one short user turn; `image` the first turns of Sokoban and
Geo3k episodes, alternately (the system prompt and the first observation with its image, built by the
rollout's own token tracks from the envs, run in this process). Every request is greedy with `ignore_eos`,
so each decodes exactly `--new-tokens`. For each prompt kind and request count, all requests are sent at
once, twice: an unmeasured round (CUDA graphs captured), then the measured one. Printed per row: generated
tokens/s, latency p50 / p90, and on a GPU the floor: the bytes one decode step must read (the text model's
weights, plus each row's KV cache over the positions it attends, averaged over the steps) at the
device-to-device copy bandwidth measured in the same run, as tokens/s, and the share of it reached.

`--hf-generate` adds transformers' `generate` (its default cache, one batch of the text prompts);
`--serve` the same rows through `vistarl engine serve` on the same checkpoint, started here on a free
loopback port, so the HTTP hop's cost is known. Not counted: loading, the envs' resets, the warm-up round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.harness import benchmark_parser
from vistarl.devtools.model_shapes import REAL_SHAPES, SHAPES, arch_for
from vistarl.devtools.tiny_checkpoint import write_tiny_checkpoint
from vistarl.httpserver.launch import free_port, stop_process, wait_healthy
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.rollout.engines.base import Engine, GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.loading import load_engine, make_engine
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.engines.spec import EngineSpec
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.episode_env import opening_messages
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TokenTracks, TurnEncoder

TEXT_PROMPT = "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n"
IMAGE_ENVS = ("sokoban", "geo3k")
SERVE_START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Round:
    """One measured round: its wall time, and each request's latency, prompt length and tokens generated."""

    wall_s: float
    latencies: list[float]
    prompt_tokens: list[int]
    generated: list[int]

    @property
    def tokens(self) -> int:
        return sum(self.generated)


async def play_round(engine: Engine, requests: list[GenerateRequest]) -> Round:
    """Send every request at once; fail on any abort."""

    async def one(request: GenerateRequest) -> tuple[float, GenerateResult]:
        started = time.perf_counter()
        result = await engine.generate(request.model_copy(update={"rid": uuid.uuid4().hex}))
        if result.aborted:
            raise RuntimeError(f"generation aborted: {result.finish_reason.message}")
        return time.perf_counter() - started, result

    started = time.perf_counter()
    done = await asyncio.gather(*(one(request) for request in requests))
    wall = time.perf_counter() - started
    results = [result for _, result in done]
    return Round(
        wall,
        [latency for latency, _ in done],
        [r.prompt_tokens for r in results],
        [len(r.output_ids) for r in results],
    )


async def text_prompts(processor: VLProcessor, count: int) -> list[tuple[list[int], list[str]]]:
    """`count` copies of one short user turn, without images."""
    return [(list(processor.tokenizer.encode(TEXT_PROMPT)), [])] * count


async def image_prompts(processor: VLProcessor, count: int) -> list[tuple[list[int], list[str]]]:
    """The first turns of `count` episodes, Sokoban's and Geo3k's alternately (seeds 0, 1, ...)."""
    envs = Envs()
    encoder = TurnEncoder(processor)
    settings = EpisodeSettings.of(RolloutConfig())  # only the reset is played
    prompts = []
    try:
        for seed in range(count):
            name = IMAGE_ENVS[seed % len(IMAGE_ENVS)]
            env = await envs.open(name)
            job = EpisodeJob(
                episode_id=f"bench-{seed}", group_id=f"bench-{seed}", env=name, seed=seed, settings=settings
            )
            message, _ = await env.reset(job)
            tracks = TokenTracks(encoder)
            tracks.add_prompt(opening_messages(env, message))
            prompts.append((list(tracks.engine_ids), list(tracks.images)))
            await env.close()
    finally:
        await envs.aclose()
    return prompts


PROMPTS = {"text": text_prompts, "image": image_prompts}


@dataclass(frozen=True)
class Floor:
    """What one decode step must read: the text model's weights once, and per attended position its KV
    cache; `bandwidth` is the device-to-device copy rate measured here (bytes read and written per s)."""

    weight_bytes: int
    kv_bytes_per_position: int
    bandwidth: float

    @classmethod
    def of(cls, model: torch.nn.Module, device: torch.device) -> Floor:
        text_model = model.model.language_model  # type: ignore[union-attr]
        embeddings = text_model.get_input_embeddings().weight
        weights = sum(p.numel() * p.element_size() for p in text_model.parameters() if p is not embeddings)
        head = model.lm_head.weight  # type: ignore[union-attr]
        config = model.config.get_text_config()  # type: ignore[union-attr]
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv = config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * head.element_size()
        return cls(weights + head.numel() * head.element_size(), kv, copy_bandwidth(device))

    def tokens_per_s(self, measured: Round) -> float:
        """The most tokens/s a round of these rows allows: rows over the time to read one mean step."""
        rows = len(measured.generated)
        positions = sum(measured.prompt_tokens) + sum(measured.generated) / 2  # mean over the steps
        step_s = (self.weight_bytes + self.kv_bytes_per_position * positions) / self.bandwidth
        return rows / step_s


def copy_bandwidth(device: torch.device, size: int = 1 << 31) -> float:
    """Bytes read and written per second by a device-to-device copy of `size` bytes (mean of 10)."""
    source = torch.empty(size, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        target.copy_(source)
    end.record()
    end.synchronize()
    return 2 * size * 10 / (start.elapsed_time(end) / 1e3)


def report(label: str, measured: Round, floor: Floor | None) -> None:
    """One printed row."""
    p50, p90 = (statistics.quantiles(measured.latencies, n=10)[i] for i in (4, 8))
    rate = measured.tokens / measured.wall_s
    line = (
        f"{label:<34} requests={len(measured.generated):<4} tokens/s={rate:>9.1f}"
        f"  wall={measured.wall_s:6.2f}s  p50={p50:.2f}s p90={p90:.2f}s"
    )
    if floor is not None:
        bound = floor.tokens_per_s(measured)
        line += f"  floor={bound:>9.0f} tokens/s ({rate / bound:.1%})"
    print(line, flush=True)


async def measure_engine(
    label: str, engine: Engine, processor: VLProcessor, args: argparse.Namespace, floor: Floor | None
) -> None:
    """Every (prompt kind, request count) row of `engine`."""
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    for kind in args.prompts:
        prompts = await PROMPTS[kind](processor, max(args.requests))
        for count in args.requests:
            requests = [
                GenerateRequest(engine_ids=ids, images=images, sampling=params)
                for ids, images in prompts[:count]
            ]
            await play_round(engine, requests)  # warm-up: graphs captured, caches allocated
            report(f"{label} {kind}", await play_round(engine, requests), floor)


def hf_generate(engine: HFEngine, args: argparse.Namespace, floor: Floor | None) -> None:
    """transformers' `generate` on one batch of the text prompt, greedy, exactly `--new-tokens` each."""
    model, tokenizer = engine.model, engine.processor.tokenizer
    for count in args.requests:
        ids = torch.tensor([tokenizer.encode(TEXT_PROMPT)] * count, device=model.device)

        def run(new: int, ids: torch.Tensor = ids) -> torch.Tensor:
            out: torch.Tensor = model.generate(  # type: ignore[operator]
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
            )
            return out

        run(4)
        started = time.perf_counter()
        out = run(args.new_tokens)
        wall = time.perf_counter() - started
        generated = out.shape[1] - ids.shape[1]
        measured = Round(wall, [wall] * count, [ids.shape[1]] * count, [generated] * count)
        report("transformers generate text", measured, floor)


@contextlib.contextmanager
def served(checkpoint: str, args: argparse.Namespace) -> Iterator[str]:
    """`vistarl engine serve` on `checkpoint` on a free loopback port until the block ends; its URL."""
    port = free_port()
    command = [sys.executable, "-m", "vistarl.cli.main", "engine", "serve", "--model", checkpoint]
    command += ["--host", "127.0.0.1", "--port", str(port), "--device", args.device]
    command += ["--max-batch-size", str(args.max_batch_size), "--log-level", "warning"]
    command += ["--cuda-graphs" if args.cuda_graphs else "--no-cuda-graphs"]
    log = Path(tempfile.mkdtemp()) / "engine-serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log, timeout=SERVE_START_TIMEOUT_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def shape_parser(doc: str | None, rows: int) -> argparse.ArgumentParser:
    """The command line of a benchmark of one shape's engine (`engine_profile`, `engine_parity`): the shape,
    where its checkpoints are kept, the device, and `--rows` requests of `--new-tokens` each."""
    parser = benchmark_parser(doc)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--checkpoints", help="where the shapes' checkpoints are kept (default: scratch)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--new-tokens", type=int, default=64)
    dtypes = (
        "the engine's dtype (default: fp32 on CPU, bf16 on GPU); fp32 shows whether bf16 ties part the ids"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), help=dtypes)
    parser.set_defaults(engine=None, model=None)
    return parser


def dtype_of(args: argparse.Namespace) -> torch.dtype | None:
    """The `--dtype` asked for, or None for the engine's default."""
    return DTYPES[args.dtype] if args.dtype else None


def checkpoint_for(args: argparse.Namespace) -> str:
    """The checkpoint directory to measure: `--engine hf:DIR`, the `--shape`'s (written if missing), or a
    tiny one written to a scratch directory."""
    if args.engine:
        return str(args.model or EngineSpec.parse(args.engine).target)
    shape = args.shape or "tiny"
    directory = Path(args.checkpoints or tempfile.mkdtemp()) / shape
    if not (directory / "config.json").exists():
        dtype = torch.bfloat16 if shape in REAL_SHAPES else torch.float32
        write_tiny_checkpoint(directory, arch_for(shape), 0, SHAPES[shape], dtype=dtype, device=args.device)
    return str(directory)


async def run(args: argparse.Namespace) -> None:
    """Measure the engine(s) the arguments name."""
    checkpoint = checkpoint_for(args)
    if args.engine and EngineSpec.parse(args.engine).is_server:
        engine, processor = await load_engine(EngineSpec.parse(args.engine), Path(checkpoint))
        try:
            await measure_engine(args.engine, engine, processor, args, None)
        finally:
            await engine.close()
        return
    engine = HFEngine.from_pretrained(
        checkpoint, device=args.device, max_batch_size=args.max_batch_size, cuda_graphs=args.cuda_graphs
    )
    on_gpu = engine.device.type == "cuda"
    floor = Floor.of(engine.model, engine.device) if on_gpu else None
    if floor is not None:
        print(
            f"floor: {floor.weight_bytes / 1e9:.2f} GB of weights and"
            f" {floor.kv_bytes_per_position / 1e3:.1f} kB of KV cache a position per step,"
            f" copy bandwidth {floor.bandwidth / 1e12:.2f} TB/s",
            flush=True,
        )
    try:
        await measure_engine("HFEngine", engine, engine.processor, args, floor)
        if args.hf_generate:
            hf_generate(engine, args, floor)
    finally:
        await engine.close()
    if args.serve:
        del engine
        if on_gpu:
            torch.cuda.empty_cache()
        with served(checkpoint, args) as url:
            server = make_engine(f"hf:{url}", VLProcessor.from_pretrained(checkpoint))
            try:
                await measure_engine(
                    "vistarl engine serve", server, VLProcessor.from_pretrained(checkpoint), args, floor
                )
            finally:
                await server.close()


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument("--engine", help="hf:DIR, hf:URL or sglang:URL (default: --shape's checkpoint)")
    parser.add_argument("--model", help="checkpoint directory of the tokenizer, when --engine is a URL")
    parser.add_argument("--shape", choices=sorted(SHAPES), help="a model shape with random weights")
    parser.add_argument("--checkpoints", help="where --shape's checkpoints are kept (default: a scratch dir)")
    parser.add_argument("--requests", type=int, nargs="+", default=[16], help="concurrent requests, per row")
    parser.add_argument("--prompts", nargs="+", choices=sorted(PROMPTS), default=["text"])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    graphs = "capture each decode step in a CUDA graph (GPU); --no-cuda-graphs: eager steps"
    parser.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=True, help=graphs)
    parser.add_argument("--hf-generate", action="store_true", help="add transformers' generate")
    parser.add_argument("--serve", action="store_true", help="add the same load over vistarl engine serve")
    args = parser.parse_args()
    if args.engine and args.shape:
        parser.error("give --engine or --shape, not both")
    if args.engine and "://" in args.engine and not args.model:
        parser.error("--model is required when --engine is a URL")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
