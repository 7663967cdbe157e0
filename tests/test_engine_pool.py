"""`EnginePool`: requests spread by load, an episode's turns kept on one engine, and an engine that dies
routed around (over real HTTP, `vistarl engine serve`'s app on the tiny checkpoint) until it serves the
others' weights again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText

from tests.servers import wait_until
from vistarl.httpserver.launch import serving_in_loop
from vistarl.trainer.config import load_config
from vistarl.trainer.rollout.engines.base import GenerateRequest
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.pool import EnginePool
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.engines.server import EngineServerSettings, create_app
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.engines.sglang_api import SamplingParams
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.run.stack import build_engine


def turn(processor: VLProcessor, session: str) -> GenerateRequest:
    """A one-token greedy turn of episode `session`."""
    return GenerateRequest(
        engine_ids=[processor.ids.im_start],
        sampling=SamplingParams(max_new_tokens=1, temperature=0.0),
        session=session,
    )


async def test_first_turns_go_to_the_least_loaded_engine_and_later_turns_follow_their_episode(
    tiny_qwen25: Path,
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    members = [ScriptedEngine(processor, lambda index, request: "ok") for _ in range(3)]
    pool = EnginePool(members)
    await pool.pause_generation("in_place")  # held in flight: each first turn sees the others' load
    first = [asyncio.create_task(pool.generate(turn(processor, f"e{i}"))) for i in range(6)]
    assert await asyncio.to_thread(wait_until, lambda: sum(pool.in_flight) == 6, 5)
    assert pool.in_flight == [2, 2, 2]
    await pool.continue_generation()
    assert not any(result.aborted for result in await asyncio.gather(*first))
    placed = {request.session: i for i, member in enumerate(members) for request in member.requests}
    for _ in range(2):  # later turns, one episode after another: each on its first turn's engine
        for session in sorted(placed):
            await pool.generate(turn(processor, session))
    for index, member in enumerate(members):
        sessions = [request.session for request in member.requests]
        assert sorted(sessions) == sorted(3 * [s for s, i in placed.items() if i == index])
    assert pool.sent == [6, 6, 6]
    await pool.close()


@contextlib.asynccontextmanager
async def engine_server(
    engine: HFEngine, port: int = 0, *, await_weights: bool = False
) -> AsyncIterator[str]:
    """`vistarl engine serve`'s app on `engine`, in this loop; the engine outlives it."""
    app = create_app(engine, EngineServerSettings(await_weights=await_weights))
    app.router.lifespan_context = _no_lifespan  # stopping the server stands for its process dying
    async with serving_in_loop(app, port=port, log_level="warning") as url:
        yield url


@contextlib.asynccontextmanager
async def _no_lifespan(app: object) -> AsyncIterator[None]:
    yield


async def test_a_dead_engine_is_routed_around_until_it_serves_the_weights_the_others_serve(
    tiny_qwen25: Path,
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen25, dtype=torch.float32)
    engines = [HFEngine(model, processor), HFEngine(model, processor)]
    async with contextlib.AsyncExitStack() as stack:
        doomed = await stack.enter_async_context(contextlib.AsyncExitStack())
        urls = [await doomed.enter_async_context(engine_server(engines[0]))]
        urls.append(await stack.enter_async_context(engine_server(engines[1])))
        members = [SGLangEngine(url, processor, retry_deadline_s=1.0) for url in urls]
        pool = EnginePool(members, probe_s=0.1)
        stack.push_async_callback(pool.close)
        assert not (await pool.generate(turn(processor, "stays"))).aborted
        assert pool.sent == [1, 0]  # engine 0 holds episode "stays"
        await doomed.aclose()  # engine 0 dies; the trainer pushes version 3 to engine 1
        await engines[1].update_weights({}, "3")
        assert not (await pool.generate(turn(processor, "stays"))).aborted  # the turn goes to engine 1
        assert pool.sent == [2, 1] and pool.serving == [1]
        await pool.pause_generation("in_place")  # engine 0 is not reached, engine 1 is paused
        assert not await members[1].health()  # 503 while paused
        await pool.continue_generation()
        assert await members[1].health()
        port = int(urls[0].rsplit(":", 1)[1])
        await stack.enter_async_context(engine_server(engines[0], port, await_weights=True))
        await asyncio.sleep(0.5)  # probes see it back, serving its starting weights: still out
        assert pool.serving == [1]
        assert not (await pool.generate(turn(processor, "new"))).aborted
        assert pool.sent == [2, 2]
        await members[0].update_weights_from_disk(str(tiny_qwen25), "3")  # the re-push
        assert await asyncio.to_thread(wait_until, lambda: pool.serving == [0, 1], 5)
        assert not (await pool.generate(turn(processor, "newer"))).aborted
        assert pool.sent == [3, 2]
    for engine in engines:
        await engine.close()


@pytest.mark.parametrize("local", [None, 0])
async def test_a_pool_takes_the_transports_its_push_targets_share(
    tiny_qwen25: Path, local: int | None
) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    model = AutoModelForImageTextToText.from_pretrained(tiny_qwen25, dtype=torch.float32)
    here = HFEngine(model, processor)
    servers = [SGLangEngine("http://127.0.0.1:9", processor), SGLangEngine("http://127.0.0.1:10", processor)]
    pool = EnginePool([here, *servers] if local == 0 else servers, local=local)
    if local is None:
        assert pool.push_targets == servers and pool.weight_transports == ("disk", "nccl")
    else:
        assert pool.push_targets == [here] and pool.weight_transports == ("in_process",)
        assert await pool.load_weights(lambda live: None, "4") == "4" == here.weight_version
    await pool.close()


async def test_behind_a_router_the_router_generates_and_the_servers_take_the_pushes(
    tiny_qwen25: Path,
) -> None:
    """`rollout.engine: sglang:ROUTER` with `sync.engine_urls`: the stack's pool generates through the
    router, its push targets are the servers; here in-process scripted engines stand in for both."""
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    servers = [ScriptedEngine(processor, lambda index, request: "ok") for _ in range(2)]
    router = ScriptedEngine(processor, lambda index, request: "routed")
    pool = EnginePool(servers, router=router)
    assert (await pool.generate(turn(processor, "e"))).text == "routed"
    assert [len(s.requests) for s in servers] == [0, 0] and pool.push_targets == servers
    assert await pool.update_weights_from_disk(str(tiny_qwen25), "2") == "2"
    assert [s.weight_version for s in servers] == ["2", "2"] and router.weight_version == "0"
    await pool.close()
    cfg = load_config(
        None, ["rollout.engine=sglang:http://router:30000", "sync.engine_urls=[http://a:1, http://b:1]"]
    )
    built = build_engine(cfg, processor, tiny_qwen25, None)
    assert isinstance(built, EnginePool) and isinstance(built.router, SGLangEngine)
    urls = [member.url for member in built.push_targets if isinstance(member, SGLangEngine)]
    assert urls == ["http://a:1", "http://b:1"]
    await built.close()
