"""The CPU kernels of the 1-bit codec: the compensated encode, decodes of rows of signs, rows' exact average."""

from __future__ import annotations

import numpy as np
from numba import prange

from ...spec import BLOCK
from .common import load, pack, threaded, unpack


@threaded
def compensate_encode(src, lut, err, n_src, scale, bits):
    """Compensate, take signs, pack them and update the error, in one pass.

    For every element i (src zero beyond n_src; err.size is a multiple of 8):
    1. x = err[i] + src[i] in float32.
    2. bit = x >= 0 (sign(0) = +1); bits[i // 8] has element i at bit 7 - i % 8.
    3. err[i] = x - scale * (+1 if bit else -1).
    Each block writes its bits as bytes 0/1 in zero-based loops (vectorized), then packs them.
    """
    nbytes = err.size // 8
    per_block = BLOCK // 8
    nblocks = (nbytes + per_block - 1) // per_block
    for b in prange(nblocks):
        lo = b * per_block
        hi = min(nbytes, lo + per_block)
        first = lo * 8
        count = (hi - lo) * 8
        valid = min(count, max(0, n_src - first))
        errs = err[first:first + count]
        values = src[first:first + valid]
        flags = np.empty(count, np.uint8)
        for e in range(valid):
            x = errs[e] + load(values, lut, e)
            flags[e] = x >= 0
            errs[e] = x - scale if x >= 0 else x + scale
        tail_errs, tail_flags = errs[valid:], flags[valid:]
        for e in range(count - valid):
            x = tail_errs[e]
            tail_flags[e] = x >= 0
            tail_errs[e] = x - scale if x >= 0 else x + scale
        pack(flags, bits[lo:hi])


@threaded
def select_decode(bits, positive, negative, out, n_out):
    """Decode rows of packed signs: out[i] = positive[r] if the bit is set, else negative[r].

    ``bits`` is (n, nbytes): row r holds elements [r * 8 * nbytes, (r + 1) * 8 * nbytes).
    ``positive`` / ``negative`` hold the already rounded output values (+s_r, -s_r) in the
    output's storage type, so a float16 / bfloat16 output is written as raw bits.
    For every block of BLOCK elements of every row, in parallel:
    1. unpack its bytes into flags (``unpack``);
    2. write the row's positive or negative value for each flag, skipping elements >= n_out
       (an elementwise select, which LLVM vectorizes).
    """
    nranks, nbytes = bits.shape
    per_block = BLOCK // 8
    blocks_per_row = (nbytes + per_block - 1) // per_block
    for t in prange(nranks * blocks_per_row):
        r = t // blocks_per_row
        lo = (t % blocks_per_row) * per_block
        hi = min(nbytes, lo + per_block)
        start = (r * nbytes + lo) * 8
        count = max(0, min((hi - lo) * 8, n_out - start))
        if count:
            pos = positive[r]
            neg = negative[r]
            flags = np.empty(BLOCK, np.uint8)
            unpack(bits[r, lo:hi], flags)
            dest = out[start:start + count]
            for e in range(count):
                dest[e] = pos if flags[e] else neg


@threaded
def average_rows(rows, out):
    """out[i] = (((rows[0, i] + rows[1, i]) + ...) + rows[n - 1, i]) / n in float32, as ``reference.average_rows``.

    For every block of BLOCK elements, in parallel:
    1. add the rows in order into float32 accumulators (one rounding per addition);
    2. divide each by n (IEEE float32 division, correctly rounded).
    """
    n, m = rows.shape
    divisor = np.float32(n)
    for t in prange((m + BLOCK - 1) // BLOCK):
        lo = t * BLOCK
        hi = min(m, lo + BLOCK)
        acc = rows[0, lo:hi].copy()
        for r in range(1, n):
            acc += rows[r, lo:hi]
        out[lo:hi] = acc / divisor
