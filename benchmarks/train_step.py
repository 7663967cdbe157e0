"""Actor update and logprob-recompute throughput of a Qwen2.5-VL-3B- or Qwen3-VL-2B-shaped model, 1 GPU or N.

    .venv/bin/python -m benchmarks.train_step                  # 3B shape, random init, bf16, 1 GPU
    .venv/bin/python -m benchmarks.train_step --shape qwen3_vl_2b   # Qwen3-VL-2B (deepstack included)
    torchrun --nproc_per_node 2 -m benchmarks.train_step       # the same per-GPU work on each of 2 GPUs
    .venv/bin/python -m benchmarks.train_step --compile --micro-batch-tokens 16384
    .venv/bin/python -m benchmarks.train_step --tiny           # the same code path on CPU, in seconds
    .venv/bin/python -m benchmarks.train_step --profile out/   # also write torch.profiler tables to out/

The trainer's own path: `shard_model` (FSDP2 over a one-rank group, fp32 master weights gathered as
bf16, fp32 gradient reduction), gradient checkpointing of each vision block and of each decoder
layer's MLP (`--checkpoint-scope layer`: the whole layer), varlen FlashAttention on GPU (`--sdpa`
runs HF's SDPA path instead, as the CPU does), packed micro-batches of `--micro-batch-tokens` with
4-row position ids, chunked logprobs at response tokens, fused AdamW.
One step = forward + backward over `--micro-batches` micro-batches, then clip + AdamW. Recompute =
the same micro-batches under `torch.no_grad`.

On N ranks (torchrun) each rank takes its own slice of one seeded global batch of N × `--micro-batches`
micro-batches, and tokens/s and MFU are per GPU. The first update's loss and gradient norm are
printed: they depend only on the global batch, so `--nproc_per_node 1 --micro-batches 8` and
`--nproc_per_node 2 --micro-batches 4` must agree to bf16 tolerance.

MFU = k·N·tokens/s / peak, k = 6 for the update and 2 for the recompute, where N counts every
parameter except the input embedding table, with `lm_head` counted even when tied to it (the weights
that multiply each token; vision weights included). Attention FLOPs and checkpoint recomputation are
not counted; `lm_head` runs only at response tokens, so its share is counted for all tokens.
Peak is `--peak-tflops` (989: H100 SXM dense bf16). Prints a markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch.profiler import record_function
from transformers import PretrainedConfig, Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration

from benchmarks.gpu_profile import compile_report, profile_step, sync_report
from benchmarks.harness import add_shape_argument, benchmark_parser, markdown_header
from vistarl.devtools.model_shapes import REAL_SHAPES, SHAPES, Arch, qwen_vl_config
from vistarl.devtools.tiny_checkpoint import write_tiny_checkpoint
from vistarl.httpserver.launch import free_port
from vistarl.trainer.learner.fsdp import init_distributed, rank_device, set_last_micro_batch, shard_model
from vistarl.trainer.learner.logprobs import token_logprobs
from vistarl.trainer.learner.models import ActorModel
from vistarl.trainer.learner.packing import PackedBatch, SequenceSample, pack_sequences, plan_micro_batches
from vistarl.trainer.learner.update import clip_gradients
from vistarl.trainer.learner.vision_passes import VisionPasses
from vistarl.trainer.modeling.attention import SDPA_ATTENTION, use_attention
from vistarl.trainer.rollout.processor import VLProcessor

TEXT_VOCAB = 150_000
MODEL_CLASSES = {
    "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
    "qwen3_vl": Qwen3VLForConditionalGeneration,
}


@dataclass(frozen=True)
class Figures:
    """What one run measured."""

    model: str
    device: str
    world_size: int
    params_counted: int
    micro_batch_tokens: int
    micro_batches: int
    vision_group: int
    uncheckpointed_layers: int
    checkpoint_scope: str
    images_per_seq: int
    attention: str
    compiled: bool
    update_tokens_per_s: float
    update_mfu: float
    recompute_tokens_per_s: float
    recompute_mfu: float
    peak_memory_gib: float
    alloc_retries: int
    first_loss: float
    first_grad_norm: float


def build_actor(config: PretrainedConfig, device: torch.device) -> ActorModel:
    """A randomly initialised fp32 actor of `config`'s architecture, created directly on `device`."""
    with torch.device(device):
        lm = MODEL_CLASSES[config.model_type]._from_config(
            config, attn_implementation="sdpa", dtype=torch.float32
        )
    return ActorModel.from_lm(lm).train()


def counted_params(actor: ActorModel) -> int:
    """N of the MFU formula: every parameter but the input embeddings, plus `lm_head` (tied or not)."""
    total = sum(p.numel() for p in actor.parameters())  # shared (tied) parameters are counted once
    embed = actor.model.get_input_embeddings().weight.numel()
    return int(total - embed + actor.lm_head.weight.numel())


def synthetic_samples(
    processor: VLProcessor, count: int, seq_tokens: int, images_per_seq: int, image_side: int, seed: int = 0
) -> list[SequenceSample]:
    """`count` sequences of `seq_tokens` tokens: images and a random prompt, then a scored half.

    The same seed gives the same sequences, so N ranks can each take a slice of one global batch."""
    rng = np.random.default_rng(seed)
    ids = processor.ids
    samples = []
    for _ in range(count):
        images = [
            Image.fromarray(rng.integers(0, 256, (image_side, image_side, 3), dtype=np.uint8))
            for _ in range(images_per_seq)
        ]
        head = processor.expand_image_pads(
            [ids.im_start] + [ids.vision_start, ids.image_pad, ids.vision_end] * images_per_seq,
            [processor.image_grid(image) for image in images],
        )
        response = seq_tokens // 2
        prompt = seq_tokens - response - len(head)
        if prompt < 1:
            raise ValueError(f"{images_per_seq} images of {image_side}px do not fit in {seq_tokens} tokens")
        train_ids = head + rng.integers(0, TEXT_VOCAB, prompt + response).tolist()
        samples.append(
            SequenceSample(
                train_ids=train_ids,
                loss_mask=[0] * (len(head) + prompt) + [1] * response,
                images=images,
                advantages=[0.0] * (len(head) + prompt) + [float(rng.normal())] * response,
            )
        )
    return samples


def load_processor(path: Path | None, arch: Arch) -> VLProcessor:
    """The processor of `path`, or of a fresh tiny checkpoint of `arch` (the released models' tokenizer and
    image processor)."""
    if path is not None:
        return VLProcessor.from_pretrained(path)
    with tempfile.TemporaryDirectory() as tmp:
        return VLProcessor.from_pretrained(write_tiny_checkpoint(tmp, arch))


def benchmark_config(shape: str, tiny: bool) -> tuple[str, PretrainedConfig]:
    """The model's name in the figures and its config: a released model's shape, or the tiny one of the
    same architecture."""
    arch = REAL_SHAPES[shape]
    if tiny:
        return f"tiny-{_spelled(arch)}", qwen_vl_config(arch, SHAPES["tiny"])
    return f"{_spelled(shape)}-shape", qwen_vl_config(arch, SHAPES[shape])


def _spelled(name: str) -> str:
    """A shape or architecture name as the models spell it: `qwen2_5_vl_3b` -> `qwen2.5-vl-3b`."""
    return name.replace("_5", ".5").replace("_", "-")


def timed(fn: Callable[[], None], device: torch.device, repeats: int) -> float:
    """Seconds per call of `fn`, averaged over `repeats` calls after synchronising the device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - started) / repeats


def run(args: argparse.Namespace) -> Figures:
    """Build the model and this rank's batches, then time the update step and the recompute."""
    device = rank_device()
    rank, world = dist.get_rank(), dist.get_world_size()
    model, config = benchmark_config(args.shape, args.tiny)
    processor = load_processor(args.processor, REAL_SHAPES[args.shape])
    torch.manual_seed(0)  # every rank and every run starts from the same weights
    actor = build_actor(config, device)
    params = counted_params(actor)
    actor = shard_model(
        actor,
        device,
        gradient_checkpointing=True,
        uncheckpointed_layers=args.uncheckpointed_layers,
        checkpoint_scope=args.checkpoint_scope,
        compiled=args.compile,
        keep_gathered=world == 1 if args.keep_gathered is None else args.keep_gathered,
    )
    if args.sdpa:
        use_attention(actor, SDPA_ATTENTION)
    optimizer = torch.optim.AdamW(actor.parameters(), lr=1e-6, fused=device.type == "cuda")

    seqs_per_micro = max(1, args.micro_batch_tokens // args.seq_tokens)
    per_rank = seqs_per_micro * args.micro_batches
    samples = synthetic_samples(
        processor, per_rank * world, args.seq_tokens, args.images_per_seq, args.image_side
    )[rank * per_rank : (rank + 1) * per_rank]
    plan = plan_micro_batches([len(s.train_ids) for s in samples], 1, args.micro_batch_tokens)[0]
    rope_index = actor.model.get_rope_index
    batches: list[PackedBatch] = [
        pack_sequences([samples[i] for i in micro], processor, rope_index).to(device) for micro in plan
    ]
    tokens = sum(int(b.cu_seqlens[-1]) for b in batches)
    scored = _global_sum(sum(len(b.scored) for b in batches), device)
    # FSDP averages gradients over ranks, so each rank's share of the mean loss is scaled by N.
    denominator = scored / world

    score = functools.partial(
        token_logprobs, temperature=1.0, chunk_size=args.chunk_size, compiled=args.compile
    )
    first: dict[str, float] = {}

    def update() -> None:
        vision = VisionPasses(actor, batches, args.vision_group)
        loss_sum = torch.zeros((), device=device)
        for i, batch in enumerate(batches):
            set_last_micro_batch(actor, i == len(batches) - 1)
            with record_function(f"region:micro-batch {i} forward"):
                loss = -(
                    score(actor, batch, image_features=vision.features(i)).logprobs * batch.advantages
                ).sum()
            with record_function(f"region:micro-batch {i} backward"):
                (loss / denominator).backward()
            with record_function(f"region:micro-batch {i} vision backward"):
                vision.backward(i)
            loss_sum += loss.detach()
        with record_function("region:clip"):
            grad_norm = clip_gradients(actor.parameters(), max_norm=1.0)
        with record_function("region:optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if not first:
            first.update(loss=_global_sum(loss_sum, device) / scored, grad_norm=grad_norm)

    @torch.no_grad()
    def recompute() -> None:
        vision = VisionPasses(actor, batches, args.vision_group)
        for i, batch in enumerate(batches):
            with record_function(f"region:micro-batch {i} recompute"):
                score(actor, batch, image_features=vision.features(i))
            vision.backward(i)

    # Compilation, allocator and kernel selection settle here, for each order the timed loops run:
    # an update after a recompute, an update after an update, a recompute after an update.
    for _ in range(args.warmup):
        update()
        update()
        recompute()
    update_s = timed(update, device, args.steps)
    recompute_s = timed(recompute, device, args.steps)
    if args.profile is not None:
        profile_step(update, device, args.profile, "update")
        profile_step(recompute, device, args.profile, "recompute")
        if device.type == "cuda":
            sync_report(update, args.profile / "update_syncs.txt")
        compile_report(args.profile / "compile.txt")
    peak = args.peak_tflops * 1e12
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0
    return Figures(
        model=model,
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        world_size=world,
        params_counted=params,
        micro_batch_tokens=args.micro_batch_tokens,
        micro_batches=len(batches),
        vision_group=args.vision_group,
        uncheckpointed_layers=args.uncheckpointed_layers,
        checkpoint_scope=args.checkpoint_scope,
        images_per_seq=args.images_per_seq,
        attention=actor.config._attn_implementation,
        compiled=args.compile,
        update_tokens_per_s=tokens / update_s,
        update_mfu=6 * params * tokens / update_s / peak,
        recompute_tokens_per_s=tokens / recompute_s,
        recompute_mfu=2 * params * tokens / recompute_s / peak,
        peak_memory_gib=memory,
        alloc_retries=int(torch.cuda.memory_stats(device).get("num_alloc_retries", 0))
        if device.type == "cuda"
        else 0,
        first_loss=first["loss"],
        first_grad_norm=first["grad_norm"],
    )


def _global_sum(value: float | torch.Tensor, device: torch.device) -> float:
    """`value` summed over every rank."""
    total = torch.as_tensor(value, dtype=torch.float64, device=device).clone()
    dist.all_reduce(total)
    return float(total)


def print_figures(figures: Figures) -> None:
    """A markdown table, then the same figures as one JSON line."""
    print(
        f"model={figures.model} device={figures.device} x{figures.world_size} "
        f"N={figures.params_counted / 1e9:.3f}B attention={figures.attention} compiled={figures.compiled} "
        f"first loss={figures.first_loss:.6f} first grad norm={figures.first_grad_norm:.6f}"
    )
    print(markdown_header("pass", "tokens/s per GPU", "MFU", text=("pass",)))
    print(f"| update (fwd+bwd+AdamW) | {figures.update_tokens_per_s:,.0f} | {figures.update_mfu:.1%} |")
    print(f"| logprob recompute | {figures.recompute_tokens_per_s:,.0f} | {figures.recompute_mfu:.1%} |")
    print(json.dumps(asdict(figures)))


@contextlib.contextmanager
def process_group() -> Iterator[None]:
    """The process group torchrun describes, or a one-rank group when not launched by torchrun, so FSDP2
    runs as in training; destroyed on the way out."""
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1"
        )
    init_distributed()
    try:
        yield
    finally:
        dist.destroy_process_group()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = benchmark_parser(__doc__)
    parser.add_argument("--tiny", action="store_true", help="tiny config on CPU: checks the code path")
    add_shape_argument(parser)
    parser.add_argument("--steps", type=int, default=5, help="timed steps (after warm-up)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches per optimizer step")
    parser.add_argument("--seq-tokens", type=int, default=2048, help="tokens per packed sequence")
    parser.add_argument("--images-per-seq", type=int, default=1)
    parser.add_argument("--image-side", type=int, default=448, help="448 px -> 256 image tokens")
    parser.add_argument(
        "--vision-group",
        type=int,
        default=4,
        help="micro-batches per vision-tower pass (the config's train.vision_pass_micro_batches)",
    )
    parser.add_argument(
        "--uncheckpointed-layers",
        type=int,
        default=0,
        help="the last N decoder layers keep their activations (the config's model.uncheckpointed_layers)",
    )
    parser.add_argument(
        "--checkpoint-scope",
        choices=["layer", "mlp"],
        default="mlp",
        help="what a checkpointed decoder layer recomputes (the config's model.checkpoint_scope; the GPU "
        "config's choice)",
    )
    parser.add_argument("--chunk-size", type=int, default=2048, help="logprob chunk (rows of logits)")
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="torch.compile each layer and block, and the logprob chunks (the GPU config's model.compile)",
    )
    parser.add_argument(
        "--keep-gathered",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="keep gathered bf16 weights through the step (default: the trainer's choice, on one rank only)",
    )
    parser.add_argument("--sdpa", action="store_true", help="HF's SDPA attention (dense packed mask)")
    parser.add_argument("--profile", type=Path, help="write torch.profiler op tables to this directory")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--processor", type=Path, help="a checkpoint dir of the shape's architecture")
    known = parser.parse_known_args(argv)[0]
    if known.tiny:
        # Qwen3-VL's image processor gives even a small image 64 tokens, so its sequences are longer.
        seq_tokens = 256 if REAL_SHAPES[known.shape] == "qwen3_vl" else 128
        parser.set_defaults(
            micro_batch_tokens=4 * seq_tokens,
            seq_tokens=seq_tokens,
            image_side=56,
            steps=2,
            warmup=1,
            compile=False,
        )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark on this rank; rank 0 prints."""
    args = parse_args(argv)
    with process_group():
        figures = run(args)
        if dist.get_rank() == 0:
            print_figures(figures)


if __name__ == "__main__":
    main()
