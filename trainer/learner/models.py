"""Actor, reference and critic models, built from one HF Qwen-VL checkpoint directory.

Each is the checkpoint's VL backbone (`model`: vision tower + language model, as in the HF class)
with a head on its last hidden states: the actor and the reference keep `lm_head`, the critic has a
scalar `value_head`. Keeping HF's submodule names makes the actor's state dict the HF model's own
(in-memory key names), so an HF model loads it as it is. Both forwards apply the head only at the
positions asked for, inside `forward`, where FSDP has the root's parameters gathered.

One code path serves Qwen2.5-VL and Qwen3-VL; every per-arch fact comes from the config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Required, TypedDict, TypeVar, Unpack

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModelForImageTextToText, PretrainedConfig, PreTrainedModel

from vistarl.trainer.modeling.attention import SequenceBounds, packed_attention_kwargs
from vistarl.trainer.modeling.image_features import Grid, ImageFeatures, encode_images, with_image_features

VALUE_HEAD_FILE = "value_head.safetensors"
BACKBONE_FILE = "model.safetensors"

Scored = TypeVar("Scored")
HeadScore = Callable[[nn.Module, torch.Tensor, torch.Tensor], Scored]
"""`score(head, hidden [K, H], targets [K])`: what the actor computes from the selected hidden states."""


def load_lm(path: str | Path, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """The full HF image-text-to-text model of a checkpoint directory (never a hub), with SDPA attention."""
    model: PreTrainedModel = AutoModelForImageTextToText.from_pretrained(
        str(path), dtype=dtype, attn_implementation="sdpa", local_files_only=True
    )
    return model


class BackboneInputs(TypedDict, total=False):
    """One packed row's inputs to `backbone_hidden`, and so to the actor's and the critic's forward:
    `PackedBatch.forward_inputs`, plus the images' features when they were encoded beforehand."""

    input_ids: Required[torch.Tensor]
    position_ids: Required[torch.Tensor]
    pixel_values: torch.Tensor | None
    image_grid_thw: Grid | None
    bounds: SequenceBounds | None
    image_positions: torch.Tensor | None
    image_features: ImageFeatures | None


def backbone_hidden(
    backbone: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    pixel_values: torch.Tensor | None = None,
    image_grid_thw: Grid | None = None,
    bounds: SequenceBounds | None = None,
    image_positions: torch.Tensor | None = None,
    image_features: ImageFeatures | None = None,
) -> torch.Tensor:
    """Last hidden states `[T, H]` of one packed row of an HF Qwen-VL backbone (the `model` of its
    `…ForConditionalGeneration`); no cache, so sequence bounds come from row 0.

    The images' features are `image_features` when given (encoded beforehand, `vision_passes`),
    else the tower runs here on `pixel_values`. With `bounds`, the image grid on the host and
    `image_positions` (as `PackedBatch.forward_inputs` gives them), the layout reaches the layers and the
    vision tower precomputed, and neither the forward nor the backward needs a host-device sync to find it.
    """
    kwargs = packed_attention_kwargs(backbone.config, bounds) if bounds is not None else {}
    embeds = backbone.get_input_embeddings()(input_ids)
    if image_features is None and pixel_values is not None and image_grid_thw is not None:
        image_features = encode_images(backbone, pixel_values, image_grid_thw)
    if image_features is not None:
        if image_positions is None:
            image_positions = (input_ids[0] == backbone.config.image_token_id).nonzero().squeeze(-1)
        embeds, image_kwargs = with_image_features(embeds, image_features, image_positions)
        kwargs |= image_kwargs
    out = backbone.language_model(inputs_embeds=embeds, position_ids=position_ids, use_cache=False, **kwargs)
    hidden: torch.Tensor = out.last_hidden_state[0]
    return hidden


class _VLModel(nn.Module):
    """What the actor and the critic share: the HF VL backbone under `model`, and its vision tower."""

    model: Any

    def encode_images(self, pixel_values: torch.Tensor, image_grid_thw: Grid) -> ImageFeatures:
        """The vision tower's features for these images (`encode_images`), to hand to `forward` later;
        FSDP runs it as a forward (`shard_model` registers it)."""
        return encode_images(self.model, pixel_values, image_grid_thw)


class ActorModel(_VLModel):
    """The policy: VL backbone + `lm_head`, scoring chosen tokens from their prefixes."""

    def __init__(self, backbone: PreTrainedModel, lm_head: nn.Linear, config: PretrainedConfig) -> None:
        super().__init__()
        self.model = backbone
        self.lm_head = lm_head
        self.config = config

    @classmethod
    def from_lm(cls, lm: PreTrainedModel) -> ActorModel:
        """Wrap a loaded HF model; the parameters are shared, not copied."""
        return cls(lm.model, lm.lm_head, lm.config)

    def forward(
        self, index: torch.Tensor, score: HeadScore[Scored], **inputs: Unpack[BackboneInputs]
    ) -> Scored:
        """`score(lm_head, hidden[index - 1], input_ids[index])`: position i-1 predicts token i."""
        hidden = backbone_hidden(self.model, **inputs)
        return score(self.lm_head, hidden[index - 1], inputs["input_ids"][0, index])


class CriticModel(_VLModel):
    """The value model: VL backbone + a scalar `value_head` (zero-initialised, so every rank agrees)."""

    def __init__(self, backbone: PreTrainedModel, config: PretrainedConfig) -> None:
        super().__init__()
        self.model = backbone
        self.config = config
        hidden_size = config.get_text_config().hidden_size
        self.value_head = nn.Linear(hidden_size, 1, dtype=next(backbone.parameters()).dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, index: torch.Tensor, **inputs: Unpack[BackboneInputs]) -> torch.Tensor:
        """Float32 values `[K]` of the states before tokens `index` (read at positions `index - 1`)."""
        hidden = backbone_hidden(self.model, **inputs)
        values: torch.Tensor = self.value_head(hidden[index - 1]).squeeze(-1).float()
        return values


@dataclass
class Models:
    """What one training run loads: the actor, and the reference and critic when the algorithm needs them."""

    actor: ActorModel
    reference: ActorModel | None
    critic: CriticModel | None


def load_actor(path: str | Path, dtype: torch.dtype = torch.float32) -> ActorModel:
    """The trainable policy, in train mode (which HF's gradient checkpointing requires)."""
    return ActorModel.from_lm(load_lm(path, dtype)).train()


def load_reference(path: str | Path, dtype: torch.dtype = torch.float32) -> ActorModel:
    """The frozen reference policy for the KL term: eval mode, no parameter requires grad."""
    reference = ActorModel.from_lm(load_lm(path, dtype)).eval()
    reference.requires_grad_(False)
    return reference


def load_critic(path: str | Path, dtype: torch.dtype = torch.float32) -> CriticModel:
    """A saved critic if `path` holds `value_head.safetensors`, else the checkpoint's backbone, new head."""
    lm = load_lm(path, dtype)
    critic = CriticModel(lm.model, lm.config)
    head_file = Path(path) / VALUE_HEAD_FILE
    if head_file.is_file():
        head = {k.removeprefix("value_head."): v for k, v in load_file(str(head_file)).items()}
        critic.value_head.load_state_dict(head)
    return critic.train()


def save_critic(
    state_dict: Mapping[str, torch.Tensor], config: PretrainedConfig, out_dir: str | Path
) -> Path:
    """Write a critic's full state dict as a directory that `load_critic` (and HF, for the backbone) reads."""
    backbone = {k: v.contiguous() for k, v in state_dict.items() if k.startswith("model.")}
    head = {k: v.contiguous() for k, v in state_dict.items() if k.startswith("value_head.")}
    if len(backbone) + len(head) != len(state_dict) or not head:
        raise ValueError("not a critic state dict: expected only 'model.*' and 'value_head.*' keys")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    save_file(backbone, str(out / BACKBONE_FILE), metadata={"format": "pt"})
    save_file(head, str(out / VALUE_HEAD_FILE), metadata={"format": "pt"})
    return out


def block_class_names(module: ActorModel | CriticModel) -> frozenset[str]:
    """The decoder-layer and vision-block class names (HF's `_no_split_modules`): the FSDP units."""
    return frozenset(module.model._no_split_modules)


def blocks(module: ActorModel | CriticModel) -> list[nn.Module]:
    """Every decoder layer and vision block, in module order (also once FSDP has subclassed them)."""
    names = block_class_names(module)
    return [m for m in module.modules() if any(cls.__name__ in names for cls in type(m).__mro__)]


def freeze_vision(module: ActorModel | CriticModel) -> None:
    """Stop training the vision tower (it still runs, so FSDP's collectives stay in step)."""
    module.model.visual.requires_grad_(False)


_MIXED: dict[tuple[type[nn.Module], type[nn.Module]], type[nn.Module]] = {}


def with_mixin(module: nn.Module, mixin: type[nn.Module]) -> None:
    """Change `module`'s class to one subclass of it with `mixin` first, made once per class pair, so
    `mixin.forward` runs (and reaches the original through `super()`). Names, parameters and state
    dict stay as they are. A class, not a per-instance `forward`: `torch.compile` guards on a module's
    `forward` object, and one bound forward per layer makes every layer recompile."""
    base = type(module)
    if issubclass(base, mixin):
        return
    if (base, mixin) not in _MIXED:
        _MIXED[base, mixin] = type(f"{mixin.__name__}_{base.__name__}", (mixin, base), {})
    module.__class__ = _MIXED[base, mixin]
