"""FSDP2 sharding of the actor, reference and critic, and full state dicts for saving and weight sync.

Each decoder layer is its own `fully_shard` unit, the vision tower is one more, and the root takes the
rest: embeddings, `lm_head` (tied to them in small Qwen-VL models, so they must share a unit), final
norm, and the value head. The vision tower is one unit, not one per block, because its blocks are too
small to shard one by one: a 3B model's vision block holds 20M parameters and does about a tenth of a
decoder layer's work per micro-batch, so per-block gathers, reduces and hooks kept the GPU waiting on
the host through the whole tower (measured in docs/fsdp.md); gathered whole it is 1.3 GB of bf16.

On GPU, parameters are kept in float32 and gathered as bfloat16 for compute, with gradients reduced
in float32, and packed rows run on FlashAttention (`vistarl.trainer.modeling.attention`); on CPU everything
stays float32 with SDPA. Without a process group the model stays a plain module.

With `keep_gathered` (the trainer's choice on one rank, where a shard is the whole model) a unit keeps
its gathered bf16 parameters from forward to backward and, through `set_last_micro_batch`, from one
micro-batch to the next: each optimizer step gathers once instead of twice per micro-batch, and the
last backward frees the copies before the optimizer changes the shards. The root, whose gradient
reduction comes last in backward with no compute left to overlap it, also accumulates its gradients
unreduced until the last micro-batch. The vision tower needs no such care: it runs forward and
backward once per group of micro-batches (`vistarl.trainer.learner.vision_passes`), through `encode_images`,
which `shard_model` registers as a forward of the root.
"""

from __future__ import annotations

import os
import weakref
from datetime import timedelta
from typing import TypeVar, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
    register_fsdp_forward_method,
)

from vistarl.trainer.learner.activation_checkpointing import CheckpointScope, enable_gradient_checkpointing
from vistarl.trainer.learner.models import ActorModel, CriticModel, blocks, freeze_vision
from vistarl.trainer.learner.vision_mlp import align_gated_mlps
from vistarl.trainer.modeling.attention import VARLEN_ATTENTION, use_attention

DEFAULT_TIMEOUT = timedelta(minutes=10)
Model = TypeVar("Model", ActorModel, CriticModel)

_KEEP_GATHERED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def init_distributed(timeout: timedelta = DEFAULT_TIMEOUT) -> bool:
    """Join the process group that torchrun's environment describes (nccl on GPU, gloo on CPU).

    Returns whether a group exists. Outside torchrun this does nothing; collectives that hang give up
    after `timeout`.
    """
    if is_distributed():
        return True
    if "WORLD_SIZE" not in os.environ:
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo", timeout=timeout)
    return True


def is_distributed() -> bool:
    """Whether this process is part of an initialised process group."""
    return dist.is_available() and dist.is_initialized()


def rank_device() -> torch.device:
    """This rank's GPU (by LOCAL_RANK) when there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def mixed_precision_policy(device: torch.device, *, cast_inputs: bool = True) -> MixedPrecisionPolicy:
    """bf16 compute with fp32 gradient reduction on GPU; plain fp32 on CPU.

    `cast_inputs=False` is for the checkpointed blocks: their hidden states are bf16 already, and
    FSDP does not cast again when checkpointing recomputes a block, so a cast would make the recompute
    see other inputs (fp32 vision rotary tables) than the forward did.
    """
    if device.type == "cuda":
        return MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=cast_inputs
        )
    return MixedPrecisionPolicy()


def shard_model(
    module: Model,
    device: torch.device,
    *,
    gradient_checkpointing: bool = False,
    uncheckpointed_layers: int = 0,
    checkpoint_scope: CheckpointScope = "layer",
    vision_frozen: bool = False,
    compiled: bool = False,
    keep_gathered: bool = False,
    compute_dtype: torch.dtype = torch.float32,
    offload: bool = False,
) -> Model:
    """Prepare `module` for training on `device`: optional checkpointing (`activation_checkpointing`),
    frozen vision and compiled blocks (`torch.compile` per layer and block), then FSDP2.

    Shards only when a process group exists; otherwise the module is returned on `device` unchanged
    in dtype. Sharded on GPU, or unsharded on GPU with a bf16 `compute_dtype` (the trainer's autocast),
    it computes in bf16 with varlen FlashAttention and aligned MLP widths
    (`vistarl.trainer.learner.vision_mlp`). `keep_gathered`: see the module docstring. `offload` keeps the
    shards, their gradients and so the optimizer's state in host memory, where the optimizer steps
    (FSDP2's `CPUOffloadPolicy`; it needs a process group). Returns the same object (FSDP2 shards in place).
    """
    if device.type == "cuda" and (is_distributed() or compute_dtype == torch.bfloat16):
        use_attention(module, VARLEN_ATTENTION)
        align_gated_mlps(module)  # before checkpointing, which may subclass the MLPs again
    if gradient_checkpointing:
        enable_gradient_checkpointing(module, uncheckpointed_layers, checkpoint_scope)
    if vision_frozen:
        freeze_vision(module)
    if compiled:
        for block in blocks(module):
            block.compile()
    if not is_distributed():
        if offload:
            raise ValueError(
                "train.optimizer_offload keeps FSDP2 shards in host memory, which needs a process group: "
                "start the trainer under torchrun (vistarl up does on GPUs), or leave the offload out"
            )
        return module.to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    unit_policy = mixed_precision_policy(device, cast_inputs=False)
    reshard = not keep_gathered
    offloaded = CPUOffloadPolicy(pin_memory=device.type == "cuda") if offload else OffloadPolicy()
    for unit in shard_units(module):
        fully_shard(
            unit, mesh=mesh, mp_policy=unit_policy, reshard_after_forward=reshard, offload_policy=offloaded
        )
    fully_shard(
        module,
        mesh=mesh,
        mp_policy=mixed_precision_policy(device),
        reshard_after_forward=reshard,
        offload_policy=offloaded,
    )
    register_fsdp_forward_method(module, "encode_images")  # a forward of the root: it may run first
    if keep_gathered:
        _KEEP_GATHERED.add(module)
    return module


def shard_units(module: ActorModel | CriticModel) -> list[nn.Module]:
    """The FSDP units below the root: the vision tower, then every decoder layer."""
    visual = module.model.visual
    in_visual = set(visual.modules())
    return [visual, *(block for block in blocks(module) if block not in in_visual)]


def set_last_micro_batch(module: nn.Module, last: bool) -> None:
    """Call before each micro-batch's backward: a `keep_gathered` module frees its gathered parameters,
    and reduces the gradients of its root, in the last micro-batch of an optimizer step only. Other
    modules are left alone."""
    if not (isinstance(module, FSDPModule) and module in _KEEP_GATHERED):
        return
    module.set_reshard_after_backward(last)
    module.set_requires_gradient_sync(last, recurse=False)


def free_gathered(module: nn.Module) -> None:
    """Free the gathered copies that a `keep_gathered` module kept after a no-grad pass, when another
    model trains before it (a plain module has none)."""
    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The full, unsharded state dict on CPU, on rank 0 (other ranks get `{}`); HF key names for the actor.

    Every rank must call it: gathering the shards is a collective.
    """
    if not isinstance(module, FSDPModule):
        return {name: tensor.detach().cpu() for name, tensor in module.state_dict().items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return cast(dict[str, torch.Tensor], get_model_state_dict(module, options=options))
