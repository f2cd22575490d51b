"""Low-bit codecs on torch tensors (scaled sign, binary randomization, uniform levels): dtypes, wire layout, kernels.

The algorithms call only this package; ``dispatch`` picks the kernels for the tensor's device and hands them
zero-copy views; ``sums`` holds the sums and scales, ``signs`` the 1-bit codes and their frames, ``blocks`` the
block-scaled codes. The wire layout of a 1-bit chunk is its packed signs (first element in the most significant
bit), preceded, where a scale travels with it, by that scale as 4 native-endian float32 bytes.
"""

from ..spec import SCALE_BYTES
from .blocks import (accumulate_blocks, accumulate_framed, accumulate_levels, block_absmax, block_sums,
                     decode_framed_blocks, decode_levels, encode_blocks, encode_levels, frame_scales, unframe_blocks)
from .dispatch import (SUPPORTED_DTYPES, Scalar, check_device, device_scalar, host_value, host_values, on_host,
                       pinned_like, start_cpu_threads, to_device)
from .signs import compensate_encode, decode, decode_framed, frame, randomized_encode, row_absmax, stream_keys, unframe
from .sums import (accumulate_groups, accumulate_lanes, accumulate_scale, accumulate_signs, all_finite, average_rows,
                   compensate_encode_agreed, compensated_sum, divide_, finite_sum, lane_count, scale_from,
                   segment_sumsq, sumsq, tree_scale, tree_sum)

__all__ = ["SCALE_BYTES", "SUPPORTED_DTYPES", "Scalar", "accumulate_blocks", "accumulate_framed", "accumulate_groups",
           "accumulate_lanes", "accumulate_levels", "accumulate_scale", "accumulate_signs", "all_finite",
           "average_rows", "block_absmax", "block_sums", "check_device", "compensate_encode",
           "compensate_encode_agreed", "compensated_sum", "decode", "decode_framed", "decode_framed_blocks",
           "decode_levels", "device_scalar", "divide_", "encode_blocks", "encode_levels", "finite_sum", "frame",
           "frame_scales", "host_value", "host_values", "lane_count", "on_host", "pinned_like", "randomized_encode",
           "row_absmax", "scale_from", "segment_sumsq", "start_cpu_threads", "stream_keys", "sumsq", "to_device",
           "tree_scale", "tree_sum", "unframe", "unframe_blocks"]
