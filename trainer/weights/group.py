"""The process group of the NCCL transport: trainer rank 0 and the engine's ranks, outside the default one."""

from __future__ import annotations

import collections
import logging
import threading
from datetime import timedelta

import torch.distributed as dist

__all__ = [
    "CLOSE_TIMEOUT_S",
    "DEFAULT_GROUP_NAME",
    "fresh_group_name",
    "init_weight_update_group",
    "leave_group",
]

log = logging.getLogger(__name__)

DEFAULT_GROUP_NAME = "vistarl_weight_sync"
CLOSE_TIMEOUT_S = 30.0

_served_stores: dict[tuple[str, int], dist.TCPStore] = {}
_names_given: collections.Counter[tuple[str, int]] = collections.Counter()


def fresh_group_name(master_address: str, master_port: int, base: str = DEFAULT_GROUP_NAME) -> str:
    """A group name this process has not used at this rendezvous address: `base`, then `base-1`, ...
    The store rank 0 serves outlives the groups formed in it (`_rendezvous_store`), and keeps their keys,
    so a group formed again (with an engine that restarted) needs a name of its own."""
    used = _names_given[(master_address, master_port)]
    _names_given[(master_address, master_port)] += 1
    return base if used == 0 else f"{base}-{used}"


def _rendezvous_store(
    master_address: str, master_port: int, rank: int, world_size: int, timeout: timedelta
) -> dist.TCPStore:
    """Rank 0 serves one store per address and port for the life of the process (a store keeps its port
    after its group is left, so a second one could not listen there); the other ranks connect to it."""
    if rank != 0:
        return dist.TCPStore(master_address, master_port, world_size, is_master=False, timeout=timeout)
    key = (master_address, master_port)
    if key not in _served_stores:
        _served_stores[key] = dist.TCPStore(
            master_address, master_port, world_size, is_master=True, timeout=timeout, wait_for_workers=False
        )
    return _served_stores[key]


def init_weight_update_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str = DEFAULT_GROUP_NAME,
    backend: str = "nccl",
    timeout: timedelta = timedelta(minutes=10),
) -> dist.ProcessGroup:
    """Join a process group outside the default one, exactly as SGLang's engine side joins it.

    Both sides must lay out the rendezvous store the same way, so this mirrors SGLang's
    `init_custom_process_group` (a TCP store served by rank 0, a `PrefixStore` named after the group,
    then torch's own group constructor); torch has no public API for a second world group. The store
    is made here rather than by `torch.distributed.rendezvous`, which under torchrun
    (`TORCHELASTIC_USE_AGENT_STORE`) makes rank 0 a client of a store nobody serves, and waits forever;
    rank 0 keeps serving it for the groups formed after this one (`fresh_group_name`).
    """
    from torch.distributed.distributed_c10d import (
        GroupName,
        PrefixStore,
        _new_process_group_helper,
        _world,
    )

    store = _rendezvous_store(master_address, master_port, rank, world_size, timeout)
    group, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        dist.Backend(backend),
        PrefixStore(group_name, store),
        group_name=GroupName(group_name),
        timeout=timeout,
    )
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def leave_group(group: dist.ProcessGroup, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Leave `group`, waiting at most `timeout_s`: NCCL's teardown can wait for a peer that stays in the
    group, so it runs on a daemon thread that may outlive the wait."""
    leaving = threading.Thread(
        target=dist.destroy_process_group, args=(group,), name="vistarl-leave-group", daemon=True
    )
    leaving.start()
    leaving.join(timeout_s)
    if leaving.is_alive():
        log.warning("left the weight-update group without NCCL's teardown (%.0f s passed)", timeout_s)
