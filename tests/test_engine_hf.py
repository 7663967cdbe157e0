"""HFEngine on the tiny real checkpoints: sampling semantics, stops, batching, logprobs, weights, aborts."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from tests.hf_models import Loaded
from tests.vl_samples import noise_image
from vistarl.clients.images import encode_image
from vistarl.trainer.learner.logprobs import sequence_logprobs
from vistarl.trainer.modeling import attention
from vistarl.trainer.rollout.engines.base import EngineRequestError, GenerateRequest, GenerateResult
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.hf.engine import arrivals_settled
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.processor import VLProcessor

ATOL = 1e-4


@pytest.fixture
def engine(qwen25: Loaded) -> Iterator[HFEngine]:
    """An engine over the shared (never modified) Qwen2.5-VL model."""
    yield HFEngine(*qwen25, batch_wait_s=0.0)


def images(seed: int, *sizes: tuple[int, int]) -> list[str]:
    rng = np.random.default_rng(seed)
    return [encode_image(noise_image(rng, w, h)) for w, h in sizes]


def user_turn(processor: VLProcessor, text: str, n_images: int = 0, first: bool = True) -> list[int]:
    """A user message with single-pad images, then the assistant prefix; later turns open with `\\n`."""
    vision = "<|vision_start|><|image_pad|><|vision_end|>" * n_images
    opening = "" if first else "\n"
    rendered = f"{opening}<|im_start|>user\n{vision}{text}<|im_end|>\n<|im_start|>assistant\n"
    return list(processor.tokenizer.encode(rendered))


def greedy(n: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=0.0)


def sampled(n: int, seed: int, **kw: float) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, temperature=1.0, sampling_seed=seed, **kw)


async def test_greedy_is_deterministic_and_stops_at_length(engine: HFEngine) -> None:
    ids = user_turn(engine.processor, "hello")
    first = await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(5)))
    second = await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(5)))
    assert first.output_ids == second.output_ids
    assert first.logprobs == second.logprobs
    assert len(first.output_ids) == 5
    assert first.finish_reason.type == "length" and first.finish_reason.length == 5
    assert first.prompt_tokens == len(ids)
    assert first.weight_version == "0"
    assert all(lp <= 0.0 for lp in first.logprobs)
    await engine.close()


async def test_sampling_seed_reproduces_a_sample(engine: HFEngine) -> None:
    ids = user_turn(engine.processor, "roll the dice")
    runs = [
        await engine.generate(GenerateRequest(engine_ids=ids, sampling=sampled(4, seed)))
        for seed in (7, 7, 8)
    ]
    assert runs[0].output_ids == runs[1].output_ids
    assert runs[0].logprobs == runs[1].logprobs
    assert runs[0].output_ids != runs[2].output_ids
    filtered = await engine.generate(GenerateRequest(engine_ids=ids, sampling=sampled(4, 7, top_k=1)))
    plain_greedy = await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(4)))
    assert filtered.output_ids == plain_greedy.output_ids  # top_k=1 leaves only the argmax
    await engine.close()


async def test_requests_arriving_mid_batch_join_it_and_decode_as_alone(qwen25: Loaded) -> None:
    """A request that arrives while a batch decodes joins that batch (its own prefill, left-padded into the
    shared cache) and gets the tokens and logprobs it gets alone, as do the rows already running."""
    model, processor = qwen25
    two = images(3, (56, 84), (112, 56))
    first = GenerateRequest(
        engine_ids=user_turn(processor, "a long answer"),
        sampling=sampled(40, 5).model_copy(update={"ignore_eos": True}),
    )
    later = [
        GenerateRequest(
            engine_ids=user_turn(processor, "an image", 1), images=two[:1], sampling=sampled(6, 6)
        ),
        GenerateRequest(engine_ids=user_turn(processor, "short", 0), sampling=greedy(6)),
    ]
    alone = HFEngine(model, processor, max_batch_size=1, batch_wait_s=0.0)
    singles = [await alone.generate(r) for r in [first, *later]]
    await alone.close()
    engine = HFEngine(model, processor, max_batch_size=8, batch_wait_s=0.0)
    running = asyncio.create_task(engine.generate(first))
    while engine.stats.batches == 0:
        await asyncio.sleep(0.001)
    joined = await asyncio.gather(*(engine.generate(r) for r in later))
    results = [await running, *joined]
    await engine.close()
    assert engine.stats.batches == 1 and engine.stats.largest_batch == 3
    for single, result in zip(singles, results, strict=True):
        assert result.output_ids == single.output_ids
        assert result.logprobs == pytest.approx(single.logprobs, abs=ATOL)


def test_queued_requests_join_a_running_batch_once_their_arrivals_settle() -> None:
    """Requests still arriving wait for a step without a new arrival, or until the oldest has waited the
    longest batch wait; then all that are queued join in one prompt pass. With a hold, a lone arrival also
    waits until it has waited that long (the engine's mean prompt pass), for others to share its pass."""
    assert not arrivals_settled(0, 0, None, 0.1)  # nothing queued
    assert not arrivals_settled(3, 1, 0.02, 0.1)  # two arrived during the last step: more may come
    assert arrivals_settled(3, 3, 0.02, 0.1)  # none arrived since the last look
    assert arrivals_settled(2, 3, 0.02, 0.1)  # fewer (some were aborted): nothing is arriving
    assert arrivals_settled(9, 8, 0.1, 0.1)  # still arriving, but the oldest has waited long enough
    assert not arrivals_settled(1, 1, 0.01, 0.1, hold_s=0.03)  # alone, and not held a pass's time yet
    assert arrivals_settled(1, 1, 0.03, 0.1, hold_s=0.03)  # held a pass's time
    assert not arrivals_settled(2, 1, 0.05, 0.1, hold_s=0.03)  # held, but another just came: one more look
    assert arrivals_settled(2, 1, 0.1, 0.1, hold_s=0.5)  # the longest batch wait bounds any hold


async def test_requests_sent_together_join_a_running_batch_in_one_prompt_pass(qwen25: Loaded) -> None:
    """Eight requests sent together while a batch decodes join it in one prompt pass (`stats.joins`)."""
    model, processor = qwen25
    engine = HFEngine(model, processor, max_batch_size=16, batch_wait_s=0.0, max_batch_wait_s=30.0)
    long = GenerateRequest(
        engine_ids=user_turn(processor, "a long answer"),
        sampling=greedy(300).model_copy(update={"ignore_eos": True}),
    )
    running = asyncio.create_task(engine.generate(long))
    while engine.stats.batches == 0:
        await asyncio.sleep(0.001)
    burst = [
        GenerateRequest(engine_ids=user_turn(processor, f"question {i}"), sampling=greedy(4))
        for i in range(8)
    ]
    results = await asyncio.gather(*(engine.generate(r) for r in burst))
    assert not running.done()  # the burst joined while the long request still decoded
    await running
    await engine.close()
    assert all(len(result.output_ids) == 4 for result in results)
    assert engine.stats.batches == 1 and engine.stats.largest_batch == 9
    assert engine.stats.joins == 1


async def test_stop_token_ids_end_at_the_first_match_and_keep_it(engine: HFEngine) -> None:
    ids = user_turn(engine.processor, "count")
    free = await engine.generate(GenerateRequest(engine_ids=ids, sampling=sampled(8, 3)))
    stop = free.output_ids[-2]  # on the last allowed token, `length` would win (as in SGLang)
    at = free.output_ids.index(stop)
    params = sampled(8, 3).model_copy(update={"stop_token_ids": [stop]})
    stopped = await engine.generate(GenerateRequest(engine_ids=ids, sampling=params))
    assert stopped.output_ids == free.output_ids[: at + 1]
    assert stopped.logprobs == free.logprobs[: at + 1]
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == stop
    assert stopped.text == engine.processor.tokenizer.decode(free.output_ids[:at], skip_special_tokens=True)
    await engine.close()


async def test_stop_strings_end_generation_and_are_trimmed_from_text(engine: HFEngine) -> None:
    ids = user_turn(engine.processor, "say something")
    free = await engine.generate(GenerateRequest(engine_ids=ids, sampling=sampled(8, 5)))
    decode = engine.processor.tokenizer.decode
    stop = decode(free.output_ids[4:6])
    params = sampled(8, 5).model_copy(update={"stop": [stop]})
    stopped = await engine.generate(GenerateRequest(engine_ids=ids, sampling=params))
    out = stopped.output_ids
    assert out == free.output_ids[: len(out)]
    assert stopped.finish_reason.type == "stop" and stopped.finish_reason.matched == stop
    assert stop in decode(out) and stop not in decode(out[:-1])
    assert stopped.text == decode(out)[: decode(out).find(stop)]
    await engine.close()


async def test_stops_on_im_end_unless_ignore_eos(qwen25: Loaded) -> None:
    model, processor = qwen25
    biased = copy.deepcopy(model)
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[processor.ids.im_end] = 100.0
    biased.lm_head = head
    engine = HFEngine(biased, processor, batch_wait_s=0.0)
    ids = user_turn(processor, "finish now")
    done = await engine.generate(GenerateRequest(engine_ids=ids, sampling=sampled(8, 1)))
    assert done.output_ids == [processor.ids.im_end]
    assert done.finish_reason.type == "stop" and done.finish_reason.matched == processor.ids.im_end
    assert done.text == ""
    assert done.logprobs[0] == pytest.approx(0.0, abs=1e-6)
    params = sampled(3, 1).model_copy(update={"ignore_eos": True})
    ignored = await engine.generate(GenerateRequest(engine_ids=ids, sampling=params))
    assert ignored.output_ids == [processor.ids.im_end] * 3
    assert ignored.finish_reason.type == "length"
    await engine.close()


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
async def test_batched_multimodal_requests_equal_one_at_a_time(
    request: pytest.FixtureRequest, arch: str
) -> None:
    model, processor = request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3")
    two = images(0, (56, 84), (112, 56))
    requests = [
        GenerateRequest(engine_ids=user_turn(processor, "just text, a longer one"), sampling=greedy(4)),
        GenerateRequest(engine_ids=user_turn(processor, "one", 1), images=two[:1], sampling=sampled(4, 11)),
        GenerateRequest(
            engine_ids=user_turn(processor, "two images", 2), images=two[::-1], sampling=sampled(4, 12)
        ),
    ]
    alone = HFEngine(model, processor, max_batch_size=1, batch_wait_s=0.0)
    singles = [await alone.generate(r) for r in requests]
    await alone.close()
    together = HFEngine(model, processor, max_batch_size=8, batch_wait_s=1.0)
    batched = await asyncio.gather(*(together.generate(r) for r in requests))
    await together.close()
    assert together.stats.largest_batch == len(requests)
    for single, joint in zip(singles, batched, strict=True):
        assert joint.output_ids == single.output_ids
        assert joint.prompt_tokens == single.prompt_tokens
        np.testing.assert_allclose(joint.logprobs, single.logprobs, atol=ATOL)
    assert singles[2].prompt_tokens > len(requests[2].engine_ids)  # the pads were expanded


def mixed_requests(processor: VLProcessor) -> list[GenerateRequest]:
    """Rows of different lengths, with and without images, greedy, sampled and top-p; the first long enough
    to cross the attended length's buckets (128, 192, 256) in a cache of 300 positions."""
    pics = images(2, (56, 84), (112, 56))
    return [
        GenerateRequest(
            engine_ids=user_turn(processor, "a long answer to a long question:" + " why" * 140),
            sampling=sampled(120, 9).model_copy(update={"ignore_eos": True}),
        ),
        GenerateRequest(engine_ids=user_turn(processor, "one", 1), images=pics[:1], sampling=sampled(3, 1)),
        GenerateRequest(engine_ids=user_turn(processor, "two", 2), images=pics, sampling=sampled(8, 2)),
        GenerateRequest(engine_ids=user_turn(processor, "short"), sampling=greedy(5)),
        GenerateRequest(engine_ids=user_turn(processor, "again", 1), images=pics[1:], sampling=sampled(7, 3)),
        GenerateRequest(engine_ids=user_turn(processor, "last"), sampling=sampled(4, 4, top_p=0.9)),
    ]


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
async def test_the_static_kv_cache_decodes_as_the_dynamic_one(
    request: pytest.FixtureRequest, arch: str
) -> None:
    """Rows in the slots of a static KV cache (the fast path a GPU captures in CUDA graphs; eager here) get
    the tokens and logprobs of HF's dynamic cache: rows of different lengths, with and without images,
    greedy and sampled, one long enough to cross the attended length's buckets (128, 192, 256), rows that
    finish early and free their slots for queued requests that join mid-batch; a request too long for a
    slot decodes on the dynamic cache."""
    model, processor = request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3")
    requests = mixed_requests(processor)
    too_long = GenerateRequest(
        engine_ids=user_turn(processor, "too long for a slot:" + " word" * 250),
        sampling=sampled(40, 5).model_copy(update={"ignore_eos": True}),
    )
    results = {}
    for cache_len in (None, 300):
        engine = HFEngine(model, processor, max_batch_size=3, batch_wait_s=0.0, static_cache_len=cache_len)
        batched = await asyncio.gather(*(engine.generate(r) for r in requests))
        static_batches = engine.stats.static_batches
        results[cache_len] = [*batched, await engine.generate(too_long)]
        await engine.close()
        assert engine.stats.largest_batch == 3
        assert static_batches == (0 if cache_len is None else engine.stats.batches - 1)
        assert engine.stats.static_batches == static_batches  # the long request ran on the dynamic cache
    long_row, too_long_row = results[300][0], results[300][-1]
    assert long_row.prompt_tokens < 192 and long_row.prompt_tokens + 120 > 256  # crossed 192 and 256
    assert too_long_row.prompt_tokens < 300 < too_long_row.prompt_tokens + 40
    for dynamic, static in zip(results[None], results[300], strict=True):
        assert static.output_ids == dynamic.output_ids
        assert static.finish_reason == dynamic.finish_reason
        np.testing.assert_allclose(static.logprobs, dynamic.logprobs, atol=ATOL)


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
async def test_captured_steps_replay_as_eager_ones_across_batches_and_joins(
    request: pytest.FixtureRequest, arch: str
) -> None:
    """On a GPU, decode steps captured in CUDA graphs give the tokens and logprobs of the same steps run
    eagerly: in a second batch, whose prompt pass runs after the graphs were captured, and when queued rows
    join the slots that finished rows freed.

    Every request is queued before the first batch starts (`queued_together`), so both paths run the same
    batches, joins and prompt passes. Left to arrive as their prompts were prepared, the rows fell into
    batches by timing: a different packing of a prompt pass rounds differently, and at a near tie of a random
    model the eager path's own ids changed from run to run (docs/engines.md, "GPU tests")."""
    model, processor = request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3")
    on_gpu = copy.deepcopy(model).cuda()
    requests = mixed_requests(processor)
    results = {}
    for graphs in (False, True):
        engine = HFEngine(on_gpu, processor, max_batch_size=3, batch_wait_s=0.0, cuda_graphs=graphs)
        results[graphs] = [result for _ in range(2) for result in await queued_together(engine, requests)]
        await engine.close()
        assert engine.stats.batches >= 2 and engine.stats.static_batches == engine.stats.batches
    for eager, captured in zip(results[False], results[True], strict=True):
        assert captured.output_ids == eager.output_ids
        np.testing.assert_allclose(captured.logprobs, eager.logprobs, atol=ATOL)


async def test_requests_queued_together_run_the_same_batches_every_time(
    request: pytest.FixtureRequest,
) -> None:
    """Queued in order while the engine is paused, the same requests run the same batches, joins and prompt
    passes each time, whatever the time each prompt took to prepare: what the GPU test above relies on."""
    model, processor = request.getfixturevalue("qwen25")
    requests = mixed_requests(processor)
    runs = []
    for _ in range(2):
        engine = HFEngine(model, processor, max_batch_size=3, batch_wait_s=0.0, static_cache_len=300)
        results = await queued_together(engine, requests)
        await engine.close()
        stats = engine.stats
        runs.append(([r.output_ids for r in results], stats.batches, stats.joins, stats.prompt_passes))
    assert runs[0] == runs[1]
    _, batches, joins, passes = runs[0]
    assert (batches, joins, passes) == (1, passes - 1, passes) and passes >= 2


async def queued_together(engine: HFEngine, requests: list[GenerateRequest]) -> list[GenerateResult]:
    """`requests`' results, queued in order (each prompt is prepared on a thread of its own, so together they
    would queue in the order their preparations ended) while the engine was paused: its batches and joins
    then follow from the rows alone, not from when each prompt was ready."""
    await engine.pause_generation("in_place")
    calls = []

    async def queued(count: int) -> None:
        while engine.queued < count:
            await asyncio.sleep(0.01)

    for count, r in enumerate(requests, start=1):
        calls.append(asyncio.ensure_future(engine.generate(r)))
        await asyncio.wait_for(queued(count), timeout=60)
    await engine.continue_generation()
    return list(await asyncio.gather(*calls))


@pytest.mark.parametrize("cache_len", [None, 200])
@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
async def test_prompts_prefill_packed_and_decode_as_the_trainer_scores_them(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, arch: str, cache_len: int | None
) -> None:
    """Greedy prompts of different lengths, with and without images, go through the prompt pass as one
    packed row (no padding, attention bounded per prompt) and decode from the dynamic or the static cache:
    each gets the tokens it gets alone, and the logprobs of the trainer's recompute of its sequence."""
    model, processor = request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3")
    pics = images(4, (56, 84), (112, 56))
    turns = [("just text, longer than the other prompts by far", 0), ("one", 1), ("two images", 2), ("hi", 0)]
    params = greedy(6).model_copy(update={"ignore_eos": True})
    requests = [
        GenerateRequest(engine_ids=user_turn(processor, text, n), images=pics[:n], sampling=params)
        for text, n in turns
    ]
    alone = HFEngine(model, processor, max_batch_size=1, batch_wait_s=0.0, static_cache_len=cache_len)
    singles = [await alone.generate(r) for r in requests]
    await alone.close()
    rows: list[list[int]] = []
    packed_sdpa = attention.sequence_sdpa_attention

    def recording(*args: Any, packed_cu_seqlens: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if packed_cu_seqlens is not None:
            rows.append([args[1].shape[0], args[1].shape[2], *packed_cu_seqlens.diff().tolist()])
        return packed_sdpa(*args, packed_cu_seqlens=packed_cu_seqlens, **kwargs)

    monkeypatch.setitem(attention._PACKED, attention.SEQUENCE_SDPA_ATTENTION, recording)
    engine = HFEngine(model, processor, max_batch_size=8, batch_wait_s=1.0, static_cache_len=cache_len)
    batched = await asyncio.gather(*(engine.generate(r) for r in requests))
    await engine.close()
    assert engine.stats.batches == 1 and engine.stats.static_batches == (cache_len is not None)
    lengths = [r.prompt_tokens for r in batched]
    assert len(set(lengths)) == len(lengths)
    packed = [1, sum(lengths), *sorted(lengths)]  # one row of every prompt, in the order they queued
    assert rows and all(row[:2] + sorted(row[2:]) == packed for row in rows)
    for (_, n), req, single, result in zip(turns, requests, singles, batched, strict=True):
        assert result.output_ids == single.output_ids
        np.testing.assert_allclose(result.logprobs, single.logprobs, atol=ATOL)
        grids = [processor.image_grid(pic) for pic in req.images]
        prompt = processor.expand_image_pads(req.engine_ids, grids)
        mask = [0] * len(prompt) + [1] * len(result.output_ids)
        scored = sequence_logprobs(model, processor, prompt + result.output_ids, pics[:n], 1.0, mask=mask)
        expected = scored[torch.tensor(mask, dtype=torch.bool)].tolist()
        np.testing.assert_allclose(result.logprobs, expected, atol=ATOL)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
async def test_logprobs_are_log_softmax_of_a_fresh_forward_pass(engine: HFEngine, temperature: float) -> None:
    ids = user_turn(engine.processor, "score me")
    params = SamplingParams(max_new_tokens=6, temperature=temperature, sampling_seed=2)
    result = await engine.generate(GenerateRequest(engine_ids=ids, sampling=params))
    full = torch.tensor([ids + result.output_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=full).logits[0, len(ids) - 1 : -1].float()
    logits = logits if temperature == 0 else logits / temperature
    expected = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(result.output_ids)[:, None])
    np.testing.assert_allclose(result.logprobs, expected.squeeze(-1).tolist(), atol=ATOL)
    await engine.close()


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl"])
async def test_multiturn_logprobs_match_the_trainer_recompute(
    request: pytest.FixtureRequest, arch: str
) -> None:
    """HFEngine's logprobs equal `learner.logprobs.sequence_logprobs` over train_ids, at mask-1 positions."""
    model, processor = request.getfixturevalue("qwen25" if arch == "qwen2_5_vl" else "qwen3")
    engine = HFEngine(model, processor, batch_wait_s=0.0)
    temperature = 0.8
    pics = images(1, (84, 56), (56, 56))
    params = SamplingParams(max_new_tokens=5, temperature=temperature, sampling_seed=4)
    engine_ids = user_turn(processor, "first look", 1)
    train_ids = processor.expand_image_pads(engine_ids, [processor.image_grid(pics[0])])
    mask = [0] * len(train_ids)
    engine_logprobs: list[float] = []
    for turn in range(2):
        result = await engine.generate(
            GenerateRequest(engine_ids=engine_ids, images=pics[: turn + 1], sampling=params)
        )
        assert result.prompt_tokens == len(train_ids)
        engine_ids = engine_ids + result.output_ids
        train_ids = train_ids + result.output_ids
        mask += [1] * len(result.output_ids)
        engine_logprobs += result.logprobs
        if turn == 0:
            observation = user_turn(processor, "second look", 1, first=False)
            engine_ids += observation
            train_ids += processor.expand_image_pads(observation, [processor.image_grid(pics[1])])
            mask += [0] * (len(train_ids) - len(mask))
    await engine.close()
    recomputed = sequence_logprobs(model, processor, train_ids, pics, temperature, mask=mask)
    scored = recomputed[torch.tensor(mask, dtype=torch.bool)]
    np.testing.assert_allclose(engine_logprobs, scored.tolist(), atol=ATOL)


async def test_update_weights_bumps_the_version_and_changes_outputs(qwen25: Loaded) -> None:
    model, processor = qwen25
    engine = HFEngine(copy.deepcopy(model), processor, batch_wait_s=0.0)
    ids = user_turn(processor, "before and after")
    before = await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(3)))
    name = "model.language_model.norm.weight"
    new = {name: torch.full_like(engine.model.state_dict()[name], 3.0)}
    assert await engine.update_weights(new) == "1"
    assert engine.weight_version == "1"
    after = await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(3)))
    assert after.weight_version == "1"
    assert not np.allclose(after.logprobs, before.logprobs, atol=ATOL)
    with pytest.raises(EngineRequestError, match="unknown parameter names"):
        await engine.update_weights({"no.such.weight": torch.zeros(1)})
    with pytest.raises(EngineRequestError, match="shape mismatch"):
        await engine.update_weights({name: torch.zeros(3)})
    assert engine.weight_version == "1"
    assert await engine.update_weights(new, weight_version="step-7") == "step-7"
    await engine.close()


async def test_weight_update_waits_for_the_running_batch(qwen25: Loaded) -> None:
    model, processor = qwen25
    ids = user_turn(processor, "long")
    reference = HFEngine(model, processor, batch_wait_s=0.0)
    old = await reference.generate(GenerateRequest(engine_ids=ids, sampling=greedy(12)))
    await reference.close()
    engine = HFEngine(copy.deepcopy(model), processor, batch_wait_s=0.0)
    running = asyncio.create_task(engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(12))))
    while not engine.stats.batches:
        await asyncio.sleep(0.01)
    name = "model.language_model.norm.weight"
    await engine.update_weights({name: torch.full_like(engine.model.state_dict()[name], 2.0)})
    result = await running
    assert result.weight_version == "0"
    assert result.output_ids == old.output_ids and result.logprobs == old.logprobs  # no torn weights
    new = await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(12)))
    assert new.weight_version == "1"
    assert not np.allclose(new.logprobs, old.logprobs, atol=ATOL)
    await engine.close()


async def test_abort_ends_queued_and_running_requests(engine: HFEngine) -> None:
    engine.max_batch_size = 1
    ids = user_turn(engine.processor, "go on forever")
    endless = SamplingParams(max_new_tokens=20_000, temperature=0.0, ignore_eos=True)

    def start(rid: str) -> asyncio.Task[GenerateResult]:
        return asyncio.create_task(
            engine.generate(GenerateRequest(engine_ids=ids, sampling=endless, rid=rid))
        )

    async def abort_until_done(rid: str, task: asyncio.Task[GenerateResult]) -> GenerateResult:
        while not task.done():
            await engine.abort(rid)
            await asyncio.sleep(0.05)
        return task.result()

    running = start("a")
    while not engine.stats.batches:
        await asyncio.sleep(0.01)
    queued = start("b")  # waits behind "a": the batch holds one request
    second = await asyncio.wait_for(abort_until_done("b", queued), 60)
    assert second.finish_reason.type == "abort" and second.output_ids == []
    first = await asyncio.wait_for(abort_until_done("a", running), 60)
    assert first.finish_reason.type == "abort" and first.finish_reason.message == "aborted by request"
    assert 0 < len(first.output_ids) < 20_000
    assert len(first.logprobs) == len(first.output_ids)
    await engine.close()


async def test_pause_holds_new_batches_until_continue(engine: HFEngine) -> None:
    ids = user_turn(engine.processor, "wait for it")
    await engine.pause_generation("retract")
    assert not await engine.health()
    held = asyncio.create_task(engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(2))))
    await asyncio.sleep(0.3)
    assert not held.done() and engine.stats.batches == 0
    await engine.continue_generation()
    assert (await asyncio.wait_for(held, 60)).finish_reason.type == "length"
    endless = SamplingParams(max_new_tokens=20_000, temperature=0.0, ignore_eos=True)
    running = asyncio.create_task(engine.generate(GenerateRequest(engine_ids=ids, sampling=endless)))
    while engine.stats.batches < 2:
        await asyncio.sleep(0.01)
    await engine.pause_generation("abort")
    assert (await asyncio.wait_for(running, 60)).finish_reason.type == "abort"
    await engine.continue_generation()
    assert await engine.health()
    await engine.close()


async def test_bad_requests_raise_and_leave_the_engine_working(engine: HFEngine) -> None:
    processor = engine.processor
    one_image = images(2, (56, 56))
    ids = user_turn(processor, "look", 1)
    with pytest.raises(EngineRequestError, match=r"1 <\|image_pad\|> tokens for 0 images"):
        await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(1)))
    expanded = processor.expand_image_pads(ids, [processor.image_grid(one_image[0])])
    with pytest.raises(EngineRequestError, match="single-pad"):
        await engine.generate(GenerateRequest(engine_ids=expanded, images=one_image, sampling=greedy(1)))
    for out_of_range in ([10**7], [5, -1]):
        with pytest.raises(EngineRequestError, match="out of range"):
            await engine.generate(GenerateRequest(engine_ids=out_of_range, sampling=greedy(1)))
    with pytest.raises(EngineRequestError, match="bad image"):
        await engine.generate(GenerateRequest(engine_ids=ids, images=["data:image/png;base64,AAAA"]))
    ok = await engine.generate(GenerateRequest(engine_ids=ids, images=one_image, sampling=greedy(1)))
    assert not ok.aborted and ok.prompt_tokens == len(expanded)
    assert await engine.health()
    await engine.close()


async def test_close_aborts_pending_requests(engine: HFEngine) -> None:
    ids = user_turn(engine.processor, "interrupted")
    endless = SamplingParams(max_new_tokens=20_000, temperature=0.0, ignore_eos=True)
    pending = asyncio.create_task(engine.generate(GenerateRequest(engine_ids=ids, sampling=endless)))
    while not engine.stats.batches:
        await asyncio.sleep(0.01)
    await engine.close()
    result = await asyncio.wait_for(pending, 30)
    assert result.aborted and result.finish_reason.message == "engine is closed"
    late = await engine.generate(GenerateRequest(engine_ids=ids, sampling=greedy(1)))
    assert late.aborted


def test_a_groups_first_prompt_is_laid_out_once(qwen25: Loaded, monkeypatch: pytest.MonkeyPatch) -> None:
    """The samples of a GRPO group send one first prompt: its mRoPE positions and prefix-cache key are found
    once and are those a fresh engine finds; each request keeps its own images and stop ids."""
    model, processor = qwen25
    found: list[int] = []
    rope_index = model.model.get_rope_index
    monkeypatch.setattr(model.model, "get_rope_index", lambda *a, **k: found.append(1) or rope_index(*a, **k))
    rules = HFEngine(*qwen25, batch_wait_s=0.0).prompts
    ids, urls = user_turn(processor, "Where now?", 1), images(7, (56, 84))
    sample = GenerateRequest(engine_ids=ids, images=urls, sampling=SamplingParams(max_new_tokens=4))
    stopping = SamplingParams(max_new_tokens=4, stop_token_ids=[5])
    group = [rules.prepare(sample.model_copy(update={"sampling": stopping})) for _ in range(3)]
    first = rules.prepare(copy.deepcopy(sample))
    assert len(found) == 1
    fresh = HFEngine(*qwen25, batch_wait_s=0.0).prompts.prepare(sample)
    for prompt in (*group, first):
        assert prompt.input_ids == fresh.input_ids and prompt.image_starts == fresh.image_starts
        assert torch.equal(prompt.positions, fresh.positions) and prompt.rope_delta == fresh.rope_delta
        assert np.array_equal(prompt.key.tokens, fresh.key.tokens) and prompt.key.blocks == fresh.key.blocks
        assert torch.equal(prompt.images[0].pixel_values, fresh.images[0].pixel_values)
    assert 5 in group[0].stop_ids and first.stop_ids == fresh.stop_ids and 5 not in first.stop_ids
    rules.prepare(GenerateRequest(engine_ids=user_turn(processor, "And now?", 1), images=urls))
    assert len(found) == 3


async def test_the_counters_hold_a_requests_work_once_its_result_is_in(engine: HFEngine) -> None:
    """A step's engine figures are read as soon as its episodes are back: by then the counters must hold
    the prompt pass and the batch time that made their results (the batch ends after its last handover)."""
    for _ in range(12):
        before = dataclasses.replace(engine.stats)
        await engine.generate(
            GenerateRequest(engine_ids=user_turn(engine.processor, "count"), sampling=greedy(1))
        )
        counted = engine.stats.since(before)
        assert counted.prompt_passes == 1 and counted.prompt_s > 0
        assert counted.batch_s >= counted.prompt_s
