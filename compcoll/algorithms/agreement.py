"""One small fixed-size round per call, so that every rank refuses a bad call alike (docs/architecture.md, "Plans")."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable, NoReturn, Sequence

import numpy as np
import torch

from .. import codecs, spec
from ..comm import Communicator
from ..errors import NonFiniteError, RankMismatchError, RemoteError
from .rounds import (RECORD, SUMMED, fields_fine, gather_messages, gather_statuses, gather_value, refusing_ranks,
                     sum_fields, summed)

SUM = RECORD - 1
"""The field of a gathered round's record on the device that holds the rank's float64 sum itself
(``Agreement.check_record``: (signature, 1.0, sum), where a host round's holds the value)."""
MAX_OPTIONS = 6
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class Option:
    """A choice all ranks must make alike: its plural name, this rank's code, and labels, or ``explain``: a collective
    that every rank of a round whose codes differ calls, returning what differs (``differences.values_option``)."""

    name: str
    code: int
    labels: tuple[str, ...] = ()
    explain: Callable[[Communicator], str] | None = field(default=None, compare=False)

    def label(self, code: float) -> str:
        return self.labels[int(code)] if self.labels and 0 <= int(code) < len(self.labels) else str(int(code))


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _finite_values(sums: np.ndarray, d: int, scale: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's finite? and value from its float64 sum: the float32 scale of ``d`` elements from it
    (``spec.scales_from``) where it is finite and ``scale`` is given, else 0.0."""
    finite = np.isfinite(sums)
    if scale is None:
        return finite, np.zeros(len(sums), np.float32)
    if finite.all():
        return finite, spec.scales_from(sums, d, scale)
    return finite, np.where(finite, spec.scales_from(np.where(finite, sums, 0.0), d, scale), np.float32(0.0))


def kept(agreements: dict[tuple[tuple[int, ...], torch.dtype], "Agreement"], comm: Communicator, what: str,
         numel: int, tensor: torch.Tensor, options: tuple[Option, ...] = ()) -> "Agreement":
    """The agreement of ``what`` on ``numel`` elements for ``tensor``'s shape and dtype, kept in ``agreements``
    (built on first use)."""
    key = (tuple(tensor.shape), tensor.dtype)
    found = agreements.get(key)
    if found is None:
        found = Agreement(comm, what, numel, tensor.shape, tensor.dtype, options)
        agreements[key] = found
    return found


class Agreement:
    """The per-call check of one plan: every rank's signature, finiteness and value (a scale), compared alike.

    The plan's description (collective, numel, shape, dtype, options) is reduced once to a
    32-bit signature. Each call's round has one fixed size whatever the collective, so that
    ranks in different calls still meet in it and all raise.
    1. Up to ``spec.GATHERED_AGREEMENT_RANKS`` ranks, all-gather every rank's status
       (signature, finite?, value): ``RECORD`` float64s. Above, allreduce
       ``SUMMED`` float64s (the signature's bytes, their squares, refused?, not finite?),
       whose bytes per rank do not grow with the ranks: the signatures agree where
       n * sum(b^2) == sum(b)^2 for each byte b, and the flags must sum to 0. A call that
       agrees on a value all-gathers that one float64 right after the allreduce, before it
       reads the sums (both in one wait on the device); only a failed round all-gathers the
       statuses, after the values' all-gather, which every rank of it makes (``_fail_summed``).
    2. Some rank refused its call (``refuse``: its own arguments were bad): a fixed-size
       all-gather of the refusing ranks' messages, and ``RemoteError`` naming them on every
       other rank.
    3. Signatures differ: a fixed-size all-gather of the descriptions, and the same
       ``RankMismatchError`` on every rank naming what differs (size, shape, dtype, an
       option, the caller's step or settings, or the collective itself).
    4. Some rank not finite: ``NonFiniteError`` on every rank.

    A call may carry a ``Step`` (``check``): the caller's count of its own calls (an optimizer's steps) and a code
    of the settings it must hold alike at that call (an optimizer's group hyperparameters), mixed into that call's
    signature (``Step.mixed``). A rank at another step (resumed from another step's save) or with other settings (a
    learning-rate scheduler stepped on some ranks only) fails the first round it meets, instead of running its
    schedule out of step or training on with another learning rate.

    Args:
        comm: the communicator the call runs on.
        what: the collective's name, for messages (and part of the signature).
        numel, shape, dtype: the tensor every rank passes.
        options: choices that must agree across ranks (at most ``MAX_OPTIONS``).
    """

    def __init__(
        self, comm: Communicator, what: str, numel: int, shape: Sequence[int], dtype: torch.dtype,
        options: tuple[Option, ...] = (),
    ) -> None:
        if len(options) > MAX_OPTIONS:
            raise ValueError(f"{what}: at most {MAX_OPTIONS} agreed options, got {len(options)}")
        if comm.size > spec.MAX_AGREEMENT_RANKS:
            raise ValueError(f"{what}: at most {spec.MAX_AGREEMENT_RANKS} ranks, got {comm.size}")
        self.comm = comm
        self.what = what
        self.options = options
        dtype_code = _DTYPES.index(dtype) if dtype in _DTYPES else _crc(str(dtype))
        codes = [float(o.code) for o in options] + [0.0] * (MAX_OPTIONS - len(options))
        self.description = [float(_crc(what)), float(numel), float(_crc(repr(tuple(shape)))), float(dtype_code)] + codes
        self.signature = float(_crc(repr(self.description)))
        self._step: Step | None = None
        self._value = torch.empty(1, dtype=torch.float64)
        self._values = torch.empty(comm.size, dtype=torch.float64)
        self._record = (torch.empty(RECORD, dtype=torch.float64), torch.empty(comm.size * RECORD, dtype=torch.float64))
        self._space: torch.Tensor | None = None
        self._layout: tuple[bool, bool] | None = None
        self._slot: torch.Tensor | None = None
        self._written: float | None = None

    def check(self, finite: bool | None = None, value: float | None = None, step: Step | None = None
              ) -> torch.Tensor | None:
        """Steps 1-4 for this call; returns every rank's ``value`` (float64, by rank), or None without one.

        ``finite=None`` skips the finiteness check; ``step``, where given, must be every rank's. The returned tensor
        is reused by the next call: read it before.
        """
        finite = finite is not False
        mine = 0.0 if value is None else value
        self._step = step
        signature = self.signature if step is None else step.mixed(self.signature)
        if summed(self.comm):
            sums = sum_fields(self.comm, signature, finite)
            values = None if value is None else gather_value(self.comm, value, (self._value, self._values))
            if not fields_fine(sums, self.comm.size):
                self._fail_summed(signature, finite, mine, values is not None)
            return values
        table = gather_statuses(self.comm, signature, finite, mine, self._record)
        return self._judged(table, signature, value is not None)

    def on_device(self) -> bool:
        """Whether this agreement's round runs on the device (``check_record``): the communicator's transport
        carries device tensors (``Communicator.agrees_on_device``: NCCL's)."""
        return self.comm.agrees_on_device

    def slot(self, device: torch.device) -> torch.Tensor:
        """Where a call's device part writes the float64 this round agrees on (a one-element tensor on ``device``,
        kept from call to call), which ``check_total`` takes: where the round runs on the device (``on_device``),
        the sum's field of this rank's record, so that the round launches nothing of its own (``check_record``);
        elsewhere a buffer of its own, which the host reads. Its layout follows the round's kind (on the device or
        not, gathered or summed): a communicator set to agree on the device after its first calls gets a new one
        (until 2026-12-05 the host's one-element buffer stayed, and the round's copy into it failed in torch)."""
        layout = (self.on_device(), summed(self.comm))
        if self._space is None or self._space.device != torch.device(device) or self._layout != layout:
            on_device, is_summed = layout
            n = self.comm.size
            length = (2 * SUMMED + n if is_summed else RECORD * (n + 1)) if on_device else 1
            self._space = torch.empty(length, dtype=torch.float64, device=device)
            at = (SUMMED - 1 if is_summed else SUM) if on_device else 0
            self._slot, self._written, self._layout = self._space[at:at + 1], None, layout
        return self._slot

    def device_sums(self) -> tuple[torch.Tensor, int, int]:
        """Where the last round on the device (``check_record`` with a scale) left every rank's sum: (the round's
        buffer, the first sum's index, the step to the next rank's), rank i's at first + i * step; the table's sum
        fields in a gathered round, the sums all-gathered behind the allreduce's in a summed one. The flat form's
        encode reads them there (``codecs.compensate_encode_agreed``)."""
        if summed(self.comm):
            return self._space, 2 * SUMMED, 1
        return self._space, self._table_at() + SUM, RECORD

    def _table_at(self) -> int:
        """Where a gathered round on the device finds its table in the buffer: behind the record, where the
        all-gather writes it; the record itself at one rank, whose round gathers nothing (its table is its record)."""
        return 0 if self.comm.size == 1 else RECORD

    def _head(self, signature: float, is_summed: bool) -> list[float]:
        """The fields of this rank's device record before its sum: the signature's bytes, their squares and
        refused? = 0 in a summed round, else the signature and 1.0."""
        return spec.summed_fields(signature, True)[:SUMMED - 1] if is_summed else [signature, 1.0]

    def check_total(self, total: torch.Tensor, d: int = 0, scale: str | None = None, step: Step | None = None,
                    host_scales: bool = True) -> tuple[float, torch.Tensor | None]:
        """The round of a call whose device part wrote a float64 into total[0] (a one-element tensor; a sum, or a
        finiteness test, finite exactly where the call's input is): the call's one host wait.

        1. Where the round runs on the device (``on_device``): ``check_record``.
        2. Elsewhere the host reads total[0] (``codecs.host_value``: the wait) and ``check`` agrees on whether it
           is finite, and, where ``scale`` ("l2" or "l1") is given, on the float32 scale of ``d`` elements from it
           (``codecs.scale_from``; 0.0 where it is not finite).
        ``step`` is the caller's (``check``); ``host_scales=False`` spares a round on the device the host's scales
        (``check_record``).

        Returns:
            This rank's value (0.0 without ``scale``), and every rank's values by rank (None without ``scale``).
        """
        if self.on_device():
            values = self.check_record(total, d, scale, step, host_scales)
            return (0.0 if values is None else float(values.numpy()[self.comm.rank])), values
        value = codecs.host_value(total)
        finite = math.isfinite(value)
        mine = float(codecs.scale_from(value, d, scale)) if finite and scale is not None else 0.0
        return mine, self.check(finite, None if scale is None else mine, step)

    def check_signatures(self, device: torch.device, step: Step | None = None) -> None:
        """``check`` of the signatures alone (no finiteness, no value), at the caller's ``step``: the round before a
        call's first collective that moves its data (the hierarchical form's node average), one host wait.

        1. Where the round runs on the device (``on_device``: NCCL's): ``check_record`` with no sum, on this
           agreement's buffer on ``device`` (the record's fields but the sum copied up only when the signature
           changes; its sum field, whatever a round before left there, is not read), so that no host record goes
           up and comes back (until 2026-12-05: through fresh pinned memory, a device buffer and a copy each way).
        2. Elsewhere ``check`` on host numbers.
        At one rank there is no round (no other rank to differ from; no wait): every call of the communicator is
        this rank's.
        """
        if self.comm.size == 1:
            return
        if self.on_device():
            self.check_record(None, 0, None, step, device=device)
        else:
            self.check(step=step)

    def check_record(self, total: torch.Tensor | None, d: int, scale: str | None, step: Step | None = None,
                     host_scales: bool = True, device: torch.device | None = None) -> torch.Tensor | None:
        """``check`` of the finiteness and, where ``scale`` is given, the float32 scale of ``d`` elements of the
        float64 sum in total[0], a one-element tensor on the device, its round on the device, where ``on_device``.

        Its buffer lives on total's device, kept from call to call (``slot``): this rank's record, then the table, so
        that one copy reads both. The record's fields but the sum depend on the signature alone: they are copied from
        the host (queued, no wait, from fresh pinned memory: ``codecs.pinned_like``) only when the signature changes (a
        caller's ``step`` changes it every call). The sum is ``slot``, where the call's device part wrote it (copied
        there on the device where it wrote elsewhere). Every rank's finiteness and value come from every rank's sum,
        computed on the host (``spec.scales_from``: the same bits on every rank). Gathered rounds (up to
        ``spec.GATHERED_AGREEMENT_RANKS`` ranks):
        1. The record is (signature, 1.0, sum): ``RECORD`` float64s, as a host round's (a refusing rank's host
           record, (``REFUSED``, 1.0, 0.0), pairs with it).
        2. All-gather the records into the table on the device (at one rank the record is the table: nothing is
           gathered, and the host reads the record itself).
        3. Read the table to the host (the call's one host wait: ``codecs.host_values``) and judge it as
           ``check`` does: the same errors on every rank. Up to 64 records, list operations judge it (each numpy
           call on so few numbers costs a microsecond or more); numpy computes the values alone.
        Summed rounds (above): the record is the summed round's first ``SUMMED - 1`` fields (the signature's
        bytes, their squares, refused? = 0), then the sum where a host round has not finite? (the allreduce's
        total of the sums is finite exactly where every rank's is). A copy of it behind it is allreduced on the
        device (the record keeps its fields for the next call, and the rank's own sum) and, where a value is
        asked, the sums all-gathered into the table behind that, both before the one read (the one wait: the record
        and the allreduce's sums, and the rank's sums only where the host computes the scales from them, so that a
        call whose encode derives them on the device reads 2 x ``SUMMED`` numbers at any number of ranks, not
        n more, whose list and array took some 40 us a call at 1,024 ranks until 2026-12-05); where the sums say
        the round failed, every rank goes on into the statuses' all-gather (``_fail_summed``).
        A rank that refused its call (``refuse``) takes part with host numbers of the same sizes. Meta tensors
        (nothing ran) stand in a sum of 1.0 for every rank, as ``codecs.host_value`` does. ``host_scales=False``: the
        round is the same (a summed one still all-gathers the sums where ``scale`` is given), but the host judges
        the sums alone and computes no scale, for a caller that reads the sums on the device
        (``device_sums``: the flat form's encode over NCCL).
        ``total=None`` (``check_signatures``): no sum, the signatures alone, on ``device``.
        Returns every rank's value (float64, by rank), or None without ``scale`` or ``host_scales``; reused by the
        next call.
        """
        self._step = step
        signature = self.signature if step is None else step.mixed(self.signature)
        n, valued = self.comm.size, scale is not None
        slot = self.slot(device if total is None else total.device)
        space = self._space
        if total is not None and total is not slot:
            slot.copy_(total)
        is_summed = summed(self.comm)
        if self._written != signature:
            head = self._head(signature, is_summed)
            fields = space[:len(head)]
            host = codecs.pinned_like(fields) if fields.is_cuda else torch.empty(len(head), dtype=torch.float64)
            host.numpy()[:] = head
            codecs.to_device(host, fields)
            self._written = signature
        if not is_summed:
            at = self._table_at()
            if at:
                self.comm.allgather(space[:RECORD], space[RECORD:])
            found = codecs.host_values(space[at:at + RECORD * n]) or [signature, 1.0, 1.0] * n
            sums = found[SUM::RECORD] if total is not None else [0.0] * n
            if found[::RECORD].count(signature) != n or not all(map(math.isfinite, sums)):
                finite, values = _finite_values(np.array(sums), d, scale)
                self._fail(np.column_stack([found[::RECORD], finite, values]).tolist(), signature)
            if not valued or not host_scales:
                return None
            self._values.numpy()[:] = spec.scales_from(np.array(sums), d, scale)
            return self._values
        reduced = space[SUMMED:2 * SUMMED].copy_(space[:SUMMED])
        self.comm.allreduce(reduced)
        if valued:
            self.comm.allgather(slot, space[2 * SUMMED:])
        read = 2 * SUMMED + (n if valued and host_scales else 0)
        found = codecs.host_values(space[:read]) or self._stand_in(signature, valued)[:read]
        mine, overall = (found[SUMMED - 1], found[2 * SUMMED - 1]) if total is not None else (0.0, 0.0)
        finite, values = _finite_values(np.array([mine, overall] + found[2 * SUMMED:]), d,
                                        scale if host_scales else None)
        sums = found[SUMMED:2 * SUMMED - 1] + [0.0 if finite[1] else 1.0]
        if not fields_fine(sums, n):
            self._fail_summed(signature, bool(finite[0]), float(values[0]), valued)
        if not valued or not host_scales:
            return None
        self._values.numpy()[:] = values[2:]
        return self._values

    def _stand_in(self, signature: float, valued: bool) -> list[float]:
        """What a summed device round reads on meta tensors (nothing ran): every rank's record with a sum of 1.0,
        as ``codecs.host_value`` stands in 1.0 for a sum; the sums of the n records; the n sums of 1.0 where
        ``valued``."""
        head, n = self._head(signature, True), self.comm.size
        return head + [1.0] + [n * v for v in head] + [float(n)] + [1.0] * (n if valued else 0)

    def _fail_summed(self, signature: float, finite: bool, value: float, gathered: bool) -> NoReturn:
        """A summed round whose sums say it failed: the values' all-gather where this call has not made it
        (``gathered``: one that agrees on a value made it with the allreduce), then the statuses' all-gather, and
        the error every rank raises (``_fail``)."""
        if not gathered:
            gather_value(self.comm, 0.0)
        self._fail(gather_statuses(self.comm, signature, finite, value), signature)

    def _judged(self, table: list[list[float]], signature: float, valued: bool) -> torch.Tensor | None:
        """Steps 2-4 of a gathered round's status ``table`` where a rank failed (``_fail``); else every rank's value
        (``valued``) or None."""
        if any(row[0] != signature or not row[1] for row in table):
            self._fail(table, signature)
        if not valued:
            return None
        self._values.numpy()[:] = [row[2] for row in table]
        return self._values

    def _fail(self, table: list[list[float]], signature: float) -> NoReturn:
        """Steps 2-4 on every rank's status (``signature``: this call's): raise the error every rank raises."""
        refusing = refusing_ranks(table)
        if refusing:
            failures = gather_messages(self.comm, "", refusing)
            listing = "; ".join(f"rank {r}: {message}" for r, message in failures.items())
            raise RemoteError(
                f"{self.what}: rank(s) {list(failures)} refused the call ({listing}); nothing was changed on "
                f"any rank and the communicator is still usable", failures)
        if any(row[0] != signature for row in table):
            self._diagnose()
        bad = [r for r, row in enumerate(table) if not row[1]]
        raise NonFiniteError(
            f"{self.what}: NaN or Inf in the input or its worker error on rank(s) {bad}; no buffer was changed on "
            f"any rank and the communicator is still usable (skip this step, as a loss scaler does, or fix the "
            f"input)"
        )

    def _diagnose(self) -> None:
        """Gather every rank's description and raise the same RankMismatchError on every rank."""
        step = self._step
        called = [NO_STEP, 0.0] if step is None else [float(step.index), float(step.settings)]
        mine = torch.tensor(self.description + called, dtype=torch.float64)
        table = torch.empty(self.comm.size * mine.numel(), dtype=torch.float64)
        self.comm.allgather(mine, table)
        rows = table.view(self.comm.size, -1).tolist()

        def listing(column: int, label: Callable[[float], str] = lambda v: str(int(v))) -> str:
            return ", ".join(f"rank {r}: {label(row[column])}" for r, row in enumerate(rows))

        def differs(column: int) -> bool:
            return any(row[column] != rows[0][column] for row in rows)

        what, index, settings = self.what, 4 + MAX_OPTIONS, 5 + MAX_OPTIONS
        stepped = all(row[index] != NO_STEP for row in rows)
        if stepped and differs(index):
            raise RankMismatchError(
                f"{what}: the ranks are at different steps ({listing(index)}): a rank resumed from another step's "
                f"checkpoint, and its schedule and calls would run out of step with the others'; load every rank's "
                f"state from one save (compcoll.checkpoint)"
            )
        if stepped and differs(settings):
            others = [r for r, row in enumerate(rows) if row[settings] != rows[0][settings]]
            detail = f" ({self._step.explain(self.comm)})" if self._step.explain else ""
            raise RankMismatchError(
                f"{what}: at step {int(rows[0][index])} the {self._step.label} of rank(s) {others} differ from rank "
                f"0's{detail}: a learning-rate scheduler stepped, or param_groups edited, on some ranks only; every "
                f"rank must change them alike"
            )
        if differs(0):
            raise RankMismatchError(
                f"{what}: the ranks are in different collectives (this rank is in {what}); calls are out of "
                f"step across ranks"
            )
        if differs(1):
            raise RankMismatchError(f"{what}: tensor sizes differ across ranks ({listing(1)} elements)")
        if differs(2):
            raise RankMismatchError(
                f"{what}: tensor shapes differ across ranks (same number of elements); reshape them alike"
            )
        if differs(3):
            names = {float(i): str(d).replace("torch.", "") for i, d in enumerate(_DTYPES)}
            raise RankMismatchError(
                f"{what}: tensor dtypes differ across ranks ({listing(3, lambda v: names.get(v, '?'))})"
            )
        for column, option in enumerate(self.options, 4):
            if differs(column):
                detail = option.explain(self.comm) if option.explain else listing(column, option.label)
                raise RankMismatchError(f"{what}: ranks asked for different {option.name} ({detail})")
        raise RankMismatchError(f"{what}: the ranks' calls differ (signatures differ)")


NO_STEP = -1.0
"""The step slot of a call that carries none."""
_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class Step:
    """What one call of a caller's step carries into its agreement round (``Agreement.check``).

    Args:
        index: the caller's count of its calls (an optimizer's ``step_index``), non-negative.
        settings: a CRC-32 of what the caller must hold alike at this call (an optimizer's group hyperparameters).
        label: what ``settings`` covers, for messages.
        explain: where ``settings`` differ, a collective every rank calls that says what differs (``Option.explain``).
    """

    index: int
    settings: int = 0
    label: str = "settings"
    explain: Callable[[Communicator], str] | None = field(default=None, compare=False)

    def mixed(self, signature: float) -> float:
        """``signature`` XOR (index + 1) and the settings, each times an odd 32-bit constant: another CRC-sized
        value for every step and settings (no more bytes in the round)."""
        index = ((self.index + 1) * 0x9E3779B1) & _MASK
        return float((int(signature) ^ index ^ ((self.settings * 0x85EBCA6B) & _MASK)) & _MASK)


def agree(
    comm: Communicator,
    what: str,
    tensor: torch.Tensor,
    finite: bool | None,
    options: tuple[Option, ...] = (),
    values: tuple[float, ...] = (),
    step: Step | None = None,
) -> torch.Tensor:
    """A one-off ``Agreement`` for ``tensor`` (a call that keeps no plan: an optimizer's construction or step), at
    the caller's ``step`` where given (``Agreement.check``).

    Returns the (size, len(values)) table of every rank's ``values`` (at most one value).
    """
    if len(values) > 1:
        raise ValueError(f"{what}: at most one agreed value per call, got {len(values)}")
    agreement = Agreement(comm, what, tensor.numel(), tensor.shape, tensor.dtype, options)
    gathered = agreement.check(finite, values[0] if values else None, step)
    if gathered is None:
        return torch.empty(comm.size, 0, dtype=torch.float64)
    return gathered.clone().view(-1, 1)


def agree_settings(comm: Communicator, what: str, settings: dict[str, int]) -> None:
    """One agreement round that every rank made the same ``settings`` (name -> integer code, at most
    ``MAX_OPTIONS``) before they act on them: ``RankMismatchError`` naming the first that differs, on every rank.

    A hook state whose ranks start compressing at different iterations would otherwise send one rank's bucket
    through torch's allreduce and another's through compcoll's group, and both would wait until a timeout;
    ``broadcast_buffers`` checks its buffers' layout and root this way.
    """
    agree(comm, what, torch.empty(0), None, tuple(Option(name, code) for name, code in settings.items()))
