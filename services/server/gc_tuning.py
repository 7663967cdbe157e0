"""Keep Python's cyclic garbage collector off the request path of a server process and its env workers."""

from __future__ import annotations

import gc


def pause_collection() -> None:
    """No cyclic collection while a server starts: the modules, schemas and app that start-up builds live
    as long as the process, so collecting them is wasted work on the start's path (docs/benchmarks.md,
    "Start-up", times a start). `collect_garbage_less_often` turns collection back on."""
    gc.disable()


def collect_garbage_less_often() -> None:
    """Freeze what startup built and collect the youngest generation 14x less often (collection back on
    after `pause_collection`).

    `gc.freeze()` moves what startup built (modules, schemas, the app, the env) out of every later
    collection, and a first threshold of 10,000 instead of 700 stops collections from running every few
    requests, whose own objects reference counting frees anyway. Under Sokoban at 64 episodes in flight
    this cut the server's time spent collecting and its longest pause several-fold (docs/benchmarks.md's
    history, `git show 2a8b161:docs/benchmarks.md`, "Environment server"). Env workers start from the same
    settings: a collection there stalls every session the worker holds.
    """
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    gc.enable()
