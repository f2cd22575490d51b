"""Fused Numba CPU kernels for the low-bit codecs; bit-identical to ``kernels.reference``.

Every kernel works on numpy arrays (zero-copy views of torch CPU tensors). A 16-bit input
(float16 / bfloat16) arrives as its raw uint16 bits together with a 65536-entry float32
lookup table (exact conversion); a float32 input arrives with ``lut=None``, and Numba
compiles that case without the lookup. Sums of squares follow the reference's order
(``LANES`` lanes per ``BLOCK``-element block, then a pairwise tree), so results do not
depend on the number of threads.

The kernels run on Numba's threads (``common``: its "workqueue" layer unless ``NUMBA_THREADING_LAYER`` says
otherwise), and inputs below ``serial_below()`` elements (measured once: ``serial``) run a serial twin of each
kernel (``SERIAL``). Workqueue must not be entered by two threads at once, so ``codecs`` calls these kernels under
one process-wide lock. The kernels release the GIL (``nogil``): while one runs on a communicator's ordering thread,
the caller's Python and torch work go on.

The modules, one job each, named as ``kernels.cuda``'s:
* ``common``: the threading layer, serial twins, element loads and scalar steps, sign packing;
* ``sums``: float64 sums in the reference's order (of the input, of segments, of the server's accumulated signs);
* ``signs``: the 1-bit codec's encode and decode, and the exact average of rows;
* ``randomized``: Birder's row maxima and randomized encode;
* ``blocks``: the block forms' sums, maxima, encode, accumulation and decode;
* ``scales``: the block forms' scales, coded against each row's largest;
* ``serial``: which calls run the serial twins (the switch, measured once);
* ``levels``: the level codec.
"""

from .blocks import accumulate_blocks, accumulate_groups, block_absmax, block_power_sums, decode_blocks, encode_blocks
from .common import SERIAL
from .levels import accumulate_levels, decode_levels, encode_levels
from .randomized import randomized_encode, row_absmax
from .scales import code_blocks, decode_codes
from .serial import FLOOR, runs_serially, serial_below, serially, use_serial_below
from .signs import average_rows, compensate_encode, select_decode
from .sums import accumulate_lanes, accumulate_signs, compensated_power_sum, segment_sumsq, tree_sum

__all__ = [
    "FLOOR", "SERIAL", "accumulate_blocks", "accumulate_groups", "accumulate_lanes", "accumulate_levels",
    "accumulate_signs", "average_rows", "block_absmax", "block_power_sums", "code_blocks", "compensate_encode",
    "compensated_power_sum", "decode_blocks", "decode_codes", "decode_levels", "encode_blocks", "encode_levels",
    "randomized_encode", "row_absmax", "runs_serially", "segment_sumsq", "select_decode", "serial_below",
    "serially", "tree_sum", "use_serial_below",
]
