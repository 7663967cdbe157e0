"""Grading: math-verify equivalence, choice letters, and the time bound of the grading processes."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
import time

import pytest

from tests.machine import require
from tests.servers import wait_until
from vistarl.services.choices import choice_letter
from vistarl.services.geo3k import Geo3kEnv, Geo3kOptions, Geo3kSample, grader
from vistarl.services.geo3k.answers import last_boxed
from vistarl.services.geo3k.equivalence import answers_match
from vistarl.services.geo3k.generator import generate
from vistarl.services.geo3k.grader import GraderPool, Verdict, shared_pool

SLOW = "9^{9^{9}}"
"""An answer whose value sympy computes exactly: hundreds of millions of digits, past any deadline here."""

pytestmark = pytest.mark.usefixtures("geo3k_graders")


@pytest.mark.parametrize(
    ("candidate", "reference"),
    [
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "0.5"),
        ("\\sqrt{12}", "2\\sqrt{3}"),
        ("2\\sqrt{3}", "\\sqrt{12}"),
        ("60°", "60"),
        ("60^\\circ", "60"),
        ("60^{\\circ}", "60"),
        ("3\\sqrt{2}", "4.24"),
        ("\\frac{8}{15}", "0.53"),
        ("24.5\\pi", "\\frac{49 \\pi}{2}"),
        ("x = 12", "12"),
        ("\\boxed{65}", "65"),
    ],
)
def test_equivalent_answers_match(candidate: str, reference: str) -> None:
    assert answers_match(candidate, reference)


@pytest.mark.parametrize(
    ("candidate", "reference"),
    [("6", "5"), ("\\sqrt{12}", "3"), ("4.25", "4.24"), ("61°", "60"), ("", "5"), ("12\\pi", "12")],
)
def test_different_answers_do_not_match(candidate: str, reference: str) -> None:
    assert not answers_match(candidate, reference)


def test_generated_answers_parse_and_differ_from_their_wrong_choices() -> None:
    problems = [generate(seed) for seed in range(60)]
    for problem in problems:
        assert answers_match(problem.answer, problem.answer), problem
        for choice in problem.choices or []:
            assert answers_match(choice, problem.answer) is (choice == problem.answer), (problem, choice)


def test_the_env_grades_equivalent_forms_through_the_grading_processes() -> None:
    sample = Geo3kSample.model_validate({**generate(2).sample(), "answer": "2\\sqrt{3}", "choices": None})
    env = Geo3kEnv(Geo3kOptions(), sample=sample)
    env.reset()
    info = env.step(
        '<tool_call>{"name": "calc_score", "arguments": {"answer": "\\\\sqrt{12}"}}</tool_call>'
    ).info
    assert info["outcome"] == "correct"


def test_last_boxed_takes_the_last_balanced_box() -> None:
    assert last_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{3} and an open \\boxed{4") == "3"
    assert last_boxed("no box") is None


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("B", "B"),
        ("(C)", "C"),
        ("D.", "D"),
        ("\\text{A}", "A"),
        ("b", "B"),
        ("[b]:", "B"),
        ("Answer: B", "B"),
        ("The answer is (C).", "C"),
        ("B. 12", "B"),
        ("C sofa", "C"),
        ("E", None),  # not a listed letter
        ("12", None),
        ("AB", None),  # a segment
        ("b = 12", None),  # a length
        ("Answer: 2\\sqrt{3}", None),
    ],
)
def test_choice_letters(text: str, letter: str | None) -> None:
    assert choice_letter(text, "ABCD") == letter


def test_a_grading_timeout_scores_zero_is_counted_and_does_not_hang() -> None:
    env = Geo3kEnv(Geo3kOptions(grade_timeout_s=1.0), seed=8)
    env.reset()
    info = env.step(
        f'<tool_call>{{"name": "calc_score", "arguments": {{"answer": "{SLOW}"}}}}</tool_call>'
    ).info
    assert info["outcome"] == "wrong" and info["tool_score"] == 0.0 and info["metrics"]["grade_timeouts"] == 1
    after = env.step(json_call(env.answer)).info
    assert after["outcome"] == "correct"


def json_call(answer: str) -> str:
    return (
        "<tool_call>" + json.dumps({"name": "calc_score", "arguments": {"answer": answer}}) + "</tool_call>"
    )


def test_a_busy_pool_times_out_the_waiters_instead_of_queueing_forever() -> None:
    pool = GraderPool(max_workers=1)
    try:
        assert pool.grade("1", "1", 30.0) is Verdict.CORRECT
        verdicts: list[Verdict] = []
        slow = threading.Thread(target=lambda: verdicts.append(pool.grade(SLOW, "1", 2.0)))
        slow.start()
        assert wait_until(lambda: not pool._idle, timeout=10), "the slow grading never took the process"
        assert pool.grade("2", "2", 0.5) is Verdict.TIMEOUT  # its own timeout, not the slow grading's 2 s
        slow.join(timeout=10)
        assert verdicts == [Verdict.TIMEOUT] and pool.size == 0
        assert pool.grade("2", "2", 30.0) is Verdict.CORRECT and pool.size == 1
    finally:
        pool.close()


def test_warm_fills_again_the_slots_a_pool_lost() -> None:
    """A grading that timed out, a start that failed or `close` leaves the pool short; the next env's
    `warm` starts processes for those slots, and a full pool starts none."""
    pool = GraderPool(max_workers=1)
    try:
        pool.warm()
        assert wait_until(lambda: pool.size == 1, timeout=60), "no grading process started"
        pool.close()
        assert pool.size == 0
        pool.warm()
        assert wait_until(lambda: pool.size == 1, timeout=60), "warm did not replace the lost process"
        pool.warm()
        assert pool._starting == 0 and pool.size == 1
    finally:
        pool.close()


def test_many_threads_on_one_process_are_served_in_turn_none_starved() -> None:
    """16 threads share one process for 2 s: each grading is served within its bound, none times out.
    The process is started (and its imports done) first, so the bound measures waiting, not start-up."""
    pool = GraderPool(max_workers=1)
    assert pool.grade("0", "0", 30.0) is Verdict.CORRECT
    verdicts: list[Verdict] = []
    stop = time.monotonic() + 2.0

    def grade_until_stop(thread: int) -> None:
        while time.monotonic() < stop:
            verdicts.append(pool.grade(str(thread), str(thread), 5.0))

    threads = [threading.Thread(target=grade_until_stop, args=(thread,)) for thread in range(16)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        pool.close()
    assert len(verdicts) > 100 and set(verdicts) == {Verdict.CORRECT}


def test_grading_works_with_descriptors_past_selects_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    require(hard == resource.RLIM_INFINITY or hard >= 1200, f"the hard descriptor limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    pool = GraderPool(max_workers=1)
    try:
        assert pool.grade("0.5", "\\frac{1}{2}", 30.0) is Verdict.CORRECT
        (process,) = pool._all
        assert process.process.stdout is not None and process.process.stdout.fileno() > 1024
    finally:
        pool.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


ORPHAN_SCRIPT = """
import sys, threading
from vistarl.services.geo3k.grader import GraderPool
pool = GraderPool(max_workers=1)
pool.grade("1", "1", 60.0)
(process,) = pool._all
print(process.process.pid, flush=True)
pool.grade("9^{9^{9}}", "1", 1.0)
"""


def test_a_grading_process_exits_when_its_parent_dies() -> None:
    parent = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        grader_pid = int(parent.stdout.readline())
        time.sleep(0.5)
        assert _alive(grader_pid)
    finally:
        parent.kill()
        parent.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(grader_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(grader_pid)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_grading_processes_need_no_pickle_and_survive_a_bad_request() -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "vistarl.services.geo3k.grade_worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert worker.stdin is not None and worker.stdout is not None
        assert json.loads(worker.stdout.readline()) == {"ready": True}
        request = {"candidate": "0.5", "reference": "\\frac{1}{2}", "timeout_s": 5}
        worker.stdin.write('{"candidate": 5}\n' + json.dumps(request) + "\n")
        worker.stdin.flush()
        assert "error" in json.loads(worker.stdout.readline())
        assert json.loads(worker.stdout.readline()) == {"correct": True}
    finally:
        worker.kill()
        worker.wait(timeout=10)


def test_a_grading_process_whose_answers_nobody_reads_exits_quietly() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the parent gone before the worker announces itself
    try:
        worker = subprocess.run(
            [sys.executable, "-m", "vistarl.services.geo3k.grade_worker"],
            stdin=subprocess.DEVNULL,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert worker.returncode == 1
    assert worker.stderr == ""


def test_a_forked_child_gets_its_own_pool_and_leaves_the_parents_alone() -> None:
    parent_pool = shared_pool()
    assert parent_pool.grade("1", "1", 30.0) is Verdict.CORRECT
    processes = list(parent_pool._all)
    child = os.fork()
    if child == 0:  # the child's exit runs the grader's at-exit handlers it inherited, and no one else's:
        ok = shared_pool() is not parent_pool  # all of them would also delete files other libraries share
        for owner, pool in list(grader._shared.items()):
            grader._close_own(owner, pool)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert all(_alive(process.process.pid) for process in processes)
    assert parent_pool.grade("2", "2", 30.0) is Verdict.CORRECT
