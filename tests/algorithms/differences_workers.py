"""Rank-side bodies of the named-values option's tests: what differs is named alike on every rank."""

from __future__ import annotations

import torch

import compcoll
from compcoll.algorithms.agreement import agree
from compcoll.algorithms.differences import values_option
from compcoll.algorithms.rounds import summed


def named_alike(comm: compcoll.Communicator, summed_round: bool) -> None:
    """Rank 1 holds another ``freeze_step``, the last rank (of 3 or more) one name more: every rank raises the same
    RankMismatchError naming the first name that differs, each value and its ranks; equal values in another order
    agree. ``summed_round``: whether the round is an allreduce, as above 64 ranks."""
    assert summed(comm) == summed_round
    last = comm.size - 1
    mine = {"freeze_step": 5 if comm.rank == 1 else 4, "scale": "l1"}
    if comm.rank == last:
        mine["extra"] = [1, 2.5]
    try:
        agree(comm, "x", torch.empty(0), None, (values_option("settings", mine),))
    except compcoll.RankMismatchError as exc:
        others = "0" if comm.size == 2 else f"0, {', '.join(map(str, range(2, comm.size)))}"
        if comm.size > 4:
            others = f"0, 2-{last}"
        expected = f"x: ranks asked for different settings (freeze_step: 4 on rank(s) [{others}], 5 on rank(s) [1])"
        assert str(exc) == expected, (str(exc), expected)
    else:
        raise AssertionError("no RankMismatchError")
    same = {"scale": "l1", "freeze_step": 4} if comm.rank % 2 else {"freeze_step": 4, "scale": "l1"}
    agree(comm, "x", torch.empty(0), None, (values_option("settings", same),))
    if comm.size > 2:
        mine = {"freeze_step": 4, **({"extra": None} if comm.rank == last else {})}
        try:
            agree(comm, "x", torch.empty(0), None, (values_option("settings", mine),))
        except compcoll.RankMismatchError as exc:
            assert "(extra: absent on rank(s) [0" in str(exc) and f"None on rank(s) [{last}])" in str(exc), exc
        else:
            raise AssertionError("no RankMismatchError")
