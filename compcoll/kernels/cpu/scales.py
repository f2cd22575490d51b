"""The CPU kernels of the block forms' scales: coded against each row's largest in front of the row, and decoded."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...spec import SCALE_BYTES
from .common import block_scale, head_value, nearest_code, set_head, threaded

CODES_A_TASK = 4096
"""Codes of one row ``code_blocks`` codes and ``decode_codes`` decodes in a task."""


@njit(cache=True, inline="always")
def _code_scale(table, scales, codes, b):
    """codes[b] <- the code of scales[b] among its row's 256 values ``table`` (``nearest_code``); scales[b] <- that
    value."""
    code = nearest_code(table, scales[b])
    codes[b] = code
    scales[b] = table[code]


@threaded
def code_blocks(src, block, row_len, power, steps, rows, decoded):
    """Block scales coded against each row's largest and framed: ``spec.block_scales_from`` of float64 sums of
    |x|^power (or the float32 scales in ``src``, ``power`` 0), then ``spec.code_scales``, in one kernel.

    ``decoded`` is (n, m): row r's m block scales, of blocks of ``block`` elements of a row of ``row_len``
    (the last one shorter where needed); ``rows`` the (n, SCALE_BYTES + m + nbytes) wire rows.
    1. Every block's scale into ``decoded`` (``scalar.block_scale``), in parallel.
    2. Row by row: ref = the row's largest (0 for no blocks), its 4 bytes at the row's head; the
       values float32(float64(ref) * steps[k]) into the row's table.
    3. Every block's code (``scalar.nearest_code``) behind its row's head, and its decoded value into ``decoded``,
       in parallel: one row's codes in a parallel loop of their own, several rows' ``CODES_A_TASK`` of one row a task.
    At most two parallel loops run a call whatever n, and no array expression beside them: Numba makes an array
    expression a parallel loop of its own, and the row's head copied and its values computed that way, with the
    codes in a parallel loop a row, woke Numba's threads 3n + 1 times (``common.threaded``). On the 2-core machine,
    65,536 scales in 16 rows: 3.9-6.0 -> 1.4-2.2 ms, in 64 rows 12.6-18.1 -> 1.4. A parallel loop over one row's codes
    is the one form of the codes' loop that LLVM vectorized, so a row alone (the server's chunk) keeps it: 1.5-2.4
    ms in tasks against 1.0 (2026-12-06, alternated 3 times, medians of 9 x 5).
    """
    n, m = decoded.shape
    for t in prange(n * m):
        b = t % m
        decoded[t // m, b] = block_scale(src, t, block if b < m - 1 else row_len - (m - 1) * block, power)
    values = np.empty((n, steps.size), np.float32)
    head = np.empty(1, np.float32)
    for r in range(n):
        top = np.float32(0)
        for b in range(m):
            top = max(top, decoded[r, b])
        set_head(rows, r, top, head)
        ref = np.float64(top)
        for k in range(steps.size):
            values[r, k] = np.float32(ref * steps[k])
    if n == 1:
        table, scales, codes = values[0], decoded[0], rows[0, SCALE_BYTES:SCALE_BYTES + m]
        for b in prange(m):
            _code_scale(table, scales, codes, b)
        return
    per_row = (m + CODES_A_TASK - 1) // CODES_A_TASK
    for t in prange(n * per_row):
        r = t // per_row
        lo = (t % per_row) * CODES_A_TASK
        hi = min(m, lo + CODES_A_TASK)
        table, scales = values[r], decoded[r, lo:hi]
        codes = rows[r, SCALE_BYTES + lo:SCALE_BYTES + hi]
        for b in range(hi - lo):
            _code_scale(table, scales, codes, b)


@threaded
def decode_codes(rows, steps, divisor, decoded):
    """decoded[r, b] = float32(float64(ref_r) * steps[code]) / float32(divisor) for the m codes behind each wire
    row's head (its largest scale's 4 bytes): the refs first (``common.head_value``, a byte at a time: a slice of the
    head copied was a parallel loop of Numba's a row, 1.3-2.0 ms of 65,536 codes in 16 rows, 5.4-6.7 in 64, where
    the whole kernel takes 0.10-0.18 now), then the codes in parallel, ``CODES_A_TASK`` of one row a task through
    the row's slices (a row and a column divided out of every code's index: 0.31-0.34 ms against 0.10-0.16 in 1 to
    64 rows)."""
    n, m = decoded.shape
    by = np.float32(divisor)
    refs = np.empty(n, np.float64)
    head = np.empty(1, np.float32)
    for r in range(n):
        refs[r] = head_value(rows, r, head)
    per_row = (m + CODES_A_TASK - 1) // CODES_A_TASK
    for t in prange(n * per_row):
        r = t // per_row
        lo = (t % per_row) * CODES_A_TASK
        hi = min(m, lo + CODES_A_TASK)
        ref = refs[r]
        codes, out = rows[r, SCALE_BYTES + lo:SCALE_BYTES + hi], decoded[r, lo:hi]
        for b in range(hi - lo):
            out[b] = np.float32(ref * steps[codes[b]]) / by
