"""Plain numpy implementation of every codec step and of whole collectives: the test oracle.

Everything here favours being obviously right over being fast. It simulates the whole
world at once: a collective takes a list with one array per rank and returns one per rank.
The hierarchical simulations place rank r on node r // k, as ``ranks_per_node=k`` does.

The constants and the padding, hash and stream-key functions come from ``compcoll.spec``,
which the production code imports too (the ones the tests use are exported here as well). Summation order is part
of the definition, so that the fused kernels can reproduce it bit for bit: a sum of squares over ``x`` is taken in
blocks of ``BLOCK`` elements; inside a block lane ``l`` (``LANES`` lanes) sums ``x[l], x[l + LANES], ...``
sequentially in float64; the ``nblocks * LANES`` lane sums, block-major, are then added by ``tree_sum``.

The modules, one job each, named as the kernels': ``sums``, ``signs`` (the 1-bit codec), ``blocks`` (a scale per
block), ``levels``, ``randomized`` (Birder's), and ``collectives`` (whole collectives, and the bytes each rank sends).
"""

from ...spec import STAGES, block_lengths, padded_numel, stream_key
from .blocks import average_block_signs, block_absmax, block_sums, compress_blocks
from .collectives import (META_FIELDS, agreement_sent, compressed_allreduce, compressed_reduce_scatter,
                          hierarchical_allreduce, hierarchical_compressed_allreduce)
from .levels import compress_levels, level_codes, pack_planes, unpack_planes
from .randomized import absmax_rows, binarize, thresholds
from .signs import average_signs, compress, pack, pad, sign, unpack
from .sums import average_rows, power_sum, scale_of, segment_sumsq, sumsq, tree_sum

__all__ = [
    "META_FIELDS", "STAGES", "absmax_rows", "agreement_sent", "average_block_signs", "average_rows", "average_signs",
    "binarize", "block_absmax", "block_lengths", "block_sums", "compress", "compress_blocks", "compress_levels",
    "compressed_allreduce", "compressed_reduce_scatter", "hierarchical_allreduce",
    "hierarchical_compressed_allreduce", "level_codes", "pack", "pack_planes", "pad", "padded_numel",
    "power_sum", "scale_of", "segment_sumsq", "sign", "stream_key", "sumsq", "thresholds",
    "tree_sum", "unpack", "unpack_planes",
]
