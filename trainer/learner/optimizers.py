"""The trainer's AdamW: torch's (fused on a GPU), or one whose two moments are kept in bfloat16.

`train.optimizer_state_dtype: bfloat16` halves AdamW's state, 8 to 4 bytes a parameter (15 GB of a
3.75B-parameter model; docs/fsdp.md, "Memory"). torch's AdamW keeps its moments in the parameters'
dtype, and its foreach and fused kernels refuse moments of another dtype than the float32 master weights,
so `BFloat16AdamW` is written here: torch's update (decoupled weight decay, bias correction), computed in
float32 a chunk of each parameter at a time and written back with stochastic rounding. Rounding to
nearest would freeze the second moment, whose decay of 0.1% a step (beta2 = 0.999) is below bfloat16's
resolution of 0.4%; stochastic rounding keeps its expected value. The rounding draws from a generator
seeded by `train.seed` and the step count, so a resumed run rounds as the uninterrupted one would.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch.distributed.tensor import DTensor

from vistarl.trainer.config import OptimConfig

StateDtype = Literal["float32", "bfloat16"]

CHUNK_ELEMENTS = 1 << 24
"""Elements updated at a time: float32 temporaries of 64 MiB each, not the size of the largest parameter."""

_MOMENTS = ("exp_avg", "exp_avg_sq")

ParamGroup = dict[str, Any]
"""A torch parameter group: `params`, a list of parameters, and any per-group settings (`lr`, `name`)."""
Params = Iterable[torch.nn.Parameter] | Iterable[ParamGroup]


def build_optimizer(
    params: Params,
    lr: float,
    optim: OptimConfig,
    state_dtype: StateDtype,
    seed: int,
) -> torch.optim.Optimizer:
    """AdamW over `params` (parameters, or parameter groups: `{"params": [...], ...}`) at learning rate
    `lr`: torch's for float32 moments (fused where every parameter is on a GPU, which avoids the foreach
    path's float32 temporaries the size of the whole model), else `BFloat16AdamW`."""
    entries: list[Any] = list(params)
    betas, decay = optim.betas, optim.weight_decay
    if state_dtype == "bfloat16":
        return BFloat16AdamW(entries, lr=lr, betas=betas, weight_decay=decay, seed=seed)
    flat = [p for entry in entries for p in (entry["params"] if isinstance(entry, dict) else [entry])]
    on_gpu = bool(flat) and all(_local(p).device.type == "cuda" for p in flat)
    return torch.optim.AdamW(entries, lr=lr, betas=betas, weight_decay=decay, fused=on_gpu or None)


class BFloat16AdamW(torch.optim.Optimizer):
    """AdamW with its moments stored in bfloat16, stochastically rounded (see the module docstring)."""

    def __init__(
        self,
        params: Params,
        *,
        lr: float,
        betas: tuple[float, float],
        weight_decay: float,
        eps: float = 1e-8,
        seed: int = 0,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay, "eps": eps})
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        self.register_load_state_dict_post_hook(_moments_to_bfloat16)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        """One AdamW step of every parameter that has a gradient."""
        if closure is not None:
            raise ValueError("BFloat16AdamW takes no closure")
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)

    def _update(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        """Step one parameter, a chunk at a time."""
        state = self.state[param]
        if not state:
            state["step"] = torch.tensor(0.0)
            for name in _MOMENTS:
                state[name] = torch.zeros_like(param, dtype=torch.bfloat16)
        state["step"] += 1
        step = int(state["step"])
        beta1, beta2 = group["betas"]
        lr, eps = group["lr"], group["eps"]
        step_size = lr / (1 - beta1**step)
        root_correction = math.sqrt(1 - beta2**step)
        assert param.grad is not None
        weights = _local(param).view(-1)
        generator = self._generator(weights.device, step)
        pieces = [
            _local(t).view(-1).split(CHUNK_ELEMENTS)
            for t in (param.grad, state["exp_avg"], state["exp_avg_sq"])
        ]
        for w, g, m16, v16 in zip(weights.split(CHUNK_ELEMENTS), *pieces, strict=True):
            grad = g.float()
            m = m16.float().lerp_(grad, 1 - beta1)
            v = v16.float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            w.mul_(1 - lr * group["weight_decay"])
            w.addcdiv_(m, v.sqrt().div_(root_correction).add_(eps), value=-step_size)
            m16.copy_(stochastic_bfloat16(m, generator))
            v16.copy_(stochastic_bfloat16(v, generator))

    def _generator(self, device: torch.device, step: int) -> torch.Generator:
        """The rounding's generator on `device`, seeded for this step."""
        generator = self._generators.setdefault(device, torch.Generator(device=device))
        generator.manual_seed(self.seed * 1_000_003 + step)
        return generator


def stochastic_bfloat16(values: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """float32 `values` rounded to bfloat16 up or down at random, in proportion to their distance from
    each: random low 16 bits are added to each value's bits, which are then cut to bfloat16's 16."""
    bits = values.view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device, generator=generator)
    return ((bits + noise) & -(1 << 16)).view(torch.float32).to(torch.bfloat16)


def _moments_to_bfloat16(optimizer: torch.optim.Optimizer) -> None:
    """After `load_state_dict`, which casts every state tensor to its parameter's dtype, bfloat16 again."""
    for state in optimizer.state.values():
        for name in _MOMENTS:
            if name in state:
                state[name] = state[name].to(torch.bfloat16)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's local shard under FSDP2 (the tensor itself when it is not sharded)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
