"""`vistarl up` (the whole system on this host, as separate processes), `vistarl status DIR` (how such
a run stands) and `vistarl down DIR` (stop it). What runs is `vistarl.launcher.plan`'s, what is checked
before it starts `vistarl.launcher.preflight`'s, how it is watched `vistarl.launcher.supervisor`'s;
docs/deploy.md, "One GPU host without Docker", shows them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from vistarl.cli.train import ConfigOption, SetOption

DOWN_MARGIN_S = 30.0
"""`vistarl down` waits for the processes' grace periods, one after another, and this much more."""

Gpus = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated GPU indices, e.g. 0 or 0,1. Name none (for either) to run on the CPU."
    ),
]


def up(
    config: ConfigOption,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            file_okay=False,
            help="The run's directory: logs/NAME.log, pids/NAME.pid, up.lock, processes.json, run/ (the "
            "trainer's metrics and checkpoints), redis/. One run at a time; an ended one only with --resume.",
        ),
    ],
    set_: SetOption = None,
    trainer_gpus: Gpus = None,
    engine_gpus: Gpus = None,
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Rollout worker processes (`vistarl worker`) of the workers role; colocated, the trainer's "
            "in-process workers.",
        ),
    ] = 2,
    engines: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Engine servers on the CPU (default 1); with --engine-gpus, one a GPU. The same GPUs for "
            "--trainer-gpus and --engine-gpus run colocated: every trainer rank generates on its GPU.",
        ),
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", help="Return at once; the run goes on in its own session.")
    ] = False,
    redis_url: Annotated[
        str | None, typer.Option(help="A Redis to use instead of starting one (its database 0 and 1).")
    ] = None,
    engine_url: Annotated[
        str | None,
        typer.Option(help="A running SGLang (or `vistarl engine serve`) server instead of starting engines."),
    ] = None,
    env_url: Annotated[
        str | None, typer.Option(help="A running env server of the config's env instead of starting one.")
    ] = None,
    role: Annotated[
        list[str] | None,
        typer.Option(
            help="This host's part of a run over several hosts: redis, env, engine, workers, trainer; "
            "repeatable (default: all)."
        ),
    ] = None,
    host: Annotated[
        str,
        typer.Option(help="The interface servers listen on; beyond loopback they take compose's ports."),
    ] = "127.0.0.1",
    nnodes: Annotated[int, typer.Option(min=1, help="Nodes the trainer spans (torchrun).")] = 1,
    node_rank: Annotated[
        int, typer.Option(min=0, help="This node's rank among them; rank 0's node drives the run.")
    ] = 0,
    rdzv_endpoint: Annotated[
        str | None,
        typer.Option(
            help="torchrun's rendezvous HOST:PORT on node rank 0, for a trainer over several nodes."
        ),
    ] = None,
    max_restarts: Annotated[
        int, typer.Option(min=0, help="Restarts of each long-lived process before the run stops.")
    ] = 3,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Continue the run in DIR: the trainer resumes from its latest checkpoint."
        ),
    ] = False,
) -> None:
    """Run the whole system on this host: Redis, the env server, the engine, the rollout workers and the
    trainer, each a process of its own, restarted when it dies (within --max-restarts). What cannot work is
    refused before anything starts (exit 2). SIGTERM, Ctrl-C or `vistarl down DIR` stops them all, the
    trainer first, with a checkpoint of its last step."""
    from vistarl.launcher.gpus import SAMPLES_FILE, GpuSampler
    from vistarl.launcher.lock import DirectoryInUse, RunLock
    from vistarl.launcher.plan import ROLES, PlanError, UpOptions, plan_processes
    from vistarl.launcher.preflight import PreflightError, preflight
    from vistarl.launcher.status import PLAN_FILE
    from vistarl.launcher.supervisor import Supervisor

    roles = tuple(role or ROLES)
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise typer.BadParameter(f"{', '.join(unknown)}: not one of {', '.join(ROLES)}", param_hint="--role")
    options = UpOptions(
        config=config,
        out=out,
        overrides=tuple(set_ or ()),
        workers=workers,
        trainer_gpus=_gpus(trainer_gpus, "--trainer-gpus"),
        engine_gpus=_gpus(engine_gpus, "--engine-gpus"),
        roles=roles,  # type: ignore[arg-type]  # checked above
        redis_url=redis_url,
        env_url=env_url,
        engine_url=engine_url,
        host=host,
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        resume=resume,
        engines=engines,
    )
    try:
        plan = plan_processes(options)
    except PlanError as exc:
        _refuse(str(exc))
    try:
        preflight(options, plan)
    except PreflightError as exc:
        _refuse(str(exc))
    if detach:
        _detach(out)
        return
    lock = RunLock(out)
    try:
        lock.acquire()  # held until this process ends: the directory is this run's
    except DirectoryInUse as exc:
        _refuse(str(exc))
    record = {
        "config": str(config),
        "overrides": list(options.overrides),
        "roles": list(roles),
        "run_dir": str(plan.run_dir) if plan.run_dir else None,
        "urls": plan.urls,
        "gpus": list(plan.gpus),
        "processes": [spec.name for spec in plan.processes],
        "started": time.time(),
        "resumed": resume,
    }
    (out / PLAN_FILE).write_text(json.dumps(record, indent=1) + "\n")
    supervisor = Supervisor(plan.processes, out, max_restarts=max_restarts, echo=_echo)
    with GpuSampler(out / SAMPLES_FILE, plan.gpus):
        ending = supervisor.run()
    _echo(ending.reason)
    raise typer.Exit(ending.code)


def status(
    out: Annotated[
        Path, typer.Argument(exists=True, file_okay=False, help="The directory of `vistarl up --out`.")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print every step's figures as JSON instead.")
    ] = False,
) -> None:
    """How a `vistarl up` run stands: each process's state, the last step, the step breakdown, and the
    episodes each step could not learn from."""
    from rich.console import Console
    from rich.table import Table

    from vistarl.launcher.status import FAILURES, RunStatus

    try:
        run = RunStatus(out)
    except FileNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="DIR") from None
    if as_json:
        record = {"processes": run.processes(), "steps": run.steps, "failures": run.failures()}
        typer.echo(json.dumps(record, indent=1))
        return
    console = Console()
    console.print(f"{out}: vistarl up is {'running' if run.supervisor_alive else 'not running'}")
    table = Table()
    for column in ("process", "role", "pid", "state", "restarts", "exit code"):
        table.add_column(column)
    for row in run.processes():
        cells = (row["name"], row["role"], row["pid"], row["state"], row["restarts"], row["exit_code"])
        table.add_row(*("" if cell is None else str(cell) for cell in cells))
    console.print(table)
    if not run.steps:
        console.print("no step finished yet")
        return
    last = run.steps[-1]
    console.print(f"last step: {last['step']:.0f}, {time.time() - last['time']:.0f} s ago")
    figures = Table(title="step breakdown")
    for column in ("figure", "last step", "mean, steps after the first"):
        figures.add_column(column, justify="right" if column != "figure" else "left")
    for label, value, mean in run.breakdown():
        figures.add_row(label, _number(value), _number(mean))
    for label, total in run.counts():
        figures.add_row(label, "", f"{total:g} in all")
    console.print(figures)
    failed = run.failures()
    if not failed:
        console.print("no episode ABORTED, FAILED, missing or stale; no try played again")
        return
    failures = Table(title="failures per step (tries played again included)")
    failures.add_column("step")
    for kind, _ in FAILURES:
        failures.add_column(kind, justify="right")
    for row in failed:
        failures.add_row(f"{row['step']:.0f}", *(f"{row[kind]:g}" for kind, _ in FAILURES))
    failures.add_row("in all", *(f"{total:g}" for total in run.failure_totals().values()))
    console.print(failures)


def down(
    out: Annotated[
        Path, typer.Argument(exists=True, file_okay=False, help="The directory of `vistarl up --out`.")
    ],
) -> None:
    """Stop the `vistarl up` run of DIR as SIGTERM does (the trainer saves a checkpoint of its last step,
    then every process stops, each within its grace period) and wait until it has; `vistarl up --resume`
    continues it."""
    from vistarl.launcher.lock import held_by
    from vistarl.launcher.plan import STOP_GRACE_S
    from vistarl.launcher.status import RunStatus

    pid = held_by(out)
    if not pid:
        typer.echo(f"vistarl down: no vistarl up runs in {out}", err=True)
        raise typer.Exit(1)
    try:  # the parts stop one after another, each within its grace period
        roles = [str(row["role"]) for row in RunStatus(out).processes()]
    except FileNotFoundError:  # stopped before it wrote its plan
        roles = list(STOP_GRACE_S)
    grace = sum(STOP_GRACE_S.get(role, 0.0) for role in roles)
    os.kill(pid, signal.SIGTERM)
    _echo(f"asked vistarl up (pid {pid}) to stop; waiting up to {grace + DOWN_MARGIN_S:g} s", "down")
    deadline = time.monotonic() + grace + DOWN_MARGIN_S
    while held_by(out) is not None:
        if time.monotonic() > deadline:
            typer.echo(f"vistarl down: vistarl up (pid {pid}) still runs; `kill -9 {pid}` ends it", err=True)
            raise typer.Exit(1)
        time.sleep(0.2)
    _echo(f"stopped; `vistarl up --resume --out {out} ...` continues the run", "down")


def _gpus(text: str | None, flag: str) -> tuple[int, ...]:
    """`0,1` as GPU indices; None or empty as none."""
    if not text:
        return ()
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not a comma-separated list of GPU indices", param_hint=flag
        ) from None


def _refuse(line: str) -> NoReturn:
    """Exit 2, before anything has started, with the one line that says why."""
    typer.echo(f"vistarl up: {line}", err=True)
    raise typer.Exit(2)


def _detach(out: Path) -> None:
    """Run this same command, without `--detach`, in a session of its own, its output in DIR/logs/up.log."""
    argv = [sys.executable, "-m", "vistarl.cli.main", *(arg for arg in sys.argv[1:] if arg != "--detach")]
    log_path = out / "logs" / "up.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    typer.echo(f"vistarl up runs detached (pid {child.pid}); its log: {log_path}")
    typer.echo(f"see it with `vistarl status {out}`; stop it with `vistarl down {out}`")


def _echo(message: str, command: str = "up") -> None:
    """A line of the run's events (or of `vistarl down`'s), timed."""
    typer.echo(f"[{time.strftime('%H:%M:%S')}] vistarl {command}: {message}")


def _number(value: Any) -> str:
    """A figure for the table."""
    return "" if value is None else f"{value:.4g}"


def register(app: typer.Typer) -> None:
    """Add `up`, `status` and `down` to the `vistarl` command line."""
    app.command("up")(up)
    app.command("status")(status)
    app.command("down")(down)
