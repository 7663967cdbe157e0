"""Push the trainer's weights to a generation engine, and check that the engine then scores like the trainer.

Three transports, one interface (`WeightSync.push(state_dict, version)`):

- `InProcessSync`: copy the state dict into an in-process `HFEngine` (live module names).
- `DiskSync`: write an HF checkpoint directory and ask the engine to load it
  (`/update_weights_from_disk`); works for SGLang and for `vistarl engine serve`.
- `DistributedSync`: SGLang's NCCL path. Trainer rank 0 and the engine's ranks form a process group
  (`/init_weights_update_group`); then, bucket by bucket, one `/update_weights_from_distributed` call
  announces names, dtypes and shapes while rank 0 broadcasts the tensors in that order. The HTTP call
  and the broadcast block on each other, so they run concurrently.

Engines load checkpoint names, not live module names: transformers 5 names Qwen2.5-VL's modules
`model.language_model.*` / `model.visual.*`, while its checkpoints (and SGLang's loader) say
`model.*` / `visual.*`; Qwen3-VL checkpoints already use the live names. `checkpoint_name` and
`live_name` map between the two; a tied `lm_head.weight` is left out, as in the checkpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import shutil
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from PIL import Image
from safetensors.torch import save_file
from transformers import PretrainedConfig, PreTrainedModel

from clients.images import encode_image
from trainer.learner.logprobs import sequence_logprobs
from trainer.learner.models import ActorModel
from trainer.rollout.engines.base import Engine, GenerateRequest
from trainer.rollout.engines.hf import HFEngine
from trainer.rollout.engines.sglang import SGLangEngine
from trainer.rollout.engines.sglang_api import (
    InitWeightsUpdateGroupBody,
    SamplingParams,
    UpdateWeightsFromDistributedBody,
)
from trainer.rollout.processor import VLProcessor
from trainer.rollout.tokenization import TurnEncoder

__all__ = [
    "DiskSync",
    "DistributedSync",
    "InProcessSync",
    "WeightSync",
    "WeightSyncMismatch",
    "bucket_tensors",
    "checkpoint_name",
    "distributed_bodies",
    "init_weight_update_group",
    "live_name",
    "save_hf_weights",
    "to_checkpoint_state",
    "verify_weight_sync",
]

log = logging.getLogger(__name__)

# (live prefix, checkpoint prefix) per `config.model_type`; the first matching prefix wins.
CHECKPOINT_PREFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "qwen2_5_vl": (("model.language_model.", "model."), ("model.visual.", "visual.")),
    "qwen3_vl": (),
}
TIED_HEAD = "lm_head.weight"
WEIGHTS_FILE = "model.safetensors"
# Files of a checkpoint directory that hold weights (or their index) or the config: written, not copied.
_WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.safetensors.index.json", "config.json")
DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024
DEFAULT_GROUP_NAME = "vistarl_weight_sync"
CLOSE_TIMEOUT_S = 30.0


class WeightSyncMismatch(AssertionError):
    """After a sync, the engine's logprobs differ from the trainer's by more than the tolerance."""


# --- names -------------------------------------------------------------------------------------


def _prefixes(model_type: str) -> tuple[tuple[str, str], ...]:
    """The prefix renames of one architecture; an unknown one is an error naming the known ones."""
    try:
        return CHECKPOINT_PREFIXES[model_type]
    except KeyError:
        known = ", ".join(sorted(CHECKPOINT_PREFIXES))
        raise ValueError(
            f"no checkpoint naming known for model_type {model_type!r} (known: {known})"
        ) from None


def checkpoint_name(name: str, model_type: str) -> str:
    """The checkpoint (and SGLang) name of a live parameter name."""
    for live, saved in _prefixes(model_type):
        if name.startswith(live):
            return saved + name[len(live) :]
    return name


def live_name(name: str, model_type: str) -> str:
    """The live module name of a checkpoint parameter name: the inverse of `checkpoint_name`."""
    for live, saved in _prefixes(model_type):
        if name.startswith(saved) and not name.startswith(live):
            return live + name[len(saved) :]
    return name


def to_checkpoint_state(
    state_dict: Mapping[str, torch.Tensor], config: PretrainedConfig, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """The state dict under checkpoint names, cast to `dtype` if given; a tied `lm_head` is dropped."""
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return {
        checkpoint_name(name, config.model_type): tensor if dtype is None else tensor.to(dtype)
        for name, tensor in state_dict.items()
        if not (tied and name == TIED_HEAD)
    }


def save_hf_weights(
    state_dict: Mapping[str, torch.Tensor],
    config: PretrainedConfig,
    out_dir: str | Path,
    source_dir: str | Path,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write an HF checkpoint directory: config, weights under checkpoint names, and `source_dir`'s
    tokenizer / processor / template files, so `from_pretrained(out_dir)` and SGLang load it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for path in Path(source_dir).iterdir():
        if path.is_file() and not any(path.match(pattern) for pattern in _WEIGHT_PATTERNS):
            shutil.copy2(path, out / path.name)
    saved = to_checkpoint_state(state_dict, config, dtype)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in saved.items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    config = copy.deepcopy(config)
    if dtype is not None:
        config.dtype = dtype
    config.save_pretrained(out)
    return out


# --- buckets for the distributed path ------------------------------------------------------------


def bucket_tensors(
    named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> list[list[tuple[str, torch.Tensor]]]:
    """Split tensors, in order, into buckets of at most `bucket_bytes`; a larger tensor gets its own."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    buckets: list[list[tuple[str, torch.Tensor]]] = []
    current: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named:
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append((name, tensor))
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def distributed_bodies(
    buckets: Sequence[Sequence[tuple[str, torch.Tensor]]], group_name: str, weight_version: str
) -> list[UpdateWeightsFromDistributedBody]:
    """One `/update_weights_from_distributed` body per bucket; the last flushes and sets the version."""
    last = len(buckets) - 1
    return [
        UpdateWeightsFromDistributedBody(
            names=[name for name, _ in bucket],
            dtypes=[str(tensor.dtype).removeprefix("torch.") for _, tensor in bucket],
            shapes=[list(tensor.shape) for _, tensor in bucket],
            group_name=group_name,
            flush_cache=i == last,
            weight_version=weight_version if i == last else None,
        )
        for i, bucket in enumerate(buckets)
    ]


def init_weight_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str = DEFAULT_GROUP_NAME,
    backend: str = "nccl",
    timeout: timedelta = timedelta(minutes=10),
) -> dist.ProcessGroup:
    """Join a process group outside the default one, exactly as SGLang's engine side joins it.

    Both sides must lay out the rendezvous store the same way, so this mirrors SGLang's
    `init_custom_process_group` (a TCP store served by rank 0, a `PrefixStore` named after the group,
    then torch's own group constructor); torch has no public API for a second world group. The store
    is made here rather than by `torch.distributed.rendezvous`, which under torchrun
    (`TORCHELASTIC_USE_AGENT_STORE`) makes rank 0 a client of a store nobody serves, and waits forever.
    """
    from torch.distributed.distributed_c10d import (
        GroupName,
        PrefixStore,
        _new_process_group_helper,
        _world,
    )

    store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        dist.Backend(backend),
        PrefixStore(group_name, store),
        group_name=GroupName(group_name),
        timeout=timeout,
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


# --- transports --------------------------------------------------------------------------------


class WeightSync(Protocol):
    """Pushes a full state dict (live names, CPU) to one engine as `version`."""

    async def push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Make the engine generate with these weights, reporting `str(version)` as its weight version."""
        ...

    async def close(self) -> None:
        """Release what the transport holds (files, process groups)."""
        ...


class InProcessSync:
    """Copy weights into an `HFEngine` living in this process."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine = engine

    async def push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """`HFEngine.update_weights`, which waits for the running batch."""
        await self.engine.update_weights(dict(state_dict), str(version))

    async def close(self) -> None:
        """Nothing to release."""


class DiskSync:
    """Write an HF directory per version under `root` and have the engine load it; older ones are removed.

    With `pause`, generation is paused around the load (SGLang's `/pause_generation` in `retract`
    mode keeps in-flight requests, which resume on the new weights).
    """

    def __init__(
        self,
        engine: Engine,
        root: str | Path,
        config: PretrainedConfig,
        source_dir: str | Path,
        *,
        dtype: torch.dtype | None = None,
        pause: bool = False,
    ) -> None:
        self.engine = engine
        self.root = Path(root)
        self.config = config
        self.source_dir = Path(source_dir)
        self.dtype = dtype
        self.pause = pause
        self._previous: Path | None = None

    async def push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Save, load on the engine, then delete the previous version's directory."""
        path = self.root / f"policy-v{version:06d}"
        await asyncio.to_thread(save_hf_weights, state_dict, self.config, path, self.source_dir, self.dtype)
        async with _paused(self.engine, self.pause):
            await self.engine.update_weights_from_disk(str(path.resolve()), str(version))
        if self._previous is not None and self._previous != path:
            shutil.rmtree(self._previous, ignore_errors=True)
        self._previous = path

    async def close(self) -> None:
        """Keep the last directory: it is the weights the engine serves."""


@dataclass(frozen=True)
class DistributedTarget:
    """Where trainer rank 0 meets an SGLang server's ranks for weight broadcasts."""

    master_address: str
    master_port: int
    engine_world_size: int = 1
    group_name: str = DEFAULT_GROUP_NAME
    backend: str = "nccl"
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout: timedelta = timedelta(minutes=10)


class DistributedSync:
    """SGLang's NCCL weight update, driven from trainer rank 0 (see the module docstring)."""

    def __init__(
        self,
        engine: SGLangEngine,
        target: DistributedTarget,
        config: PretrainedConfig,
        *,
        device: torch.device,
        dtype: torch.dtype | None = None,
        pause: bool = True,
    ) -> None:
        self.engine = engine
        self.target = target
        self.config = config
        self.device = device
        self.dtype = dtype
        self.pause = pause
        self._group: dist.ProcessGroup | None = None

    async def connect(self) -> None:
        """Form the group: the engine's `/init_weights_update_group` and rank 0's join, concurrently."""
        t = self.target
        body = InitWeightsUpdateGroupBody(
            master_address=t.master_address,
            master_port=t.master_port,
            rank_offset=1,
            world_size=1 + t.engine_world_size,
            group_name=t.group_name,
            backend=t.backend,
        )
        join = asyncio.to_thread(
            init_weight_update_group,
            t.master_address,
            t.master_port,
            0,
            1 + t.engine_world_size,
            t.group_name,
            t.backend,
            t.timeout,
        )
        _, self._group = await asyncio.gather(self.engine.init_weights_update_group(body), join)

    async def push(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Broadcast bucket by bucket, each alongside its HTTP call; the last one sets the version."""
        if self._group is None:
            await self.connect()
        saved = to_checkpoint_state(state_dict, self.config, self.dtype)
        buckets = bucket_tensors(saved.items(), self.target.bucket_bytes)
        bodies = distributed_bodies(buckets, self.target.group_name, str(version))
        async with _paused(self.engine, self.pause):
            for bucket, body in zip(buckets, bodies, strict=True):
                await asyncio.gather(
                    self.engine.update_weights_from_distributed(body),
                    asyncio.to_thread(self._broadcast, bucket),
                )

    def _broadcast(self, bucket: Sequence[tuple[str, torch.Tensor]]) -> None:
        """Rank 0's side of one bucket: each tensor in the announced order, each wait bounded."""
        for _, tensor in bucket:
            work = dist.broadcast(tensor.to(self.device), src=0, group=self._group, async_op=True)
            assert work is not None
            work.wait(self.target.timeout)

    async def close(self) -> None:
        """Leave the weight-update group, waiting at most `CLOSE_TIMEOUT_S`: NCCL's teardown can wait for
        an engine that stays in the group, so it runs on a daemon thread that may outlive the wait."""
        if self._group is None:
            return
        leaving = threading.Thread(
            target=dist.destroy_process_group, args=(self._group,), name="vistarl-leave-group", daemon=True
        )
        self._group = None
        leaving.start()
        await asyncio.to_thread(leaving.join, CLOSE_TIMEOUT_S)
        if leaving.is_alive():
            log.warning(
                "left the weight-update group without NCCL's teardown (%.0f s passed)", CLOSE_TIMEOUT_S
            )


@contextlib.asynccontextmanager
async def _paused(engine: Engine, pause: bool) -> Any:
    """Pause an SGLang engine's generation for the block (retracting in-flight requests), then resume it."""
    if not (pause and isinstance(engine, SGLangEngine)):
        yield
        return
    await engine.pause_generation("retract")
    try:
        yield
    finally:
        await engine.continue_generation()


# --- the check ---------------------------------------------------------------------------------


def probe_messages() -> list[dict[str, Any]]:
    """A system prompt and a user turn with one small image: the probe a sync check generates from."""
    image = Image.new("RGB", (56, 56))
    for x in range(56):
        for y in range(56):
            image.putpixel((x, y), (4 * x, 4 * y, 128))
    return [
        {"role": "system", "content": "You check weight synchronisation."},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": encode_image(image)}},
                {"type": "text", "text": "Describe the picture in a few words."},
            ],
        },
    ]


async def verify_weight_sync(
    engine: Engine,
    model: ActorModel | PreTrainedModel,
    processor: VLProcessor,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    max_new_tokens: int = 8,
    tolerance: float = 1e-3,
) -> float:
    """Greedy-generate from a probe with `engine`, score the same ids with `model`, and compare logprobs.

    Returns the largest |engine − trainer| logprob difference over the generated tokens; raises
    `WeightSyncMismatch` when it exceeds `tolerance` (fp32 engines agree to ~1e-5, bf16 to ~1e-1).
    """
    prompt = TurnEncoder(processor).prompt(list(messages or probe_messages()))
    request = GenerateRequest(
        engine_ids=prompt.ids,
        images=prompt.images,
        sampling=SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=True),
    )
    result = await engine.generate(request)
    if result.aborted or not result.output_ids:
        raise WeightSyncMismatch(f"the engine produced no probe tokens: {result.finish_reason}")
    prompt_ids = processor.expand_image_pads(prompt.ids, prompt.grids)
    train_ids = prompt_ids + result.output_ids
    mask = [0] * len(prompt_ids) + [1] * len(result.output_ids)
    with torch.no_grad():
        trainer_logp = sequence_logprobs(model, processor, train_ids, prompt.images, 1.0, mask=mask)
    ours = trainer_logp[len(prompt_ids) :]
    theirs = torch.tensor(result.logprobs, dtype=ours.dtype)
    diff = float((ours - theirs).abs().max())
    if diff > tolerance:
        raise WeightSyncMismatch(
            f"engine (weight version {result.weight_version}) and trainer logprobs differ by up to "
            f"{diff:.3g} > {tolerance:g} on the probe"
        )
    return diff
