"""`SGLangEngine` against `vistarl engine serve` over real HTTP; the app's guards; a dead engine; its
OpenAI chat completions, and the agent loop of docs/agents.md against it and `vistarl serve sokoban`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from transformers import AutoModelForImageTextToText, PreTrainedModel

from tests.envs.serving import served as env_served
from tests.retries import retry_waits
from tests.vl_samples import noise_image
from vistarl.clients.images import encode_image
from vistarl.clients.protocol import ToolCall
from vistarl.devtools.servers import running_process, vistarl_cmd
from vistarl.devtools.tiny_checkpoint import build_model
from vistarl.httpserver.launch import free_port, serving_in_loop
from vistarl.services.env_api import load_env_factory
from vistarl.services.server.tool_calls import ToolActions
from vistarl.services.sokoban.actions import parse_actions
from vistarl.trainer.rollout.engines.base import EngineRequestError, EngineUnavailableError, GenerateRequest
from vistarl.trainer.rollout.engines.chat import ChatCompletionRequest, completion, generate_request
from vistarl.trainer.rollout.engines.hf import HFEngine
from vistarl.trainer.rollout.engines.loading import load_engine, make_engine
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.engines.server import EngineServerSettings, create_app
from vistarl.trainer.rollout.engines.sglang import SGLangEngine
from vistarl.trainer.rollout.engines.sglang_api import SERVER_KEEP_ALIVE_S, SamplingParams
from vistarl.trainer.rollout.engines.spec import EngineSpec
from vistarl.trainer.rollout.processor import VLProcessor

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def served(tiny_qwen25: Path) -> Iterator[str]:
    """`vistarl engine serve` on the tiny Qwen2.5-VL checkpoint, in its own process, started in the
    checkpoint's parent directory on a relative `--model`, as a compose service names it."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = vistarl_cmd(
        "engine", "serve", "--model", tiny_qwen25.name, "--port", str(port), "--log-level", "warning"
    )
    env = {"PYTHONPATH": str(ROOT)}
    with running_process(
        args, ready_url=f"{url}/health_generate", env=env, timeout=180, cwd=tiny_qwen25.parent
    ):
        yield url


@pytest.fixture(scope="module")
def processor(tiny_qwen25: Path) -> VLProcessor:
    return VLProcessor.from_pretrained(tiny_qwen25)


@pytest.fixture(scope="module")
def loaded(tiny_qwen25: Path, processor: VLProcessor) -> tuple[PreTrainedModel, VLProcessor]:
    """The same checkpoint loaded in this process, for in-process engines."""
    return AutoModelForImageTextToText.from_pretrained(tiny_qwen25, dtype=torch.float32), processor


@pytest.fixture
async def client(served: str, processor: VLProcessor) -> AsyncIterator[SGLangEngine]:
    engine = SGLangEngine(served, processor, retry_deadline_s=10)
    yield engine
    await engine.close()


def pictures(seed: int, *sizes: tuple[int, int]) -> list[str]:
    rng = np.random.default_rng(seed)
    return [encode_image(noise_image(rng, w, h)) for w, h in sizes]


def user_turn(processor: VLProcessor, text: str, n_images: int = 0, first: bool = True) -> list[int]:
    vision = "<|vision_start|><|image_pad|><|vision_end|>" * n_images
    opening = "" if first else "\n"
    rendered = f"{opening}<|im_start|>user\n{vision}{text}<|im_end|>\n<|im_start|>assistant\n"
    return list(processor.tokenizer.encode(rendered))


GREEDY = SamplingParams(max_new_tokens=4, temperature=0.0)


async def test_text_generation_over_http(client: SGLangEngine, processor: VLProcessor) -> None:
    ids = user_turn(processor, "hello over http")
    result = await client.generate(GenerateRequest(engine_ids=ids, sampling=GREEDY))
    assert not result.aborted
    assert result.prompt_tokens == len(ids)
    assert len(result.output_ids) == len(result.logprobs) == 4
    assert result.finish_reason.type == "length" and result.finish_reason.length == 4
    assert result.text == processor.tokenizer.decode(result.output_ids, skip_special_tokens=True)
    assert client.weight_version == result.weight_version


async def test_images_across_turns_pass_the_prompt_tokens_check(
    client: SGLangEngine, processor: VLProcessor
) -> None:
    images = pictures(0, (56, 84), (84, 56))
    engine_ids = user_turn(processor, "first board", 1)
    first = await client.generate(GenerateRequest(engine_ids=engine_ids, images=images[:1], sampling=GREEDY))
    assert not first.aborted
    engine_ids = engine_ids + first.output_ids + user_turn(processor, "second board", 1, first=False)
    request = GenerateRequest(engine_ids=engine_ids, images=images, sampling=GREEDY)
    second = await client.generate(request)
    assert not second.aborted, second.finish_reason.message
    assert second.prompt_tokens == client.expected_prompt_tokens(request) > len(engine_ids)


async def test_served_greedy_output_equals_in_process_hf_engine(
    client: SGLangEngine, loaded: tuple[PreTrainedModel, VLProcessor]
) -> None:
    local = HFEngine(*loaded)
    images = pictures(1, (56, 56))
    request = GenerateRequest(
        engine_ids=user_turn(local.processor, "same answer?", 1), images=images, sampling=GREEDY
    )
    remote_result = await client.generate(request)
    local_result = await local.generate(request)
    await local.close()
    assert remote_result.output_ids == local_result.output_ids
    np.testing.assert_allclose(remote_result.logprobs, local_result.logprobs, atol=1e-5)
    assert remote_result.prompt_tokens == local_result.prompt_tokens


async def test_unknown_sampling_key_is_rejected_with_400(served: str) -> None:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_tokens": 4}}
    async with httpx.AsyncClient(base_url=served, timeout=30) as http:
        response = await http.post("/generate", json=body)
    assert response.status_code == 400
    assert "max_tokens" in response.json()["error"]["message"]
    with pytest.raises(ValidationError):
        SamplingParams.model_validate({"max_tokens": 4})


async def test_abort_request_ends_a_running_generation(client: SGLangEngine, processor: VLProcessor) -> None:
    endless = SamplingParams(max_new_tokens=20_000, temperature=0.0, ignore_eos=True)
    request = GenerateRequest(
        engine_ids=user_turn(processor, "never stop"), sampling=endless, rid="endless-1"
    )
    task = asyncio.create_task(client.generate(request))
    deadline = time.monotonic() + 60
    while not task.done() and time.monotonic() < deadline:
        await client.abort("endless-1")  # a no-op until the server knows the rid
        await asyncio.sleep(0.1)
    result = await asyncio.wait_for(task, 10)
    assert result.finish_reason.type == "abort"
    assert len(result.output_ids) < 20_000


async def test_pause_and_continue_generation(client: SGLangEngine) -> None:
    await client.pause_generation("retract")
    try:
        assert not await client.health()
    finally:
        await client.continue_generation()
    assert await client.health()


async def test_update_weights_from_disk_bumps_weight_version(
    client: SGLangEngine, processor: VLProcessor, tiny_qwen25: Path, tmp_path: Path
) -> None:
    other = tmp_path / "seed1"
    build_model("qwen2_5_vl", seed=1).save_pretrained(other)
    ids = user_turn(processor, "which weights?")
    before = await client.generate(GenerateRequest(engine_ids=ids, sampling=GREEDY))
    try:
        version = await client.update_weights_from_disk(os.path.relpath(other, tiny_qwen25.parent))
        assert version != before.weight_version
        info = await client.model_info()
        assert (info.weight_version, info.model_path) == (version, str(other.resolve()))
        after = await client.generate(GenerateRequest(engine_ids=ids, sampling=GREEDY))
        assert after.weight_version == version
        assert not np.allclose(after.logprobs, before.logprobs, atol=1e-4)
        with pytest.raises(EngineRequestError, match="cannot load"):
            await client.update_weights_from_disk(str(tmp_path / "missing"))
        assert client.weight_version == version
    finally:
        await client.update_weights_from_disk(str(tiny_qwen25), weight_version="restored")
    restored = await client.generate(GenerateRequest(engine_ids=ids, sampling=GREEDY))
    assert restored.weight_version == "restored"
    np.testing.assert_allclose(restored.logprobs, before.logprobs, atol=1e-6)


async def test_an_awaiting_server_generates_only_after_its_first_weight_update(
    loaded: tuple[PreTrainedModel, VLProcessor], tiny_qwen25: Path, processor: VLProcessor
) -> None:
    app = create_app(HFEngine(*loaded), EngineServerSettings(await_weights=True))
    async with serving_in_loop(app, log_level="warning") as url:
        client = SGLangEngine(url, processor, retry_deadline_s=10)
        try:
            assert (await client.model_info()).weight_version == "default"
            assert not await client.health()
            ids = user_turn(processor, "which weights?")
            waiting = asyncio.create_task(client.generate(GenerateRequest(engine_ids=ids, sampling=GREEDY)))
            await client.continue_generation()  # a push that failed midway must not release it
            assert (await client.model_info()).weight_version == "default" and not waiting.done()
            await client.update_weights_from_disk(str(tiny_qwen25), weight_version="7")
            result = await waiting
            assert not result.aborted and result.weight_version == "7"  # generated on the pushed weights
            assert (await client.model_info()).weight_version == "7" and await client.health()
        finally:
            await client.close()


@pytest.fixture
def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The host names this process resolves but the loopback's: where a model-hub lookup would go (each
    takes ~50 s offline)."""
    looked_up: list[str] = []
    resolve = socket.getaddrinfo

    def recorded(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in (None, "127.0.0.1", "::1", "localhost"):
            looked_up.append(host if isinstance(host, str) else repr(host))
        return resolve(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", recorded)
    return looked_up


async def test_a_worker_elsewhere_loads_the_processor_from_the_absolute_path_served(
    served: str, tiny_qwen25: Path, processor: VLProcessor, lookups: list[str]
) -> None:
    assert Path.cwd() != tiny_qwen25.parent, "this process must run elsewhere than the server"
    async with httpx.AsyncClient() as http:
        info = (await http.get(f"{served}/model_info")).json()
    assert info["model_path"] == info["tokenizer_path"] == str(tiny_qwen25.resolve())
    engine, loaded = await load_engine(EngineSpec.parse(f"hf:{served}"))
    await engine.close()
    assert loaded.tokenizer.get_vocab() == processor.tokenizer.get_vocab()
    assert lookups == [], "loading the processor looked up a model hub"


async def test_missing_checkpoints_fail_at_once_naming_the_path(
    loaded: tuple[PreTrainedModel, VLProcessor], tiny_qwen25: Path, tmp_path: Path, lookups: list[str]
) -> None:
    for missing in (str(tmp_path / "missing"), "Qwen/Qwen2.5-VL-3B-Instruct"):
        with pytest.raises(FileNotFoundError, match=f"{re.escape(missing)}.*downloads nothing"):
            VLProcessor.from_pretrained(missing)
    elsewhere = HFEngine(*loaded, model_path="/srv/models/not-here")
    async with serving_in_loop(create_app(elsewhere), log_level="warning") as url:
        spec = EngineSpec.parse(f"hf:{url}")
        with pytest.raises(FileNotFoundError, match=r"serves '/srv/models/not-here'.*--tokenizer DIR"):
            await load_engine(spec)
        with pytest.raises(FileNotFoundError, match="missing"):
            await load_engine(spec, tmp_path / "missing")
        engine, told = await load_engine(spec, tiny_qwen25)
        await engine.close()
    assert told.tokenizer.get_vocab() == loaded[1].tokenizer.get_vocab()
    assert lookups == [], "a missing checkpoint was looked up on a model hub"


async def test_prompt_tokens_mismatch_becomes_an_abort_naming_both_counts(
    served: str, tiny_qwen3: Path, processor: VLProcessor
) -> None:
    wrong = SGLangEngine(served, VLProcessor.from_pretrained(tiny_qwen3))  # patch 16 instead of 14
    request = GenerateRequest(
        engine_ids=user_turn(processor, "look", 1), images=pictures(2, (56, 56)), sampling=GREEDY
    )
    result = await wrong.generate(request)
    await wrong.close()
    served_count = SGLangEngine(served, processor).expected_prompt_tokens(request)
    local_count = wrong.expected_prompt_tokens(request)
    assert result.aborted and result.output_ids == []
    message = result.finish_reason.message or ""
    assert "prompt_tokens mismatch" in message
    assert f"counted {served_count}" in message and f"gives {local_count}" in message


async def test_dead_engine_returns_an_abort_within_its_deadline(
    processor: VLProcessor, caplog: pytest.LogCaptureFixture
) -> None:
    """The retries stop at the retry deadline: their waits fit in it, and the abort counts the attempts."""
    caplog.set_level(logging.INFO, logger="vistarl.trainer.rollout.engines.sglang")
    engine = SGLangEngine(f"http://127.0.0.1:{free_port()}", processor, retry_deadline_s=1.5)
    result = await engine.generate(
        GenerateRequest(engine_ids=user_turn(processor, "anyone?"), sampling=GREEDY)
    )
    message = result.finish_reason.message or ""
    assert result.aborted and "ClientConnectorError" in message
    waits = retry_waits(caplog.records)
    assert waits and sum(waits) < 1.5 and f"after {len(waits) + 1} attempt(s)" in message
    assert not await engine.health()
    with pytest.raises(EngineUnavailableError):
        await engine.model_info()
    await engine.close()


async def test_bearer_token_and_body_limit_guard_the_app(loaded: tuple[PreTrainedModel, VLProcessor]) -> None:
    local = HFEngine(*loaded)
    settings = EngineServerSettings(api_token="s3cret", max_body_bytes=4096)
    app = create_app(local, settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        assert (await http.get("/model_info")).status_code == 401
        assert (await http.get("/health_generate")).status_code == 200
        auth = {"authorization": "Bearer s3cret"}
        assert (await http.get("/model_info", headers=auth)).json()["weight_version"] == "0"
        big = {"input_ids": [1] * 5000, "sampling_params": {"max_new_tokens": 1}}
        assert (await http.post("/generate", json=big, headers=auth)).status_code == 413
    await local.close()


async def scrape(http: httpx.AsyncClient) -> dict[str, float]:
    """`GET /metrics` without a token, as each sample's name and value."""
    scraped = await http.get("/metrics")
    assert scraped.status_code == 200
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(scraped.text)
        for sample in family.samples
    }


async def test_metrics_count_the_batch_loops_work_without_a_token(
    loaded: tuple[PreTrainedModel, VLProcessor], processor: VLProcessor
) -> None:
    local = HFEngine(*loaded)
    app = create_app(local, EngineServerSettings(api_token="s3cret"))
    transport = httpx.ASGITransport(app=app)
    auth = {"authorization": "Bearer s3cret"}
    bodies = [
        {"input_ids": user_turn(processor, "a picture", n_images=1), "image_data": pictures(3, (56, 56))},
        {"input_ids": user_turn(processor, "plain text")},
    ]
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        answers = await asyncio.gather(
            *(
                http.post(
                    "/generate",
                    json={**body, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}},
                    headers=auth,
                )
                for body in bodies
            )
        )
        counted = await scrape(http)
        deadline = time.monotonic() + 10  # a batch's seconds are counted once it ends, after its answers
        while counted["vistarl_engine_batch_seconds_total"] == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            counted = await scrape(http)
    await local.close()
    metas = [answer.json()["meta_info"] for answer in answers]
    assert counted["vistarl_engine_generated_tokens_total"] == sum(m["completion_tokens"] for m in metas) == 6
    assert counted["vistarl_engine_prompt_tokens_total"] == sum(m["prompt_tokens"] for m in metas)
    assert counted["vistarl_engine_rows_total"] == 2 and counted["vistarl_engine_prompt_passes_total"] >= 1
    assert 0 < counted["vistarl_engine_prompt_seconds_total"] <= counted["vistarl_engine_batch_seconds_total"]


async def test_make_engine_parses_specs(tiny_qwen25: Path, processor: VLProcessor) -> None:
    remote = make_engine("sglang:http://127.0.0.1:30000", processor)
    assert isinstance(remote, SGLangEngine) and remote.url == "http://127.0.0.1:30000"
    served = make_engine("hf:http://127.0.0.1:30001/", processor)
    assert isinstance(served, SGLangEngine) and served.url == "http://127.0.0.1:30001"
    local = make_engine(f"hf:{tiny_qwen25}", max_batch_size=2)
    assert isinstance(local, HFEngine) and local.max_batch_size == 2
    for engine in (remote, served, local):
        await engine.close()
    for bad in ("hf", "vllm:http://x", "sglang:/some/dir", "sglang:"):
        with pytest.raises(ValueError):
            make_engine(bad)


# --- /v1/chat/completions and the agent loop of docs/agents.md -----------------------------------

CORRIDOR = {"xsb": "########\n#@ $  .#\n########"}
ACT = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Make moves.",
        "parameters": {"type": "object", "properties": {"moves": {"type": "array"}}, "required": ["moves"]},
    },
}


def chat_body(**fields: Any) -> dict[str, Any]:
    image = pictures(3, (56, 56))[0]
    user = {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "go"}],
    }
    return {
        "messages": [{"role": "system", "content": "Play."}, user],
        "max_tokens": 4,
        "temperature": 0,
        **fields,
    }


async def test_a_chat_completion_is_the_template_render_generated(
    served: str, client: SGLangEngine, processor: VLProcessor
) -> None:
    body = chat_body()
    async with httpx.AsyncClient(base_url=served, timeout=60) as http:
        answer = (await http.post("/v1/chat/completions", json=body)).json()
    rendered = processor.tokenizer.apply_chat_template(
        body["messages"], tokenize=False, add_generation_prompt=True
    )
    ids = processor.tokenizer.encode(rendered, add_special_tokens=False)
    images = [body["messages"][1]["content"][0]["image_url"]["url"]]
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0, skip_special_tokens=False)
    direct = await client.generate(GenerateRequest(engine_ids=ids, images=images, sampling=sampling))
    choice = answer["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": direct.text, "tool_calls": None}
    assert choice["finish_reason"] == "length"
    assert answer["usage"] == {
        "prompt_tokens": direct.prompt_tokens,
        "completion_tokens": 4,
        "total_tokens": direct.prompt_tokens + 4,
    }


@pytest.mark.parametrize(
    ("change", "mentions"),
    [
        ({"logprobs": True}, "logprobs"),
        ({"n": 2}, "n"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}],
                    }
                ]
            },
            "messages.0.content.0.image_url.url",
        ),
    ],
)
async def test_a_bad_chat_request_is_a_400_naming_it(
    served: str, change: dict[str, Any], mentions: str
) -> None:
    async with httpx.AsyncClient(base_url=served, timeout=60) as http:
        answer = await http.post("/v1/chat/completions", json=chat_body(**change))
    assert answer.status_code == 400
    assert mentions in answer.json()["error"]["message"]


async def test_tools_reach_the_template_and_tool_call_blocks_come_back(tiny_qwen3: Path) -> None:
    processor = VLProcessor.from_pretrained(tiny_qwen3)  # Qwen3-VL's template has a tools section
    offered = generate_request(processor, ChatCompletionRequest.model_validate(chat_body(tools=[ACT])))
    hidden = generate_request(
        processor, ChatCompletionRequest.model_validate(chat_body(tools=[ACT], tool_choice="none"))
    )
    assert '"name": "act"' in processor.tokenizer.decode(offered.engine_ids)
    assert '"name": "act"' not in processor.tokenizer.decode(hidden.engine_ids)
    reply = 'Push it.\n<tool_call>\n{"name": "act", "arguments": {"moves": ["Right", "Right"]}}\n</tool_call>'
    result = await ScriptedEngine(processor, [reply]).generate(offered)
    answer = completion(result, "tiny", with_tools=True)
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls" and message.content == "Push it."
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    call = message.tool_calls[0].function
    assert call.name == "act" and json.loads(call.arguments) == {"moves": ["Right", "Right"]}
    action = ToolActions(load_env_factory("sokoban")).action(ToolCall(**call.model_dump()))
    assert parse_actions(action) == ["right", "right"]
    follow_up = chat_body(tools=[ACT])
    follow_up["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": [message.tool_calls[0].model_dump()]},
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "reward 1.02, done True"},
    ]
    rendered = generate_request(processor, ChatCompletionRequest.model_validate(follow_up))
    assert "reward 1.02, done True" in processor.tokenizer.decode(rendered.engine_ids)


def test_the_agent_loop_of_the_docs_plays_with_the_served_engine(served: str, tmp_path: Path) -> None:
    doc = (Path(__file__).parents[1] / "docs" / "agents.md").read_text()
    script = tmp_path / "agent.py"
    script.write_text(doc.split("```python\n", 1)[1].split("```", 1)[0])
    with env_served("sokoban") as env_url:
        args = [
            str(script),
            env_url,
            served,
            "--options",
            json.dumps(CORRIDOR),
            "--turns",
            "2",
            "--max-tokens",
            "8",
        ]
        run = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        assert run.stdout.count("turn: reward") == 2
        assert httpx.get(f"{env_url}/ready").json()["active_sessions"] == 0


async def test_the_engine_client_lets_idle_connections_go_before_the_server_closes_them() -> None:
    """A `/generate` sent on a connection the server is just closing loses its answer, and a lost answer is
    not resent (generation is not idempotent): the episode would end ABORTED. So the client's pool drops an
    idle connection before the server's keep-alive (SGLang's, and `vistarl engine serve`'s) runs out."""
    engine = SGLangEngine("http://127.0.0.1:9")
    connector: Any = engine._pool.session().connector  # aiohttp's, holding the idle connections
    assert 0 < connector._keepalive_timeout < SERVER_KEEP_ALIVE_S
    await engine.close()
