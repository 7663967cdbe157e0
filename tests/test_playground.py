"""The browser playground in a real browser: Debian's chromium driven by playwright. `/play` of a real
`vistarl serve sokoban` with a token is played to the end by clicking (moves from the Sokoban solver);
Geo3k and VSI episodes keep every observation in the transcript; `/play/replay` steps through
trajectories written by the real rollout path (`run_episode`). No page load meets a 404."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.envs.serving import served
from tests.machine import require
from vistarl.clients.images import decode_image
from vistarl.services.sokoban.game import Level
from vistarl.services.sokoban.solver import solve
from vistarl.trainer.config import RolloutConfig
from vistarl.trainer.rollout.engines.scripted import ScriptedEngine
from vistarl.trainer.rollout.env_handle import Envs
from vistarl.trainer.rollout.episode import run_episode
from vistarl.trainer.rollout.job import EpisodeJob, EpisodeSettings
from vistarl.trainer.rollout.processor import VLProcessor
from vistarl.trainer.rollout.trajectory import Trajectory
from vistarl.trainer.run.outputs import save_trajectory

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "play-token"
KEYS = {"Up": "ArrowUp", "Down": "ArrowDown", "Left": "ArrowLeft", "Right": "ArrowRight"}
WAIT_MS = 5000
GRADING_MS = 60_000  # the first grading starts the grader process
VIEWPORT = {"width": 900, "height": 600}
CURRENT_TURN_FIRST_IN_VIEW = """() => {  // the page is scrolled (the controls stick) to the last turn
  const current = document.querySelector("#transcript .turn:last-child");
  const controls = document.getElementById("controls").getBoundingClientRect();
  return Math.abs(controls.top) <= 1 && Math.abs(current.getBoundingClientRect().top - controls.bottom) <= 1;
}"""
CORRIDOR = {"xsb": "########\n#@ $  .#\n########"}

expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    require(CHROMIUM.exists(), "no /usr/bin/chromium (scripts/ensure-chromium.sh)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page; the test fails if a script on it throws."""
    opened = browser.new_page(viewport=VIEWPORT)
    opened.set_default_timeout(WAIT_MS)
    script_errors: list[Exception] = []
    missing: list[str] = []
    opened.on("pageerror", lambda error: script_errors.append(error))
    opened.on("response", lambda answer: missing.append(answer.url) if answer.status == 404 else None)
    yield opened
    opened.close()
    assert not script_errors
    assert not missing


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with served("sokoban", env={"VISTARL_API_TOKEN": TOKEN}) as base:
        yield base


def test_a_sokoban_level_is_played_to_the_end_by_clicking(page: Page, url: str) -> None:
    page.goto(f"{url}/play")
    expect(page.locator("#error")).to_contain_text("unauthorized")  # no token typed yet
    page.fill("#token", TOKEN)
    page.click("#connect")
    expect(page.locator("#env-name")).to_have_text("sokoban")
    page.fill("#seed", "11")
    page.click("#reset")
    expect(page.locator("#transcript .turn img")).to_have_count(1)
    level = Level.from_xsb(json.loads(page.locator("#info").text_content() or "")["level"])
    moves = [move.capitalize() for move in solve(level).moves or ()]
    assert moves
    for turn, move in enumerate(moves, start=1):
        if turn % 2:
            page.click(f'#tools button[data-value="{move}"]')
        else:
            page.keyboard.press(KEYS[move])
        expect(page.locator("#turn")).to_have_text(str(turn))
    expect(page.locator("#done")).to_be_visible()
    expect(page.locator("#transcript .turn")).to_have_count(len(moves) + 1)
    assert json.loads(page.locator("#info").text_content() or "")["success"] is True
    expect(page.locator('#tools button[data-value="Up"]')).to_be_disabled()


def test_a_typed_action_and_an_error_show_on_the_page(page: Page, url: str) -> None:
    page.goto(f"{url}/play")
    page.fill("#token", TOKEN)
    page.click("#connect")
    page.click("text=Options (JSON)")
    page.fill("#options", json.dumps(CORRIDOR))
    page.click("#reset")
    page.fill("#action", "<answer>Right, Right</answer>")
    page.click("#send")
    expect(page.locator("#turn")).to_have_text("1")
    expect(page.locator("#reward")).to_have_text("0.02")
    page.fill("#options", '{"grid_size": 99}')
    page.click("#reset")
    expect(page.locator("#error")).to_contain_text("invalid_options: options.grid_size")


def connect_and_reset(page: Page, base: str, seed: int) -> None:
    """Open `/play` of a server without a token, and reset with `seed`."""
    page.goto(f"{base}/play")
    expect(page.locator("#tools button").first).to_be_attached()
    page.fill("#seed", str(seed))
    page.click("#reset")
    expect(page.locator("#transcript .turn")).to_have_count(1)


def expect_transcript(page: Page, images: list[int], texts: list[str]) -> None:
    """Turn k of the transcript shows `images[k]` images and contains `texts[k]`; the last is shown first."""
    turns = page.locator("#transcript .turn")
    expect(turns).to_have_count(len(images))
    for turn, (count, text) in enumerate(zip(images, texts, strict=True)):
        expect(turns.nth(turn).locator("img")).to_have_count(count)
        expect(turns.nth(turn).locator("pre.text")).to_contain_text(text)
    page.wait_for_function(CURRENT_TURN_FIRST_IN_VIEW)


def test_a_geo3k_problem_and_its_diagram_stay_in_the_transcript(page: Page) -> None:
    with served("geo3k") as base:
        connect_and_reset(page, base, seed=3)
        first = page.locator("#transcript .turn pre.text").first.text_content() or ""
        assert first.strip()
        for played, answer in enumerate(("1", "2"), start=2):
            page.fill('#tools input[placeholder="answer"]', answer)
            page.click('#tools button[data-tool="calc_score"]')
            # One step at a time: the next click waits for this grading, which a loaded machine slows.
            expect(page.locator("#transcript .turn")).to_have_count(played, timeout=GRADING_MS)
        expect_transcript(page, [1, 0, 0], [first, "answer '1'", "answer '2'"])


def test_the_vsi_tour_frames_and_question_stay_in_the_transcript(page: Page) -> None:
    with served("vsi") as base:
        connect_and_reset(page, base, seed=0)
        tour = json.loads(page.locator("#info").text_content() or "")["tour_frames"]  # and the first view
        question = page.locator("#transcript .turn pre.text").first.text_content() or ""
        for _ in range(4):
            page.click('#tools button[data-tool="look_up"]')
        expect_transcript(page, [tour + 1, 1, 1, 1, 1], [question, "look_up", "look_up", "look_up", "limit"])
        assert tour > 1


def test_the_favicon_is_served_without_a_token(url: str) -> None:
    answer = httpx.get(f"{url}/favicon.ico")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "image/svg+xml"
    assert answer.content.startswith(b"<svg")


@pytest.fixture(scope="module")
def trajectories(tiny_qwen25: Path) -> list[Trajectory]:
    """A solved two-turn episode and an unsolved three-turn one, from the real episode loop."""
    processor = VLProcessor.from_pretrained(tiny_qwen25)
    config = RolloutConfig(max_turns=3, max_new_tokens=64)
    scripts = [
        (["<answer>Right, Right</answer>"] * 2, {"options": CORRIDOR}),
        (["<answer>Up</answer>", "<answer>Down</answer>", "<answer>Left</answer>"], {"seed": 5}),
    ]

    async def play() -> list[Trajectory]:
        envs = Envs()
        played = [
            await run_episode(
                await envs.open("sokoban"),
                ScriptedEngine(processor, replies),
                processor,
                EpisodeJob(
                    episode_id=f"e{i}",
                    group_id="g",
                    env="sokoban",
                    settings=EpisodeSettings.of(config),
                    **start,
                ),
            )
            for i, (replies, start) in enumerate(scripts)
        ]
        await envs.aclose()
        return played

    with ThreadPoolExecutor(1) as thread:  # this thread's event loop is playwright's
        return thread.submit(asyncio.run, play()).result()


def replies(trajectory: Trajectory) -> list[str]:
    """The assistant texts, one per turn."""
    return [message["content"] for message in trajectory.messages if message["role"] == "assistant"]


def tokens_of_turn(trajectory: Trajectory, turn: int) -> tuple[int, int]:
    """Context and generated tokens of one turn, counted from the trajectory's aligned tracks."""
    marks = [m for t, m in zip(trajectory.turn_index, trajectory.loss_mask, strict=True) if t == turn]
    return marks.count(0), marks.count(1)


def test_a_rollout_jsonl_is_replayed_turn_by_turn(
    page: Page, url: str, trajectories: list[Trajectory], tmp_path: Path
) -> None:
    path = tmp_path / "rollout.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajectories))
    page.goto(f"{url}/play/replay")
    page.set_input_files("#files", str(path))
    expect(page.locator("#trajectory option")).to_have_count(2)
    for index, trajectory in enumerate(trajectories):
        page.select_option("#trajectory", str(index))
        expect(page.locator("#status")).to_have_text(trajectory.status.value)
        expect(page.locator("#turn-count")).to_have_text(str(len(trajectory.turn_rewards)))
        for turn, reward in enumerate(trajectory.turn_rewards):
            expect(page.locator("#turn")).to_have_text(str(turn + 1))
            expect(page.locator("#turn-reward")).to_have_text(f"{round(reward, 4):g}")
            context, generated = tokens_of_turn(trajectory, turn)
            expect(page.locator("#context-tokens")).to_have_text(str(context))
            expect(page.locator("#generated-tokens")).to_have_text(str(generated))
            expect(page.locator("#messages .assistant pre")).to_have_text(replies(trajectory)[turn])
            page.keyboard.press("ArrowRight")
    page.click("#prev")  # back to turn 2 of the last trajectory, whose observation is its second image
    images = page.locator("#messages img")
    expect(images).to_have_count(1)
    assert images.get_attribute("src") == trajectories[-1].images[1]


def test_a_run_sample_is_replayed_with_its_image_files(
    page: Page, url: str, trajectories: list[Trajectory], tmp_path: Path
) -> None:
    folder = save_trajectory(trajectories[0], tmp_path / "e0").parent
    page.goto(f"{url}/play/replay")
    page.set_input_files("#files", sorted(str(f) for f in folder.iterdir()))
    expect(page.locator("#turn-count")).to_have_text("2")
    image = page.locator("#messages img")
    expect(image).to_have_count(1)
    assert (image.get_attribute("src") or "").startswith("blob:")
    shown = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert tuple(shown) == decode_image(trajectories[0].images[0]).size
