"""The process group of the NCCL transport: trainer rank 0 and the engine's ranks, outside the default one."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import torch.distributed as dist

__all__ = ["CLOSE_TIMEOUT_S", "DEFAULT_GROUP_NAME", "init_weight_update_group", "leave_group"]

log = logging.getLogger(__name__)

DEFAULT_GROUP_NAME = "vistarl_weight_sync"
CLOSE_TIMEOUT_S = 30.0


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
    (`TORCHELASTIC_USE_AGENT_STORE`) makes rank 0 a client of a store nobody serves, and waits forever.
    """
    from torch.distributed.distributed_c10d import (
        GroupName,
        PrefixStore,
        _new_process_group_helper,
        _world,
    )

    store = dist.TCPStore(master_address, master_port, world_size, is_master=rank == 0, timeout=timeout)
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
