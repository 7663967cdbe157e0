"""The HF engine's prefix cache: which cached tokens a prompt reuses (images by content, whole), LRU within
its bound; and on the tiny real checkpoints, multi-turn conversations with images give the ids and logprobs
they give without it (greedy and seeded sampling, dynamic and static caches, after evictions), weight updates
and `/flush_cache` empty it, and `/metrics` counts cached and computed prompt tokens."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.hf_models import Loaded
from tests.vl_samples import noise_image
from vistarl.clients.images import encode_image
from vistarl.trainer.rollout.engines.base import GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.hf.prefix_cache import BLOCK, PrefixCache, PromptKey
from vistarl.trainer.rollout.engines.server import EngineServerSettings, create_app
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.processor import VLProcessor

ATOL = 1e-4
PAD = 7  # the image pad of the unit tests' keys


# --- which cached tokens a prompt reuses ---------------------------------------------------------------


def key(tokens: list[int], images: list[int] | None = None, pads: list[int] | None = None) -> PromptKey:
    return PromptKey.of(tokens, PAD, images or [], pads or [])


def kv(tokens: int) -> torch.Tensor:
    """Keys and values of `tokens` tokens of a one-layer model: 8 bytes a token."""
    return torch.zeros(1, 2, 1, tokens, 1)


def test_a_prompt_reuses_its_longest_cached_beginning_but_its_last_token() -> None:
    cache = PrefixCache(1 << 20)
    text = list(range(100, 200))
    cache.store(key(text[:70]), kv(70))
    hit = cache.match(key(text))
    assert hit is not None and hit.length == 70 and hit.kv.shape == (1, 2, 1, 70, 1)
    same = cache.match(key(text[:70]))  # the whole prompt is cached: its last token is computed again
    assert same is not None and same.length == 69
    parted = cache.match(key([*text[:50], 1, 2, 3, *text[53:]]))  # parts within the second block
    assert parted is not None and parted.length == 50
    assert cache.match(key([*text[: BLOCK - 1], 1, *text[BLOCK:]])) is None  # no whole block shared
    assert cache.match(key(list(range(300, 340)))) is None


def test_images_match_by_their_content_and_whole() -> None:
    """An image's pads carry its content key: the same text with another image parts at its first pad; a
    match that ends inside an image gives up that image."""
    cache = PrefixCache(1 << 20)
    text = list(range(100, 140))
    with_image = [*text, 8, *[PAD] * 10, 9, *range(200, 240)]
    cache.store(key(with_image, [11], [10]), kv(len(with_image)))
    other = cache.match(key(with_image, [12], [10]))
    assert other is not None and other.length == len(text) + 1  # up to and with <|vision_start|>
    same = cache.match(key([*with_image, 5], [11], [10]))
    assert same is not None and same.length == len(with_image)
    assert key(with_image, [11], [10]).tokens[len(text) + 1] == -1 - 11
    cache.clear()
    cut = [*text, 8, *[PAD] * 6]  # an entry that ends inside the image
    cache.store(key(cut, [11], [6]), kv(len(cut)))
    partial = cache.match(key(with_image, [11], [10]))
    assert partial is not None and partial.length == len(text) + 1
    with pytest.raises(ValueError, match="3 image pads"):
        key([PAD, PAD, PAD], [1], [2])


def test_an_images_content_key_is_its_pixels_however_it_comes(qwen25: Loaded) -> None:
    """Keys part images that differ in one pixel, and give one image one key however it comes: a data
    URL, a new string of it (as every turn resends it), or the PIL image it encodes."""
    _, processor = qwen25
    board = noise_image(np.random.default_rng(0), 56, 56)
    moved = board.copy()
    moved.putpixel((0, 0), (0, 0, 0) if board.getpixel((0, 0)) != (0, 0, 0) else (1, 1, 1))
    url = encode_image(board)
    keys = processor.content_keys([url, "".join(url), board, encode_image(moved), moved])
    assert keys[0] == keys[1] == keys[2] != keys[3] == keys[4]
    assert all(0 <= k < 2**63 for k in keys)


def test_the_least_recently_used_entry_goes_first_and_an_extended_one_at_once() -> None:
    cache = PrefixCache(8 * 200)  # 200 tokens
    first, second, third = (list(range(start, start + 64)) for start in (1000, 2000, 3000))
    cache.store(key(first), kv(64))
    cache.store(key(second), kv(64))
    reused = cache.match(key([*first, 1]))  # `first` is now the most recently used
    assert reused is not None
    cache.store(key(third), kv(64))
    cache.store(key(third), kv(64))  # the same tokens again: one entry
    assert len(cache) == 3 and cache.bytes == 8 * 192
    cache.store(
        key([*first, *range(4000, 4064)]), kv(128), extends=reused.entry.id
    )  # `first` goes, then `second`
    assert len(cache) == 2 and cache.bytes == 8 * 192
    assert cache.match(key([*second, 1])) is None
    hit = cache.match(key([*first, 1]))
    assert hit is not None and hit.length == 64 and len(hit.entry.key) == 128
    longer = cache.match(key([*third, *range(5000, 5040)]))
    assert longer is not None and longer.length == 64
    cache.store(key([*first, *range(4000, 4032)]), kv(96))  # an entry holds all of it already
    cache.store(key(list(range(9000, 9300))), kv(300))  # larger than the bound: not kept
    assert len(cache) == 2 and cache.bytes == 8 * 192
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and cache.match(key([*third, 1])) is None


# --- on the tiny checkpoints ---------------------------------------------------------------------------

SYSTEM = "You push boxes onto the targets of a grid of walls. Answer with one move (up, down, left or right)."


def picture(seed: int, size: tuple[int, int] = (56, 56)) -> str:
    return encode_image(noise_image(np.random.default_rng(seed), *size))


def observation(processor: VLProcessor, text: str, first: bool) -> list[int]:
    """A user turn with one single-pad image, then the assistant prefix; the first after the system
    prompt, a later one after the reply's `<|im_end|>` and its `\\n` (docs/tokens.md)."""
    opening = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n" if first else "\n"
    user = f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{text}<|im_end|>\n"
    return list(processor.tokenizer.encode(f"{opening}{user}<|im_start|>assistant\n"))


@dataclass
class Conversation:
    """An episode's turns: each a text and an image, all sampled with `sampling`."""

    turns: list[tuple[str, str]]
    sampling: SamplingParams


async def play(engine: HFEngine, conversations: list[Conversation]) -> list[list[GenerateResult]]:
    """Each conversation's results, turn by turn, every conversation's turn sent at once: a turn's prompt is
    the last one, its reply and the next observation."""
    processor = engine.processor
    ids: list[list[int]] = [[] for _ in conversations]
    results: list[list[GenerateResult]] = [[] for _ in conversations]
    for turn in range(max(len(c.turns) for c in conversations)):
        playing = [i for i, c in enumerate(conversations) if turn < len(c.turns)]
        for i in playing:
            ids[i] += observation(processor, conversations[i].turns[turn][0], first=turn == 0)
        requests = [
            GenerateRequest(
                engine_ids=ids[i],
                images=[image for _, image in conversations[i].turns[: turn + 1]],
                sampling=conversations[i].sampling,
            )
            for i in playing
        ]
        for i, result in zip(playing, await asyncio.gather(*map(engine.generate, requests)), strict=True):
            assert not result.aborted, result.finish_reason.message
            ids[i] += result.output_ids
            results[i].append(result)
    return results


def conversations(turns: int, count: int, seed: int = 0, side: int = 56) -> list[Conversation]:
    """`count` conversations of `turns` turns, each turn's image its own (`side` pixels high, wider every
    other turn); greedy, then seeded sampling within the top 40 tokens, then within the top 20 and top-p.

    Top-k, because a random model's distribution is nearly flat over the whole vocabulary: a draw among 151k
    tokens of about 7e-6 each turns on the probabilities' 7th digit, which rounding moves (a prompt pass
    with a cached prefix sums its attention in another order); among a few tokens it does not."""
    samplings = [
        SamplingParams(max_new_tokens=4, temperature=0.0),
        SamplingParams(max_new_tokens=4, temperature=1.0, top_k=40, sampling_seed=seed + 1),
        SamplingParams(max_new_tokens=4, temperature=0.9, top_k=20, top_p=0.9, sampling_seed=seed + 2),
    ]
    return [
        Conversation(
            [
                (f"turn {t}: where now?", picture(100 * seed + 10 * c + t, (side, side + 28 * (t % 2))))
                for t in range(turns)
            ],
            samplings[c % len(samplings)],
        )
        for c in range(count)
    ]


def assert_same(cached: list[list[GenerateResult]], fresh: list[list[GenerateResult]]) -> None:
    """The same ids and prompt lengths, and logprobs within `ATOL`, turn by turn."""
    for with_cache, without in zip(cached, fresh, strict=True):
        for a, b in zip(with_cache, without, strict=True):
            assert a.output_ids == b.output_ids
            assert a.prompt_tokens == b.prompt_tokens
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=ATOL)


def full_reuse(results: list[GenerateResult], turn: int) -> int:
    """The prompt tokens turn `turn` takes from the cache when the last turn's entry is there: the last
    prompt and its reply but the reply's last token."""
    last = results[turn - 1]
    return last.prompt_tokens + len(last.output_ids) - 1


@pytest.mark.parametrize(("arch", "cache_len"), [("qwen2_5_vl", None), ("qwen3_vl", 400)])
async def test_turns_reuse_the_last_turns_cache_and_give_what_they_give_without_it(
    request: pytest.FixtureRequest, arch: str, cache_len: int | None
) -> None:
    """Three conversations of three turns with a new image each turn, batched together, on the dynamic KV
    cache (Qwen2.5-VL) and the static one (Qwen3-VL, its deepstack features too): each turn after the first
    prefills only its new observation and the last reply's last token, and gets the ids and logprobs of an
    engine without a prefix cache."""
    model, processor = request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3")
    played = conversations(3, 3)
    results, stats = {}, {}
    for mb in (0, 64):
        engine = HFEngine(model, processor, batch_wait_s=0.05, static_cache_len=cache_len, prefix_cache_mb=mb)
        results[mb] = await play(engine, played)
        stats[mb] = engine.stats
        await engine.close()
        assert stats[mb].static_batches == (stats[mb].batches if cache_len else 0)
        assert stats[mb].cached_prompt_tokens + stats[mb].computed_prompt_tokens == stats[mb].prompt_tokens
    assert_same(results[64], results[0])
    for turns in results[64]:
        assert turns[0].cached_tokens == 0
        assert [r.cached_tokens for r in turns[1:]] == [full_reuse(turns, t) for t in (1, 2)]
    assert stats[64].cached_prompt_tokens == sum(r.cached_tokens for turns in results[64] for r in turns)
    assert stats[0].cached_prompt_tokens == 0
    assert stats[64].computed_prompt_tokens < stats[0].computed_prompt_tokens / 2


async def test_the_same_text_with_another_image_reuses_only_what_comes_before_it(qwen25: Loaded) -> None:
    model, processor = qwen25
    engine = HFEngine(model, processor, batch_wait_s=0.0)
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    ids = observation(processor, "where now?", first=True)
    first = picture(1)
    asked = [
        await engine.generate(GenerateRequest(engine_ids=ids, images=[image], sampling=greedy))
        for image in (first, picture(2), first)
    ]
    await engine.close()
    alone = HFEngine(model, processor, batch_wait_s=0.0, prefix_cache_mb=0)
    fresh = await alone.generate(GenerateRequest(engine_ids=ids, images=[picture(2)], sampling=greedy))
    await alone.close()
    assert ids.index(processor.ids.image_pad) >= BLOCK  # the system prompt fills a block
    before_the_image = ids.index(processor.ids.image_pad)
    assert [r.cached_tokens for r in asked] == [0, before_the_image, asked[0].prompt_tokens - 1]
    assert_same([[asked[1]]], [[fresh]])
    assert asked[2].output_ids == asked[0].output_ids


async def test_evictions_within_a_small_bound_leave_the_results_unchanged(qwen25: Loaded) -> None:
    """Six conversations of four turns whose caches outgrow 1 MiB (the tiny model's keys and values take
    1 KiB a token): the least recently used entries go, their conversations' next turns prefill more, and
    every turn gets what it gets without a prefix cache."""
    model, processor = qwen25
    played = conversations(4, 6, seed=3, side=168)
    results = {}
    for mb in (0, 1):
        engine = HFEngine(model, processor, batch_wait_s=0.05, prefix_cache_mb=mb)
        results[mb] = await play(engine, played)
        if mb:
            assert engine.prefix_cache is not None and 0 < engine.prefix_cache.bytes <= 1 << 20
        await engine.close()
    assert_same(results[1], results[0])
    reuses = [
        (r.cached_tokens, full_reuse(turns, t)) for turns in results[1] for t, r in enumerate(turns) if t
    ]
    assert any(cached == full for cached, full in reuses)
    assert any(cached < full for cached, full in reuses)  # evicted


async def test_a_weight_update_empties_the_cache(qwen25: Loaded, tiny_qwen25: Path) -> None:
    """After an update by every transport's path (a copy, a checkpoint from disk, a bucket of a bucketed
    push), nothing is reused: the next turn gets what an engine that started on the new weights gets."""
    model, processor = qwen25
    engine = HFEngine(copy.deepcopy(model), processor, batch_wait_s=0.0)
    played = conversations(2, 1)[0]
    name = "model.language_model.norm.weight"
    new = {name: torch.full_like(model.state_dict()[name], 3.0)}

    async def turns(engine: HFEngine) -> list[GenerateResult]:
        return (await play(engine, [played]))[0]

    assert (await turns(engine))[1].cached_tokens > 0
    await engine.update_weights(new)
    assert engine.prefix_cache is not None and len(engine.prefix_cache) == 0
    after = await turns(engine)
    assert after[0].cached_tokens == 0 and after[1].cached_tokens > 0
    updated = copy.deepcopy(model)
    updated.load_state_dict(new, strict=False)
    fresh = HFEngine(updated, processor, batch_wait_s=0.0, prefix_cache_mb=0)
    assert_same([after], [await turns(fresh)])
    await fresh.close()
    await engine.update_weights_from_disk(str(tiny_qwen25))
    assert len(engine.prefix_cache) == 0
    await turns(engine)
    await engine.load_weights(lambda live: None, final=False)
    assert len(engine.prefix_cache) == 0
    await engine.close()


async def scrape(http: httpx.AsyncClient) -> dict[str, float]:
    """`GET /metrics` as each sample's name and value."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families((await http.get("/metrics")).text)
        for sample in family.samples
    }


async def test_flush_cache_empties_it_and_metrics_count_cached_and_computed_tokens(qwen25: Loaded) -> None:
    model, processor = qwen25
    engine = HFEngine(model, processor, batch_wait_s=0.0)
    first = observation(processor, "where now?", first=True)
    image = picture(5)
    body = {"sampling_params": {"max_new_tokens": 4, "temperature": 0}, "image_data": [image]}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(engine)), base_url="http://e"
    ) as http:
        answer = (await http.post("/generate", json={**body, "input_ids": first})).json()
        second = first + answer["output_ids"] + observation(processor, "and now?", first=False)
        turn = {**body, "input_ids": second, "image_data": [image, picture(6)]}
        meta = (await http.post("/generate", json=turn)).json()["meta_info"]
        counted = await scrape(http)
        assert meta["cached_tokens"] == answer["meta_info"]["prompt_tokens"] + len(answer["output_ids"]) - 1
        assert counted["vistarl_engine_cached_prompt_tokens_total"] == meta["cached_tokens"]
        prompts = answer["meta_info"]["prompt_tokens"] + meta["prompt_tokens"]
        assert counted["vistarl_engine_prompt_tokens_total"] == prompts
        assert counted["vistarl_engine_computed_prompt_tokens_total"] == prompts - meta["cached_tokens"]
        assert counted["vistarl_engine_prefix_cache_bytes"] > 0
        assert (await http.post("/flush_cache")).status_code == 200
        assert (await scrape(http))["vistarl_engine_prefix_cache_bytes"] == 0
        again = (await http.post("/generate", json=turn)).json()["meta_info"]
        assert again["cached_tokens"] == 0
    await engine.close()


def test_vistarl_engine_serve_turns_it_off_or_bounds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--no-prefix-cache` and `--prefix-cache-mb N` (or their variables) set the engine's bound; 0: off."""
    monkeypatch.setenv("VISTARL_PREFIX_CACHE_MB", "16")
    assert EngineServerSettings().prefix_cache_bound_mb == 16
    assert EngineServerSettings(prefix_cache=False).prefix_cache_bound_mb == 0
    monkeypatch.setenv("VISTARL_PREFIX_CACHE", "false")
    assert EngineServerSettings().prefix_cache_bound_mb == 0


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
async def test_the_prefix_cache_on_the_static_cache_in_cuda_graphs(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, arch: str
) -> None:
    """On a GPU (fp32, no TF32 convolutions), with decode steps captured in CUDA graphs: conversations that
    reuse their last turns' caches get the ids and logprobs of an engine without a prefix cache."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    model, processor = request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3")
    on_gpu = copy.deepcopy(model).cuda()
    played = conversations(4, 4)
    results = {}
    for mb in (0, 64):
        engine = HFEngine(on_gpu, processor, max_batch_size=4, batch_wait_s=0.05, prefix_cache_mb=mb)
        results[mb] = await play(engine, played)
        await engine.close()
        assert engine.stats.static_batches == engine.stats.batches
    assert_same(results[64], results[0])
    assert all(
        r.cached_tokens == full_reuse(turns, t) for turns in results[64] for t, r in enumerate(turns) if t
    )
