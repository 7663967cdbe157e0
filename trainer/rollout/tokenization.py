"""The two token tracks of a multi-turn VLM rollout: what the engine receives and what the trainer sees.

`TurnEncoder` (one per checkpoint) renders the prompt, and each later observation as a delta, through
the checkpoint's own chat template. `TokenTracks` (one per episode) appends those pieces and the
engine's generated ids verbatim, keeping `engine_ids` (one `<|image_pad|>` per image) and `train_ids`
(each pad expanded to the image's token count) with the loss mask, rollout logprobs and turn index
aligned to `train_ids`. The rules, with an example, are in docs/tokens.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from vistarl.clients.protocol import Message
from vistarl.trainer.rollout.processor import Grid, VLProcessor

__all__ = ["MessageLike", "Segment", "TokenTrackError", "TokenTracks", "TurnEncoder"]

MessageLike = Mapping[str, Any] | Message

# Stands in for an assistant reply when rendering deltas; it must not occur in any chat template.
_REPLY_PROBE = "vistarl-reply-probe-7f3a"
ENCODE_CACHE_SIZE = 256  # rendered texts whose ids an encoder keeps
PROMPT_CACHE_SIZE = 256  # opening messages whose segments an encoder keeps
_Step = Literal["prompt", "generation", "observation"]


class TokenTrackError(ValueError):
    """Input that would break the token tracks: a call out of order, or ids/images that do not match."""


@dataclass(frozen=True)
class Segment:
    """Engine-track ids of one rendered piece, with the images of its pads (data URLs and grids) in order."""

    ids: list[int]
    images: list[str]
    grids: list[Grid]


class TurnEncoder:
    """Renders prompts and observation deltas to engine-track ids with the checkpoint's chat template.

    An observation delta is the template's render of `[assistant reply, observation]` (with the
    generation prompt) minus its render of `[assistant reply]`, preceded by whatever the template
    writes after the reply's `<|im_end|>` (a `\\n` for Qwen). Rendering two short messages keeps the
    cost per turn constant; the property test checks that the deltas add up to the full render.
    """

    def __init__(self, processor: VLProcessor) -> None:
        self.processor = processor
        self.ids = processor.ids
        self._encoded = functools.lru_cache(maxsize=ENCODE_CACHE_SIZE)(self._encode)
        self._prompts = functools.lru_cache(maxsize=PROMPT_CACHE_SIZE)(self._cached_prompt)
        self._reply_prefix = self.render([{"role": "assistant", "content": _REPLY_PROBE}])
        eos = processor.tokenizer.convert_ids_to_tokens(self.ids.im_end)
        at = self._reply_prefix.rfind(_REPLY_PROBE)
        after_reply = self._reply_prefix[at + len(_REPLY_PROBE) :] if at >= 0 else ""
        if not after_reply.startswith(eos):
            raise TokenTrackError(
                f"the chat template does not close an assistant turn with {eos}: it renders "
                f"{self._reply_prefix!r}"
            )
        self._turn_tail = after_reply[len(eos) :]

    def render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False) -> str:
        """The chat template's text for `messages`."""
        text = self.processor.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, with no BOS/EOS added: the Rust tokenizer's own, once for each of the
        last `ENCODE_CACHE_SIZE` texts (a prompt costs milliseconds, and the samples of a GRPO group
        open with the same one)."""
        return list(self._encoded(text))

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.processor.tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt(self, messages: Sequence[Mapping[str, Any]]) -> Segment:
        """The opening context: `messages` (system prompt, first observation) and the generation prompt;
        made once for each of the last `PROMPT_CACHE_SIZE` prompts (the samples of a GRPO group open with
        the same one), and shared: a segment is read, never changed."""
        key = _hashable(messages)
        if key is None:
            return self._prompt(messages)
        return self._prompts(_Messages(key, messages))

    def _prompt(self, messages: Sequence[Mapping[str, Any]]) -> Segment:
        return self._segment(self.render(messages, add_generation_prompt=True), messages)

    def _cached_prompt(self, messages: _Messages) -> Segment:
        return self._prompt(messages.messages)

    def observation(self, message: Mapping[str, Any]) -> Segment:
        """The delta after a reply that ended on `<|im_end|>`: `\\n<|im_start|>user\\n...assistant\\n`."""
        probe = {"role": "assistant", "content": _REPLY_PROBE}
        full = self.render([probe, message], add_generation_prompt=True)
        if not full.startswith(self._reply_prefix):
            raise TokenTrackError(
                f"the chat template re-renders the previous turn when a {message.get('role')!r} message "
                f"follows it, so the observation cannot be encoded as a delta: {full!r}"
            )
        return self._segment(self._turn_tail + full[len(self._reply_prefix) :], [message])

    def reply_text(self, ids: Sequence[int]) -> str:
        """The assistant text of generated ids, without the closing `<|im_end|>`."""
        if ids and ids[-1] == self.ids.im_end:
            ids = ids[:-1]
        return str(self.processor.tokenizer.decode(list(ids), skip_special_tokens=False))

    def _segment(self, text: str, messages: Iterable[Mapping[str, Any]]) -> Segment:
        """Tokenize rendered text and pair its image pads with the messages' image parts."""
        ids = self.encode(text)
        urls = [url for message in messages for url in image_urls(message)]
        pads = ids.count(self.ids.image_pad)
        if pads != len(urls):
            raise TokenTrackError(
                f"the rendered messages hold {pads} <|image_pad|> tokens but {len(urls)} image_url parts; "
                "image parts must be {'type': 'image_url', 'image_url': {'url': data_url}} and text must "
                "not spell out vision tokens"
            )
        return Segment(ids, urls, [self.processor.image_grid(url) for url in urls])


@dataclass(frozen=True)
class _Messages:
    """Messages, compared and hashed by their `_hashable` form: the key of an encoder's prompt cache."""

    key: Hashable
    messages: Sequence[Mapping[str, Any]] = field(compare=False)


def _hashable(value: Any) -> Hashable | None:
    """A hashable form of JSON-like data, equal only for data that renders alike (each leaf with its type,
    mappings told from lists); None when a leaf cannot be hashed."""
    try:
        key = _frozen(value)
        hash(key)
    except TypeError:
        return None
    return key


def _frozen(value: Any) -> Hashable:
    """`value` as nested tuples: a mapping's items in order, a sequence's items, a leaf with its type."""
    if isinstance(value, Mapping):
        return (Mapping, tuple((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (list, tuple(_frozen(v) for v in value))
    return (type(value), value)


def as_message(message: MessageLike) -> dict[str, Any]:
    """A chat message as a plain dict (protocol `Message` models are dumped)."""
    return message.model_dump() if isinstance(message, Message) else dict(message)


def image_urls(message: Mapping[str, Any]) -> list[str]:
    """The data URLs of a message's `image_url` parts, in order."""
    content = message.get("content")
    if not isinstance(content, list):
        return []
    try:
        return [part["image_url"]["url"] for part in content if part.get("type") == "image_url"]
    except (KeyError, TypeError) as exc:
        raise TokenTrackError("an image_url part must be {'image_url': {'url': data_url}}") from exc


def without_image_data(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message with each image part replaced by `{"type": "image"}`: the k-th such part is image k.

    Chat templates render it the same way, and the trajectory keeps each data URL once, in `images`.
    """
    content = message.get("content")
    if not isinstance(content, list):
        return dict(message)
    parts = [{"type": "image"} if part.get("type") == "image_url" else dict(part) for part in content]
    return {**message, "content": parts}


class TokenTracks:
    """The token tracks of one episode, built turn by turn: prompt, generation, observation, generation, ...

    Turn k holds observation k (the prompt for k = 0) and generation k. Generated ids are kept
    verbatim with mask 1 and the engine's logprobs; everything else has mask 0 and logprob 0.0.
    If a generation did not end on `<|im_end|>` (cut by length, or an abort), the next observation
    first closes it with an `<|im_end|>` of mask 0, so the context stays well-formed chat.
    """

    def __init__(self, encoder: TurnEncoder) -> None:
        self.encoder = encoder
        self._engine_ids: list[int] = []
        self._train_ids: list[int] = []
        self._loss_mask: list[int] = []
        self._logprobs: list[float] = []
        self._turn_index: list[int] = []
        self._images: list[str] = []
        self._grids: list[Grid] = []
        self._messages: list[dict[str, Any]] = []
        self._num_generated = 0
        self._turn = 0
        self._next: _Step = "prompt"

    @classmethod
    def from_conversation(cls, encoder: TurnEncoder, messages: Sequence[MessageLike]) -> TokenTracks:
        """The tracks a rollout would have built for a finished conversation (a demonstration): the
        messages before the first assistant reply are the prompt, each reply is tokenized as the model
        would generate it (its text, then `<|im_end|>`; mask 1, logprob 0.0), each later user message
        is an observation."""
        plain = [as_message(m) for m in messages]
        replies = [i for i, m in enumerate(plain) if m["role"] == "assistant"]
        if not replies:
            raise TokenTrackError("a conversation to learn from needs at least one assistant reply")
        tracks = cls(encoder)
        tracks.add_prompt(plain[: replies[0]])
        for message in plain[replies[0] :]:
            if message["role"] == "assistant":
                if not isinstance(message["content"], str):
                    raise TokenTrackError("an assistant reply must be plain text")
                ids = [*encoder.encode(message["content"]), encoder.ids.im_end]
                tracks.add_generation(ids, [0.0] * len(ids), message["content"])
            else:
                tracks.add_observation(message)
        return tracks

    def add_prompt(self, messages: Sequence[MessageLike]) -> None:
        """Start the episode: system prompt + first observation, rendered with the generation prompt."""
        self._expect("prompt")
        if not messages:
            raise TokenTrackError("add_prompt needs at least the first observation message")
        plain = [as_message(m) for m in messages]
        self._append_context(self.encoder.prompt(plain), plain)
        self._next = "generation"

    def add_generation(self, ids: Sequence[int], logprobs: Sequence[float], text: str | None = None) -> None:
        """Append the engine's ids verbatim (mask 1, its logprobs); this ends the current turn.

        `text` is the reply as the engine decoded it; without it the ids are decoded.
        """
        ids = [int(i) for i in ids]
        logprobs = [float(x) for x in logprobs]
        if len(logprobs) != len(ids):
            raise TokenTrackError(f"{len(ids)} generated ids but {len(logprobs)} logprobs")
        if not all(math.isfinite(x) for x in logprobs):
            raise TokenTrackError("generated-token logprobs must be finite")
        if self.encoder.ids.image_pad in ids:
            raise TokenTrackError("generated ids contain <|image_pad|>, which no image backs")
        self._expect("generation")
        self._engine_ids += ids
        self._train_ids += ids
        self._loss_mask += [1] * len(ids)
        self._logprobs += logprobs
        self._turn_index += [self._turn] * len(ids)
        self._num_generated += len(ids)
        reply = self.encoder.reply_text(ids) if text is None else text
        self._messages.append({"role": "assistant", "content": reply})
        self._next = "observation"

    def add_observation(self, message: MessageLike) -> None:
        """Append the next observation as a delta (mask 0), ending with the generation prompt."""
        self._expect("observation")
        plain = as_message(message)
        segment = self.encoder.observation(plain)
        if self._engine_ids[-1] != self.encoder.ids.im_end:
            segment = Segment([self.encoder.ids.im_end, *segment.ids], segment.images, segment.grids)
        self._turn += 1
        self._append_context(segment, [plain])
        self._next = "generation"

    def _expect(self, step: _Step) -> None:
        """Refuse a call out of order (prompt, then generation and observation alternating)."""
        if self._next != step:
            raise TokenTrackError(f"add_{step} called where add_{self._next} was expected")

    def _append_context(self, segment: Segment, messages: Sequence[Mapping[str, Any]]) -> None:
        """Append non-generated tokens: one pad per image on the engine track, expanded on the train track."""
        expanded = self.encoder.processor.expand_image_pads(segment.ids, segment.grids)
        self._engine_ids += segment.ids
        self._train_ids += expanded
        self._loss_mask += [0] * len(expanded)
        self._logprobs += [0.0] * len(expanded)
        self._turn_index += [self._turn] * len(expanded)
        self._images += segment.images
        self._grids += segment.grids
        self._messages += [without_image_data(m) for m in messages]

    @property
    def engine_ids(self) -> Sequence[int]:
        """What the engine receives: one `<|vision_start|><|image_pad|><|vision_end|>` per image."""
        return self._engine_ids

    @property
    def train_ids(self) -> Sequence[int]:
        """What the trainer sees: each image's pad expanded to t·h·w/merge² tokens."""
        return self._train_ids

    @property
    def loss_mask(self) -> Sequence[int]:
        """1 on generated tokens, 0 elsewhere; aligned with `train_ids`."""
        return self._loss_mask

    @property
    def rollout_logprobs(self) -> Sequence[float]:
        """The engine's logprob of each generated token, 0.0 elsewhere; aligned with `train_ids`."""
        return self._logprobs

    @property
    def turn_index(self) -> Sequence[int]:
        """The turn each token belongs to; aligned with `train_ids`."""
        return self._turn_index

    @property
    def images(self) -> Sequence[str]:
        """Every image of the episode (data URLs) in pad order: SGLang's `image_data`."""
        return self._images

    @property
    def image_grid_thw(self) -> Sequence[Grid]:
        """The (t, h, w) grid of each image, in pad order."""
        return self._grids

    @property
    def messages(self) -> Sequence[dict[str, Any]]:
        """The conversation so far; image parts are `{"type": "image"}` placeholders for `images`."""
        return self._messages

    @property
    def context_length(self) -> int:
        """Tokens in the context the model sees (the train track): what a context budget counts."""
        return len(self._train_ids)

    @property
    def num_generated(self) -> int:
        """Tokens generated so far in the episode: what a generated-token budget counts."""
        return self._num_generated

    @property
    def num_turns(self) -> int:
        """Generations so far."""
        return self._turn + (self._next == "observation")
