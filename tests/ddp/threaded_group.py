"""Run a rank body on n threads over torch's own multi-threaded process group (as torch's DDP and FSDP tests do)."""

from __future__ import annotations

import threading
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

import compcoll
from tests import shared


def run_threaded_group(body: Callable[..., None], world_size: int, *args, timeout: float = 300.0,
                       before_init: Callable[[int], Any] | None = None) -> None:
    """``body(comm, *args)`` on ``world_size`` threads, each in its rank of a "threaded" process group.

    1. Install torch's thread-local world (``multi_threaded_pg``, given ``comms`` where it lacks them) with thread
       isolation on, and start one thread per rank that joins the group and builds a ``TorchComm``; the
       threads also join one ``tests.shared.ThreadWorld``, so ``world_once`` computes the
       reference once for all of them. With ``before_init``, each thread calls it with its rank
       before it joins the group, and ``body(comm, before_init(rank), *args)`` runs.
    2. Join them all within ``timeout``; then restore torch's world.
    3. AssertionError naming each failed rank with its traceback, or the ranks still running.
    """
    from torch.testing._internal.distributed.multi_threaded_pg import (
        ProcessLocalGroup, ThreadLocalWorld, _install_threaded_pg, _uninstall_threaded_pg,
    )

    _give_comms(ThreadLocalWorld)
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    _install_threaded_pg()
    store = dist.HashStore()
    world = shared.ThreadWorld(world_size)
    failures: dict[int, str] = {}

    def rank(r: int) -> None:
        shared.join(world)
        try:
            early = () if before_init is None else (before_init(r),)
            dist.init_process_group("threaded", rank=r, world_size=world_size, store=store)
            try:
                body(compcoll.TorchComm(), *early, *args)
            finally:
                dist.destroy_process_group()
        except BaseException as exc:
            failures[r] = traceback.format_exc()
            ProcessLocalGroup.exception_handle(exc)  # wakes the ranks waiting in a collective for this one

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(world_size)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout)
    finally:
        ProcessLocalGroup.reset()
        _uninstall_threaded_pg()
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
    running = [r for r, thread in enumerate(threads) if thread.is_alive()]
    assert not failures and not running, f"still running: {running}\n" + "\n".join(
        f"[rank {r}] FAILED:\n{failures[r]}" for r in sorted(failures))


def _give_comms(world_class: type) -> None:
    """Give torch's thread-local test world the per-thread ``comms`` list that ``dist.destroy_process_group`` reads
    where its class lacks it: torch 2.11's ``_World`` has it, its ``ThreadLocalWorld`` not (pytorch#175065, mended
    in later releases), so every rank's ``destroy_process_group()`` raised AttributeError there (the H200 machine's
    torch 2.11 on 2026-12-04: every test on threads failed)."""
    if not hasattr(world_class, "comms"):
        world_class.comms = property(lambda world: vars(world._get_world()).setdefault("comms", []))
