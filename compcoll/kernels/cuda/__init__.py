"""Fused numba.cuda kernels for the low-bit codecs, with the CPU kernels' names and results (the reference's bits).

Every function takes device arrays (``kernels.arrays.DeviceArray`` views of torch CUDA tensors, numba device
arrays; host numpy arrays under the simulator, ``NUMBA_ENABLE_CUDASIM=1``) and an optional ``stream``
(``numba.cuda.external_stream`` of torch's current stream, so kernels queue behind the work that produced their
input). Every launch and every read back to the host goes through ``kernels.launch``, which counts them and
launches pre-bound variants through cuda.core.

Kernels use grid-stride loops and no warp intrinsics. 16-bit inputs arrive as raw uint16 with the 65536-entry
float32 table, as on the CPU. No per-element 64-bit division (dozens of instructions a thread): a block size, a
power of two, is a shift, and a thread walking rows keeps the row of its last element (and a frame's head) and
divides (and reads the head) only when it leaves it. No kernel takes a None argument: each is built per variant
(with or without a table, with or without a base vector, power 1 or 2) and cached.

A device function that reads ``cuda`` (threads, barriers, shared memory) is called only by kernels of its own
module: numba's CUDA simulator swaps its stand-in for ``cuda`` into the running kernel's module for the whole
launch, but into another module's only for the length of each device call, which ends under the feet of that
call's other threads.

The modules, one job each:
* ``common``: launch geometry, element lookups, row walking, sign packing;
* ``sums``: float64 sums in the CPU's order, finished on the device by the last blocks' pairwise tree (of the
  input, and of the server's accumulated signs);
* ``records``: a device sum's scale;
* ``signs``: the 1-bit codec's encode and decodes, and the exact average of rows;
* ``frames``: a wire row's head scale, and the tiled decoders of framed rows;
* ``scales``: the block forms' scales, coded against each row's largest;
* ``blocks``: the block forms' sums, maxima, encode and accumulation (of wire rows too, their weights decoded as
  they add: the block forms' and the 1-bit frames');
* ``levels``: the level codec;
* ``randomized``: Birder's row maxima and randomized encode.
"""

from .blocks import (accumulate_blocks, accumulate_framed_blocks, accumulate_frames, accumulate_groups, block_absmax,
                     block_power_sums, encode_blocks)
from .frames import decode_framed, decode_framed_blocks, head_weights
from .levels import accumulate_framed_levels, accumulate_levels, decode_levels, encode_levels
from .randomized import randomized_encode, row_absmax
from .scales import code_blocks, decode_codes
from .records import scale_of
from .signs import average_rows, compensate_encode, compensate_encode_agreed, select_decode
from .sums import accumulate_lanes, accumulate_signs, compensated_power_sum, segment_sumsq, tree_sum

__all__ = [
    "accumulate_blocks", "accumulate_framed_blocks", "accumulate_framed_levels", "accumulate_frames",
    "accumulate_groups", "accumulate_lanes", "accumulate_levels", "accumulate_signs", "average_rows",
    "block_absmax", "block_power_sums", "code_blocks", "compensate_encode", "compensate_encode_agreed",
    "compensated_power_sum", "decode_codes", "decode_framed", "decode_framed_blocks", "decode_levels",
    "encode_blocks", "encode_levels", "head_weights", "randomized_encode", "row_absmax", "scale_of",
    "segment_sumsq", "select_decode", "tree_sum",
]
