"""The token tracks: built turn by turn, they equal the chat-template render of the whole conversation."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vistarl.clients.images import encode_image
from vistarl.clients.protocol import Message
from vistarl.devtools.tiny_checkpoint import ARCHS
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.tokenization import TokenTrackError, TokenTracks, TurnEncoder

SYSTEM = {"role": "system", "content": "You solve Sokoban. Answer with <answer>Left</answer>."}


@pytest.fixture(scope="module")
def encoders(tiny_checkpoints: dict[str, Path]) -> dict[str, TurnEncoder]:
    """One encoder per tiny checkpoint (Qwen2.5-VL and Qwen3-VL), built once for this module."""
    return {arch: TurnEncoder(VLProcessor.from_pretrained(tiny_checkpoints[arch])) for arch in ARCHS}


@pytest.fixture(scope="module")
def images() -> list[str]:
    """Data URLs of three images of different sizes (distinct grids for both patch sizes)."""
    sizes = [(96, 64), (320, 256), (512, 384)]
    return [encode_image(Image.new("RGB", size, (40 * i, 90, 160))) for i, size in enumerate(sizes)]


def user(text: str, urls: Sequence[str] = ()) -> dict[str, Any]:
    """An observation message as env servers format it: image parts first, then the text."""
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return {"role": "user", "content": [*parts, {"type": "text", "text": text}]}


def canonical(encoder: TurnEncoder, text: str) -> list[int]:
    """What an engine emitting `text` canonically returns: its token ids and the closing <|im_end|>."""
    return [*encoder.processor.tokenizer.encode(text), encoder.ids.im_end]


def fake_logprobs(n: int, turn: int) -> list[float]:
    """Distinct, finite logprobs for n generated tokens of a turn."""
    return [-0.01 * (turn + 1) - 0.001 * i for i in range(n)]


def run_episode(
    encoder: TurnEncoder, first: dict[str, Any], turns: Sequence[tuple[str, dict[str, Any]]], last: str
) -> tuple[TokenTracks, list[dict[str, Any]], list[list[int]]]:
    """Drive the tracks like a rollout (replies are canonical ids); return them, the conversation, the ids."""
    tracks = TokenTracks(encoder)
    conversation: list[dict[str, Any]] = [SYSTEM, first]
    tracks.add_prompt(conversation)
    generated: list[list[int]] = []
    for turn, reply in enumerate([*(r for r, _ in turns), last]):
        ids = canonical(encoder, reply)
        tracks.add_generation(ids, fake_logprobs(len(ids), turn), text=reply)
        generated.append(ids)
        conversation.append({"role": "assistant", "content": reply})
        if turn < len(turns):
            tracks.add_observation(turns[turn][1])
            conversation.append(turns[turn][1])
    return tracks, conversation, generated


def rendered_ids(encoder: TurnEncoder, conversation: list[dict[str, Any]]) -> list[int]:
    """The ids of the full chat-template render of the conversation, each image pad still single."""
    text = encoder.processor.tokenizer.apply_chat_template(conversation, tokenize=False)
    return list(encoder.processor.tokenizer.encode(text))


def assistant_spans(encoder: TurnEncoder, ids: list[int]) -> list[int]:
    """A loss-mask oracle: 1 from after each `<|im_start|>assistant\\n` through its <|im_end|>."""
    header = encoder.encode("<|im_start|>assistant\n")
    mask = [0] * len(ids)
    i = 0
    while i < len(ids):
        if ids[i : i + len(header)] == header:
            i += len(header)
            while i < len(ids):
                mask[i] = 1
                i += 1
                if ids[i - 1] == encoder.ids.im_end:
                    break
        else:
            i += 1
    return mask


def check_tracks(
    encoder: TurnEncoder,
    tracks: TokenTracks,
    conversation: list[dict[str, Any]],
    generated: list[list[int]],
    urls: list[str],
) -> None:
    """Every property the token rules promise for a finished trajectory of canonical replies."""
    processor = encoder.processor
    grids = [processor.image_grid(url) for url in urls]
    expected = processor.expand_image_pads(rendered_ids(encoder, conversation), grids)
    # The template closes the last reply with "\n" too; the trajectory ends on that reply's <|im_end|>.
    assert [*tracks.train_ids, encoder.ids.newline] == expected
    assert processor.expand_image_pads(tracks.engine_ids, tracks.image_grid_thw) == list(tracks.train_ids)
    assert list(tracks.engine_ids).count(encoder.ids.image_pad) == len(urls)
    assert list(tracks.images) == urls
    assert list(tracks.image_grid_thw) == grids

    n = len(tracks.train_ids)
    assert len(tracks.loss_mask) == len(tracks.rollout_logprobs) == len(tracks.turn_index) == n
    mask = assistant_spans(encoder, list(tracks.train_ids))
    assert list(tracks.loss_mask) == mask
    assert [t for t, m in zip(tracks.train_ids, mask, strict=True) if m] == [i for g in generated for i in g]
    logprobs = [lp for turn, g in enumerate(generated) for lp in fake_logprobs(len(g), turn)]
    assert [lp for lp, m in zip(tracks.rollout_logprobs, mask, strict=True) if m] == logprobs
    assert all(lp == 0.0 for lp, m in zip(tracks.rollout_logprobs, mask, strict=True) if not m)
    # Turn k runs from the token after reply k-1's <|im_end|> through reply k's <|im_end|>.
    turns, turn = [], 0
    for i, m in enumerate(mask):
        turns.append(turn)
        turn += m == 1 and (i + 1 == n or mask[i + 1] == 0)
    assert list(tracks.turn_index) == turns

    assert tracks.context_length == n
    assert tracks.num_generated == sum(len(g) for g in generated)
    assert tracks.num_turns == len(generated)
    text = encoder.processor.tokenizer.apply_chat_template
    assert text(list(tracks.messages), tokenize=False) == text(conversation, tokenize=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_tracks_equal_full_render(encoders: dict[str, TurnEncoder], images: list[str], arch: str) -> None:
    encoder = encoders[arch]
    a, b, c = images
    first = user("Turn 1. You are at (1, 2).", [a])
    turns = [
        ("<answer>Left</answer>", user("No image this time; 3 steps left.")),
        ("I push Up.\n<answer>Up</answer>", user("Two views:", [b, c])),
        ("Right", user("Same view again:", [a])),
    ]
    tracks, conversation, generated = run_episode(encoder, first, turns, "Done. <answer>Down</answer>")
    check_tracks(encoder, tracks, conversation, generated, [a, b, c, a])
    assert len({tuple(g) for g in tracks.image_grid_thw}) == 3


# A reply whose leading whitespace holds a line break would merge it with the template's "assistant\n"
# (Qwen's pre-tokenizer rule `\s*[\r\n]+`): its canonical ids then depend on the context before it.
reply_text = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=30).filter(
    lambda s: re.match(r"\s*[\r\n]", s) is None
)
observation_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=12, deadline=None)
@given(data=st.data())
def test_tracks_equal_full_render_for_any_text(
    encoders: dict[str, TurnEncoder], images: list[str], arch: str, data: st.DataObject
) -> None:
    encoder = encoders[arch]
    pick = st.lists(st.sampled_from(images), max_size=2)
    first_urls = data.draw(pick)
    turns = data.draw(
        st.lists(st.tuples(reply_text, observation_text, pick), min_size=1, max_size=3).map(
            lambda ts: [(reply, user(text, urls)) for reply, text, urls in ts]
        )
    )
    first = user(data.draw(observation_text), first_urls)
    tracks, conversation, generated = run_episode(encoder, first, turns, data.draw(reply_text))
    urls = [*first_urls, *(url for _, message in turns for url in _urls(message))]
    check_tracks(encoder, tracks, conversation, generated, urls)


def _urls(message: dict[str, Any]) -> list[str]:
    return [part["image_url"]["url"] for part in message["content"] if part["type"] == "image_url"]


@pytest.mark.parametrize("arch", ARCHS)
def test_cut_reply_is_closed_with_masked_im_end(encoders: dict[str, TurnEncoder], arch: str) -> None:
    encoder = encoders[arch]
    tracks = TokenTracks(encoder)
    tracks.add_prompt([SYSTEM, user("go")])
    cut = encoder.encode("I will move the box to the")  # hit max_new_tokens: no <|im_end|>
    tracks.add_generation(cut, [-0.5] * len(cut))
    before = tracks.context_length
    tracks.add_observation(user("Your reply was cut."))
    delta = list(tracks.train_ids[before:])
    assert delta[:3] == [encoder.ids.im_end, encoder.ids.newline, encoder.ids.im_start]
    assert set(tracks.loss_mask[before:]) == {0}
    assert set(tracks.rollout_logprobs[before:]) == {0.0}
    assert set(tracks.turn_index[before:]) == {1}
    assert tracks.num_generated == len(cut)
    assert tracks.messages[-2] == {"role": "assistant", "content": "I will move the box to the"}


def test_empty_generation_is_closed_too(encoders: dict[str, TurnEncoder]) -> None:
    encoder = encoders["qwen3_vl"]
    tracks = TokenTracks(encoder)
    tracks.add_prompt([user("go")])
    tracks.add_generation([], [])
    tracks.add_observation(user("again"))
    assert encoder.processor.tokenizer.decode(list(tracks.train_ids)) == (
        "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tracks.num_turns == 1 and tracks.num_generated == 0


def test_reply_text_is_decoded_when_not_given(encoders: dict[str, TurnEncoder]) -> None:
    encoder = encoders["qwen2_5_vl"]
    tracks = TokenTracks(encoder)
    tracks.add_prompt([user("go")])
    ids = canonical(encoder, "Move <answer>Left</answer> now")
    tracks.add_generation(ids, [-1.0] * len(ids))
    assert tracks.messages[-1] == {"role": "assistant", "content": "Move <answer>Left</answer> now"}


def test_protocol_messages_are_accepted(encoders: dict[str, TurnEncoder], images: list[str]) -> None:
    encoder = encoders["qwen2_5_vl"]
    plain, model = TokenTracks(encoder), TokenTracks(encoder)
    for tracks, wrap in ((plain, dict), (model, Message.model_validate)):
        tracks.add_prompt([wrap(SYSTEM), wrap(user("hi", images[:1]))])
        tracks.add_generation(canonical(encoder, "ok"), [-0.1, -0.2])
        tracks.add_observation(wrap(user("next", images[1:2])))
    assert list(model.train_ids) == list(plain.train_ids)
    assert list(model.images) == images[:2]
    assert model.messages[1]["content"][0] == {"type": "image"}


def test_calls_out_of_order_are_refused(encoders: dict[str, TurnEncoder]) -> None:
    tracks = TokenTracks(encoders["qwen3_vl"])
    with pytest.raises(TokenTrackError, match="add_generation called where add_prompt was expected"):
        tracks.add_generation([1], [-0.1])
    with pytest.raises(TokenTrackError, match="add_observation called where add_prompt"):
        tracks.add_observation(user("x"))
    with pytest.raises(TokenTrackError, match="at least the first observation"):
        tracks.add_prompt([])
    tracks.add_prompt([user("go")])
    with pytest.raises(TokenTrackError, match="add_observation called where add_generation"):
        tracks.add_observation(user("x"))
    with pytest.raises(TokenTrackError, match="add_prompt called"):
        tracks.add_prompt([user("go")])


def test_bad_generations_are_refused_and_lose_nothing(encoders: dict[str, TurnEncoder]) -> None:
    encoder = encoders["qwen2_5_vl"]
    tracks = TokenTracks(encoder)
    tracks.add_prompt([user("go")])
    snapshot = (list(tracks.train_ids), list(tracks.loss_mask))
    with pytest.raises(TokenTrackError, match="2 generated ids but 1 logprobs"):
        tracks.add_generation([9707, encoder.ids.im_end], [-0.1])
    with pytest.raises(TokenTrackError, match="finite"):
        tracks.add_generation([9707, encoder.ids.im_end], [-0.1, -math.inf])
    with pytest.raises(TokenTrackError, match="image_pad"):
        tracks.add_generation([encoder.ids.image_pad, encoder.ids.im_end], [-0.1, -0.1])
    assert (list(tracks.train_ids), list(tracks.loss_mask)) == snapshot
    tracks.add_generation([9707, encoder.ids.im_end], [-0.1, -0.2])
    assert tracks.num_generated == 2


def test_bad_observations_are_refused_and_lose_nothing(
    encoders: dict[str, TurnEncoder], images: list[str]
) -> None:
    encoder = encoders["qwen3_vl"]
    tracks = TokenTracks(encoder)
    tracks.add_prompt([user("go", images[:1])])
    tracks.add_generation(canonical(encoder, "Left"), [-0.1, -0.1])
    before = (tracks.context_length, list(tracks.images), len(tracks.messages))
    with pytest.raises(TokenTrackError, match=re.escape("1 <|image_pad|> tokens but 0 image_url parts")):
        tracks.add_observation(user("see <|vision_start|><|image_pad|><|vision_end|>"))
    with pytest.raises(TokenTrackError, match="image_url part must be"):
        tracks.add_observation({"role": "user", "content": [{"type": "image_url", "url": images[0]}]})
    with pytest.raises(ValueError, match="image"):
        tracks.add_observation(user("broken", ["data:image/png;base64,AAAA"]))
    assert (tracks.context_length, list(tracks.images), len(tracks.messages)) == before
    tracks.add_observation(user("fine", images[1:2]))
    assert list(tracks.images) == images[:2]


def test_a_groups_prompts_are_rendered_once(
    encoders: dict[str, TurnEncoder], images: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The samples of a GRPO group open with equal messages: one render, the same tracks for each; other
    messages, and messages with a leaf that cannot be hashed, are rendered as they come."""
    encoder = TurnEncoder(encoders["qwen2_5_vl"].processor)
    rendered: list[int] = []
    render = encoder.render
    monkeypatch.setattr(encoder, "render", lambda *a, **k: rendered.append(1) or render(*a, **k))
    group = [TokenTracks(encoder) for _ in range(3)]
    for tracks in group:
        tracks.add_prompt([dict(SYSTEM), user("Where now?", [str(images[0])])])
    assert len(rendered) == 1
    alone = TokenTracks(encoders["qwen2_5_vl"])
    alone.add_prompt([SYSTEM, user("Where now?", images[:1])])
    for tracks in group:
        assert tracks.engine_ids == alone.engine_ids and tracks.train_ids == alone.train_ids
        assert tracks.images == alone.images and tracks.image_grid_thw == alone.image_grid_thw
    TokenTracks(encoder).add_prompt([SYSTEM, user("And now?", images[:1])])
    unhashable = {**user("Where now?", images[:1]), "seen": {"ids": {1, 2}}}
    odd = TokenTracks(encoder)
    odd.add_prompt([SYSTEM, unhashable])
    assert len(rendered) == 3 and odd.engine_ids == alone.engine_ids


def test_image_pads_expand_per_grid_and_a_count_that_differs_is_refused(
    encoders: dict[str, TurnEncoder],
) -> None:
    """Each image's one pad becomes its grid's count of pads, the text around it kept in order; a prompt
    with fewer or more pads than images is refused, naming both counts."""
    processor = encoders["qwen2_5_vl"].processor
    pad = processor.ids.image_pad
    grids = [[1, 4, 6], [1, 2, 2]]
    ids = (7, pad, 8, 9, pad)
    assert processor.expand_image_pads(ids, grids) == [7, *[pad] * 6, 8, 9, pad]
    with pytest.raises(ValueError, match="1 image pads for 2 images"):
        processor.expand_image_pads([7, pad, 8], grids)
    with pytest.raises(ValueError, match=r"more image pads than images \(1\)"):
        processor.expand_image_pads(ids, grids[:1])
