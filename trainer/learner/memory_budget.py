"""A run's peak GPU memory per rank, estimated from the model's shapes and the run's settings, and the check
that refuses a run that cannot fit before any model is loaded (docs/fsdp.md, "Memory").

The parts, in bytes:

- each trained model (the actor; the critic, for GAE): its float32 master weights, and AdamW's two
  moments of its trainable parameters (`train.optimizer_state_dtype`: 4 or 2 bytes each), sharded over the
  ranks; with `train.optimizer_offload: critic` the critic's are in host memory;
- the frozen reference (with a KL term): float32 weights, sharded;
- the embedded engine (`rollout.engine: hf` on the trainer's GPU, one a rank): weights in `model.dtype`,
  the static KV cache of its share of the episodes in flight (`RolloutConfig.engine_batch`) at
  `rollout.rollout_max_context_len` positions each, one prompt pass's MLP over a whole context, and its
  prefix cache at its bound (`rollout.prefix_cache_mb`); an engine server on the same GPU is not counted:
  its memory is not free;
- while a model trains (`PolicyTrainer.optimize`: the actor, then the critic, never both at once): its
  float32 gradients (of the critic's root unit alone when offloaded), the bfloat16 copy of its weights that
  compute reads (the whole model on one rank, `keep_gathered`; the root, the vision tower and two decoder
  layers on several), and one micro-batch's activations.

Activations of a micro-batch of T tokens (`train.micro_batch_tokens`, or a rank's share of a whole
mini-batch when that is less), in the compute dtype: each decoder layer keeps what its checkpointing scope
leaves it (the layer's input; with `checkpoint_scope: mlp` its attention's activations as well; all of them
in the `uncheckpointed_layers`), one layer's whole activations exist again while backward works on it, and
the actor's chunked logprobs hold a few float32 [1024, vocab] tensors. The vision tower keeps, for the
`train.vision_pass_micro_batches` micro-batches of a pass, its blocks' inputs for every patch, with three
tokens in four counted as image tokens (`IMAGE_TOKEN_SHARE`; each one `spatial_merge_size²` patches). The
token counts are the config's bounds (a micro-batch full, every episode at its context limit), so the
estimate is above what a run of shorter episodes takes.

The peak is the larger of the two models' passes, plus a margin for the allocator's fragmentation and the
CUDA libraries' workspaces. Parameter counts are exact: the model is built from its config on the meta
device, which allocates nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForImageTextToText, PretrainedConfig

from vistarl.trainer.config import TrainConfig
from vistarl.trainer.learner.fsdp import is_distributed
from vistarl.trainer.overrides import apply_overrides

logger = logging.getLogger(__name__)

__all__ = [
    "GIB",
    "Budget",
    "MemoryBudgetError",
    "ModelCounts",
    "check_budget",
    "estimate_budget",
    "model_counts",
    "preflight",
]

GIB = 2**30
FRAGMENTATION = 0.05
"""The share of the estimate kept free for the caching allocator's fragmentation."""
WORKSPACE_BYTES = GIB
"""cuBLAS and NCCL workspaces, and the CUDA graphs' and compiled kernels' pools."""
LOGPROB_CHUNK = 1024
"""Scored positions per logprob chunk (`trainer/learner/logprobs.py`, `DEFAULT_CHUNK_SIZE`)."""
LOGPROB_CHUNK_COPIES = 3
"""float32 [chunk, vocab] tensors alive at once in a chunk's backward: logits, softmax, their gradient."""
IMAGE_TOKEN_SHARE = 0.75
"""The share of a micro-batch's tokens counted as image tokens: VSI's episodes, the most image-heavy of
the envs here, are about 70% image tokens (16 images of 196 tokens in 4.5k), Geo3k's and Sokoban's less."""
MARGIN = "margin"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class MemoryBudgetError(RuntimeError):
    """A run whose estimated peak does not fit the GPU; the message says what to change."""


@dataclass(frozen=True)
class ModelCounts:
    """What the estimate needs of a checkpoint: its parameter counts and widths."""

    params: int  # the actor's: backbone and lm_head, a tied lm_head counted once
    critic_params: int  # the backbone and a scalar value head
    vision_params: int
    embedding_params: int
    layer_params: int  # one decoder layer
    hidden: int
    intermediate: int
    layers: int
    q_width: int  # attention heads x head dim
    kv_width: int  # key-value heads x head dim
    vocab: int
    vision_hidden: int
    vision_intermediate: int
    vision_depth: int
    merge: int  # spatial_merge_size: an image token is merge² patches

    @classmethod
    def of(cls, config: PretrainedConfig) -> ModelCounts:
        """Counted on a meta-device build of `config`'s HF image-text-to-text model."""
        with torch.device("meta"):
            lm = AutoModelForImageTextToText.from_config(config)
        text, vision = config.get_text_config(), config.vision_config
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        backbone = sum(p.numel() for p in lm.model.parameters())
        return cls(
            params=sum(p.numel() for p in lm.parameters()),
            critic_params=backbone + text.hidden_size + 1,
            vision_params=sum(p.numel() for p in lm.model.visual.parameters()),
            embedding_params=lm.model.get_input_embeddings().weight.numel(),
            layer_params=sum(p.numel() for p in lm.model.language_model.layers[0].parameters()),
            hidden=text.hidden_size,
            intermediate=text.intermediate_size,
            layers=text.num_hidden_layers,
            q_width=text.num_attention_heads * head_dim,
            kv_width=text.num_key_value_heads * head_dim,
            vocab=text.vocab_size,
            vision_hidden=vision.hidden_size,
            vision_intermediate=vision.intermediate_size,
            vision_depth=vision.depth,
            merge=vision.spatial_merge_size,
        )


def model_counts(path: str | Path) -> ModelCounts:
    """The counts of the checkpoint directory `path` (its config.json alone is read)."""
    return ModelCounts.of(AutoConfig.from_pretrained(str(path), local_files_only=True))


@dataclass(frozen=True)
class Budget:
    """The estimated bytes of each part at the run's peak, `(owner, part)` -> bytes, and which pass it is."""

    parts: Mapping[tuple[str, str], float]
    peak_pass: str

    @property
    def total(self) -> float:
        """The estimated peak in bytes, margin included."""
        return sum(self.parts.values())

    @property
    def tensors(self) -> float:
        """The estimated peak of the tensors alone (what `torch.cuda.max_memory_allocated` counts)."""
        return self.total - sum(size for (owner, _), size in self.parts.items() if owner == MARGIN)

    def lines(self) -> list[str]:
        """One line per owner: its parts in GiB."""
        owners: dict[str, list[str]] = {}
        for (owner, part), size in self.parts.items():
            owners.setdefault(owner, []).append(f"{part} {size / GIB:.1f}")
        return [f"{owner}: {', '.join(parts)} GiB" for owner, parts in owners.items()]


def estimate_budget(cfg: TrainConfig, counts: ModelCounts, world: int = 1) -> Budget:
    """The peak of a rank of `world` ranks on a GPU under `cfg` (see the module docstring)."""
    state_bytes = 2 * DTYPE_BYTES[cfg.train.optimizer_state_dtype]
    actor_trained = counts.params - (counts.vision_params if cfg.model.freeze_vision else 0)
    parts: dict[tuple[str, str], float] = {
        ("actor", "weights"): 4 * counts.params / world,
        ("actor", "AdamW state"): state_bytes * actor_trained / world,
    }
    offloaded = cfg.train.optimizer_offload == "critic"
    if cfg.algo.needs_critic and not offloaded:
        parts[("critic", "weights")] = 4 * counts.critic_params / world
        parts[("critic", "AdamW state")] = state_bytes * counts.critic_params / world
    if cfg.algo.use_kl:
        parts[("reference", "weights")] = 4 * counts.params / world
    if cfg.rollout.engine_url is None:
        parts |= _engine_parts(cfg, counts, world)
    passes = {"the actor's update": _pass_parts(cfg, counts, world, "actor", actor_trained)}
    if cfg.algo.needs_critic:
        critic_grads = counts.embedding_params if offloaded else counts.critic_params / world
        passes["the critic's update"] = _pass_parts(cfg, counts, world, "critic", critic_grads)
    peak_pass, peak = max(passes.items(), key=lambda item: sum(item[1].values()))
    parts |= peak
    parts[(MARGIN, "allocator and CUDA libraries")] = FRAGMENTATION * sum(parts.values()) + WORKSPACE_BYTES
    return Budget(parts, peak_pass)


def _pass_parts(
    cfg: TrainConfig, counts: ModelCounts, world: int, owner: str, gradients: float
) -> dict[tuple[str, str], float]:
    """What exists only while `owner` trains: its gradients (`gradients` parameters' worth), its compute
    copy and one micro-batch's activations."""
    compute = _compute_bytes(cfg)
    params = counts.params if owner == "actor" else counts.critic_params
    if world == 1:
        gathered = params * compute if compute == 2 else 0.0
    else:
        gathered = 2.0 * (counts.embedding_params + counts.vision_params + 2 * counts.layer_params)
    vision_trains = owner == "critic" or not cfg.model.freeze_vision
    return {
        (owner, "gradients"): 4 * gradients,
        (owner, "compute copy"): gathered,
        (owner, "activations"): _activations(cfg, counts, world, vision_trains, owner == "actor"),
    }


def _activations(
    cfg: TrainConfig, counts: ModelCounts, world: int, vision_trains: bool, logprobs: bool
) -> float:
    """One micro-batch's activations kept for backward, and backward's largest working set, in bytes."""
    compute = _compute_bytes(cfg)
    model = cfg.model
    share = math.ceil(cfg.mini_batch_size / world) * cfg.rollout.rollout_max_context_len
    tokens = min(cfg.train.micro_batch_tokens, share)
    h = counts.hidden
    attention = 4 * h + 2 * counts.q_width + 2 * counts.kv_width  # norms' inputs and outputs, q k v, output
    whole_layer = attention + 4 * counts.intermediate  # and the MLP's gate, up, activation and product
    if not model.gradient_checkpointing:
        per_layer = whole_layer
    else:
        per_layer = h if model.checkpoint_scope == "layer" else attention
    kept = (
        model.uncheckpointed_layers * whole_layer + (counts.layers - model.uncheckpointed_layers) * per_layer
    )
    image_tokens = min(cfg.train.vision_pass_micro_batches * tokens, share) * IMAGE_TOKEN_SHARE
    patches = image_tokens * counts.merge**2
    block = 8 * counts.vision_hidden + 4 * counts.vision_intermediate
    vision_kept = counts.vision_hidden if model.gradient_checkpointing else block
    working: list[float] = [tokens * whole_layer * compute]
    if logprobs:
        working.append(LOGPROB_CHUNK_COPIES * 4 * min(LOGPROB_CHUNK, tokens) * counts.vocab)
    vision = 2 * image_tokens * h * compute  # the pass's features, and their gradients
    if vision_trains:
        vision += patches * counts.vision_depth * vision_kept * compute
        working.append(patches * block * compute)
    return tokens * (kept + 3 * h) * compute + vision + max(working)


def _engine_parts(cfg: TrainConfig, counts: ModelCounts, world: int) -> dict[tuple[str, str], float]:
    """The embedded engine on the trainer's GPU, one of `world` (one a rank): weights, the static KV cache
    of its share of the episodes in flight, one prompt pass's MLP, and its prefix cache at its bound."""
    size = DTYPE_BYTES[cfg.model.dtype]
    context = cfg.rollout.rollout_max_context_len
    kv = cfg.rollout.engine_batch(world) * context * counts.layers * 2 * counts.kv_width * size
    parts: dict[tuple[str, str], float] = {
        ("engine", "weights"): counts.params * size,
        ("engine", "KV cache"): kv,
        ("engine", "prompt pass"): context * (3 * counts.intermediate + 2 * counts.hidden) * size,
    }
    if cfg.rollout.prefix_cache:
        parts[("engine", "prefix cache")] = cfg.rollout.prefix_cache_mb * 2**20
    return parts


def _compute_bytes(cfg: TrainConfig) -> int:
    """Bytes of an activation: bfloat16 on a GPU unless `model.compute_dtype` says float32."""
    return 4 if cfg.model.compute_dtype == "float32" else 2


CANDIDATES: tuple[tuple[str, Callable[[TrainConfig], bool]], ...] = (
    ("train.optimizer_state_dtype=bfloat16", lambda c: c.train.optimizer_state_dtype == "float32"),
    ("train.optimizer_offload=critic", lambda c: c.algo.needs_critic and c.train.optimizer_offload == "none"),
    ("model.gradient_checkpointing=true", lambda c: not c.model.gradient_checkpointing),
    ("model.checkpoint_scope=layer", lambda c: c.model.checkpoint_scope == "mlp"),
    ("model.uncheckpointed_layers=0", lambda c: c.model.uncheckpointed_layers > 0),
    ("train.vision_pass_micro_batches=1", lambda c: c.train.vision_pass_micro_batches > 1),
    ("model.freeze_vision=true", lambda c: not c.model.freeze_vision),
)
"""Settings that lower the peak, each with when it applies (a change of the run's memory alone, or,
the last, of what trains)."""


def _changes(cfg: TrainConfig) -> list[str]:
    """The overrides that could lower `cfg`'s peak: the candidates that apply, a halved micro-batch budget
    (never below one whole episode) and, with the embedded engine, half as many episodes at once."""
    changes = [override for override, applies in CANDIDATES if applies(cfg)]
    half = max(cfg.train.micro_batch_tokens // 2, cfg.rollout.rollout_max_context_len)
    if half < cfg.train.micro_batch_tokens:
        changes.append(f"train.micro_batch_tokens={half}")
    if cfg.rollout.engine_url is None and cfg.rollout.concurrency > 1:
        changes.append(f"rollout.concurrency={cfg.rollout.concurrency // 2}")
    return changes


def _changed(cfg: TrainConfig, overrides: list[str]) -> TrainConfig:
    """`cfg` with dotted overrides applied, validated again."""
    raw = cfg.model_dump(mode="json")
    apply_overrides(raw, overrides, TrainConfig)
    return TrainConfig.model_validate(raw)


def check_budget(
    cfg: TrainConfig, counts: ModelCounts, available: float, *, world: int = 1, where: str = "a GPU"
) -> Budget:
    """The budget of `cfg`, or a `MemoryBudgetError` when it exceeds `available` bytes, naming the parts,
    each change that would lower the peak (by how much, and whether it alone fits), and a set of changes
    that fits together, found greedily, the largest saving first."""
    budget = estimate_budget(cfg, counts, world)
    if budget.total <= available:
        return budget
    lines = [
        f"the run's estimated peak GPU memory, {budget.total / GIB:.1f} GiB (in {budget.peak_pass}), does "
        f"not fit the {available / GIB:.1f} GiB planned for ({where}):",
        *(f"  {line}" for line in budget.lines()),
    ]
    options = {
        change: estimate_budget(_changed(cfg, [change]), counts, world).total for change in _changes(cfg)
    }
    savings = sorted(options.items(), key=lambda item: item[1])
    if savings and savings[0][1] < budget.total:
        lines.append("to fit, change (the estimated peak after each change alone):")
        for change, total in savings:
            if total < budget.total:
                fits = ", fits" if total <= available else ""
                lines.append(f"  {total / GIB:.1f} GiB{fits}: --set {change}")
    together = _fitting_set(cfg, counts, world, available)
    if together is not None and len(together[0]) > 1:
        sets = " ".join(f"--set {change}" for change in together[0])
        lines.append(f"together, {together[1] / GIB:.1f} GiB: {sets}")
    lines.append(
        "or train on more GPUs (torchrun --nproc-per-node), which shard the weights, gradients and AdamW "
        "state; train.memory_check=warn starts anyway, and train.gpu_memory_gib sets the memory planned for"
    )
    raise MemoryBudgetError("\n".join(lines))


def _fitting_set(
    cfg: TrainConfig, counts: ModelCounts, world: int, available: float
) -> tuple[list[str], float] | None:
    """Changes that together bring the peak within `available`, taken the largest saving first; None when
    even all of them do not."""
    chosen: list[str] = []
    current = cfg
    total = estimate_budget(cfg, counts, world).total
    while total > available:
        options = {
            change: estimate_budget(_changed(current, [change]), counts, world).total
            for change in _changes(current)
            if change.partition("=")[0] not in {c.partition("=")[0] for c in chosen}
        }
        if not options or min(options.values()) >= total:
            return None
        change = min(options, key=lambda key: options[key])
        chosen.append(change)
        current, total = _changed(current, [change]), options[change]
    return chosen, total


def preflight(cfg: TrainConfig, model_path: str | Path, device: torch.device) -> Budget | None:
    """The trainer's check at start, before a model loads: the budget of the checkpoint at `model_path`
    under `cfg` against `train.gpu_memory_gib`, else the least free memory of any rank's GPU. Refuses
    (`MemoryBudgetError`) or, with `train.memory_check: warn`, logs; None when the check is off, or on the
    CPU with no `train.gpu_memory_gib` to plan for."""
    train = cfg.train
    if train.memory_check == "off" or (device.type != "cuda" and train.gpu_memory_gib is None):
        return None
    world = dist.get_world_size() if is_distributed() else 1
    if train.gpu_memory_gib is not None:
        available, where = train.gpu_memory_gib * GIB, f"train.gpu_memory_gib={train.gpu_memory_gib:g}"
    else:
        free, total = torch.cuda.mem_get_info(device)
        available = _least_over_ranks(free, device)
        where = f"free on {device} at start, of {total / GIB:.1f} GiB"
    counts = model_counts(model_path)
    try:
        return check_budget(cfg, counts, available, world=world, where=where)
    except MemoryBudgetError as exc:
        if train.memory_check == "refuse":
            raise
        logger.warning("%s", exc)
        return estimate_budget(cfg, counts, world)


def _least_over_ranks(free: int, device: torch.device) -> float:
    """The least of every rank's `free` bytes (this rank's alone without a process group), so that every
    rank takes the same decision."""
    if not is_distributed():
        return float(free)
    least = torch.tensor(float(free), dtype=torch.float64, device=device)
    dist.all_reduce(least, op=dist.ReduceOp.MIN)
    return float(least.item())
