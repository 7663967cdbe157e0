"""Generation throughput of an engine under concurrent requests, as a rollout worker drives it.

    .venv/bin/python -m benchmarks.engine_generate                       # tiny Qwen2.5-VL, HFEngine
    .venv/bin/python -m benchmarks.engine_generate --engine hf:DIR --max-batch-size 1
    .venv/bin/python -m benchmarks.engine_generate --engine hf:http://127.0.0.1:30000 --model DIR

Prints generated tokens per second and the latency percentiles of one `generate` call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.harness import benchmark_parser
from devtools.tiny_checkpoint import write_tiny_checkpoint
from trainer.rollout.engines.base import Engine, GenerateRequest
from trainer.rollout.engines.hf import HFEngine
from trainer.rollout.engines.loading import make_engine
from trainer.rollout.engines.sglang_api import SamplingParams
from trainer.rollout.processor import VLProcessor


async def measure(engine: Engine, processor: VLProcessor, requests: int, new_tokens: int) -> None:
    """Send `requests` greedy text requests at once and print throughput and latency percentiles."""
    prompt = processor.tokenizer.encode(
        "<|im_start|>user\nTell me a story.<|im_end|>\n<|im_start|>assistant\n"
    )
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)

    async def one() -> float:
        started = time.perf_counter()
        result = await engine.generate(GenerateRequest(engine_ids=prompt, sampling=params))
        if result.aborted:
            raise RuntimeError(f"generation aborted: {result.finish_reason.message}")
        return time.perf_counter() - started

    await one()  # warm-up
    started = time.perf_counter()
    latencies = await asyncio.gather(*(one() for _ in range(requests)))
    elapsed = time.perf_counter() - started
    p50, p90 = (statistics.quantiles(latencies, n=10)[i] for i in (4, 8))
    print(f"requests={requests} new_tokens={new_tokens} wall={elapsed:.2f}s")
    print(f"throughput={requests * new_tokens / elapsed:.1f} tokens/s  p50={p50:.2f}s  p90={p90:.2f}s")
    if isinstance(engine, HFEngine):
        stats = engine.stats
        mean = stats.rows / stats.batches
        print(f"batches={stats.batches} mean_batch={mean:.1f} largest={stats.largest_batch}")


async def run(spec: str, model: str, args: argparse.Namespace) -> None:
    """Build the engine named by `spec` (its tokenizer from `model`) and measure it."""
    remote = "://" in spec
    options = {} if remote else {"max_batch_size": args.max_batch_size, "device": args.device}
    processor = VLProcessor.from_pretrained(model)
    engine = make_engine(spec, processor, **options)
    try:
        await measure(engine, processor, args.requests, args.new_tokens)
    finally:
        await engine.close()


def main() -> None:
    parser = benchmark_parser(__doc__)
    parser.add_argument(
        "--engine", help="hf:DIR, hf:URL or sglang:URL (default: a tiny checkpoint, in process)"
    )
    parser.add_argument(
        "--model", help="checkpoint directory of the tokenizer, needed when --engine is a URL"
    )
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.engine and "://" in args.engine and not args.model:
        parser.error("--model is required when --engine is a URL")
    with tempfile.TemporaryDirectory() as tmp:
        if args.engine is None:
            tiny = write_tiny_checkpoint(Path(tmp) / "tiny")
            asyncio.run(run(f"hf:{tiny}", str(tiny), args))
        else:
            asyncio.run(run(args.engine, args.model or args.engine.partition(":")[2], args))


if __name__ == "__main__":
    main()
