"""Codec kernels: the numpy reference (the oracle) and fused Numba kernels, same names per device."""
