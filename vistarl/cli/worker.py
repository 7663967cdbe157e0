"""`vistarl worker`: a rollout worker process consuming episode jobs from Redis."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from vistarl.trainer.queue.worker import RunnerFactory


def _env_urls(pairs: list[str]) -> dict[str, str]:
    """Parse repeated `NAME=URL` flags."""
    urls = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or not name or not url:
            raise typer.BadParameter(f"{pair!r} is not NAME=URL", param_hint="--env-url")
        urls[name] = url
    return urls


def worker(
    redis_url: Annotated[str, typer.Option(envvar="VISTARL_REDIS_URL", help="Redis holding the queue.")],
    namespace: Annotated[
        str, typer.Option(envvar="VISTARL_NAMESPACE", help="Queue namespace (one per run).")
    ] = "default",
    consumer: Annotated[
        str | None, typer.Option(help="Name in the consumer group (default host-pid).")
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(
            help="sglang:URL (SGLang or its router), hf:URL (a `vistarl engine serve` server) or hf:DIR "
            "(a checkpoint loaded in this process), passed to the runner factory."
        ),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(
            exists=True,
            file_okay=False,
            help="With an engine server: load the tokenizer and image processor from this local "
            "checkpoint directory instead of the model path the server reports.",
        ),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes run at once.")] = 8,
    take_max: Annotated[
        int | None,
        typer.Option(
            min=1, help="Jobs taken per read, so other workers get a share of a step; default concurrency/4."
        ),
    ] = None,
    env_url: Annotated[list[str] | None, typer.Option(help="NAME=URL of an env server; repeatable.")] = None,
    reward: Annotated[
        str | None, typer.Option(help="Episode reward function module[:function]; default: the env's own.")
    ] = None,
    runner: Annotated[
        str | None, typer.Option(help="Runner factory module:function (default: the rollout engine's).")
    ] = None,
    lease_s: Annotated[
        float, typer.Option(min=0.1, help="Seconds without a heartbeat before a job is reclaimed.")
    ] = 30.0,
    max_attempts: Annotated[int, typer.Option(min=1, help="Attempts before a job is dead-lettered.")] = 3,
    shutdown_grace_s: Annotated[
        float, typer.Option(min=0, help="On SIGTERM, seconds running episodes get to finish before release.")
    ] = 30.0,
    metrics_port: Annotated[int | None, typer.Option(help="Serve Prometheus metrics on this port.")] = None,
    log_level: Annotated[str, typer.Option(help="Python log level.")] = "INFO",
) -> None:
    """Run episodes from the queue and publish their trajectories; SIGTERM drains gracefully."""
    from vistarl.trainer.queue.worker import WorkerOptions, load_runner_factory, run_worker
    from vistarl.trainer.rollout.engines.spec import EngineSpec

    if runner is None and engine is None:
        raise typer.BadParameter("is required unless --runner is given", param_hint="--engine")
    fields = {
        "redis_url": redis_url,
        "namespace": namespace,
        "env_urls": _env_urls(env_url or []),
        "reward_path": reward,
        "runner": runner,
        "concurrency": concurrency,
        "take_max": take_max,
        "tokenizer": tokenizer,
        "lease_s": lease_s,
        "max_attempts": max_attempts,
        "metrics_port": metrics_port,
        "shutdown_grace_s": shutdown_grace_s,
    }
    if consumer:
        fields["consumer"] = consumer
    try:
        options = WorkerOptions.model_validate(
            {**fields, "engine": EngineSpec.parse(engine) if engine else None}
        )
        factory = load_runner_factory(options.runner) if options.runner else _default_runner_factory()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_worker(options, stop, factory=factory)

    try:
        asyncio.run(main())
    except ConnectionError as exc:
        typer.echo(f"worker stopped: {exc}", err=True)
        raise typer.Exit(1) from None


def _default_runner_factory() -> RunnerFactory:
    """The rollout runner on `--engine`, imported only when no `--runner` replaces it (it loads torch)."""
    from vistarl.trainer.queue.episode_runner import make_episode_runner

    return make_episode_runner


def register(app: typer.Typer) -> None:
    """Add `worker` to the `vistarl` command line."""
    app.command()(worker)
