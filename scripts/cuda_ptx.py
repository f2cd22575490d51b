"""Compile every numba.cuda kernel of ``compcoll.kernels.cuda`` to PTX with numba-cuda's own compiler, no GPU needed.

The CUDA simulator runs the kernels as Python and so accepts code that NVVM rejects (an
unsupported builtin, a type that does not unify); this script types and compiles each
kernel variant, with the argument types the codecs pass, for one compute capability.

Usage (numba-cuda with NVVM: ``pip install -e '.[gpu]'``):
    python scripts/cuda_ptx.py [--cc 9.0]
or with the compiler's packages in a folder of their own (what CI does:
``pip install --no-deps --target DIR -r requirements-cuda-compiler.txt``, and
``LD_LIBRARY_PATH=DIR/nvidia/cuda_nvrtc/lib``):
    python scripts/cuda_ptx.py --site DIR

1. Device functions compile for the current GPU's compute capability; without a GPU that
   lookup fails, so it is pinned to ``--cc`` here (this script only; nothing runs).
2. Every kernel variant (table or not, scale in memory or not, base or not, power 1 or 2,
   float32 or 16-bit output) compiles with ``numba.cuda.compile_ptx``.
3. The scale kernel's PTX must use the IEEE instructions the host's float64 maths uses
   (``sqrt.rn.f64``, ``div.rn.f64``, ``cvt.rn.f32.f64``), so the device's scales are the host's bits; the
   level kernels' must divide with ``div.rn.f32``, round products with ``cvt.rn.f32.f64`` and fuse no
   multiply-add; the average of rows must divide with ``div.rn.f32`` and fuse none; the block scales' coding
   and decoding must take the host's float64 roots, quotients and products (``sqrt.rn.f64``, ``div.rn.f64``,
   ``mul.f64``: round to nearest), round with ``cvt.rn.f32.f64``, divide the weights with ``div.rn.f32`` and fuse
   no multiply-add.
4. Arguments made as the codecs make them (``DeviceArray`` views of tensors, Python and
   numpy scalars) must type as the variant's types, and what ``kernels.launch`` flattens
   them to must be the entry's ``.param`` list: as many values, of the same widths
   (``parameter_widths``).
5. The numba-cuda in use is the one the bound launcher was written against
   (``PINNED_NUMBA_CUDA``), with the private attributes it reads.
Prints one line per kernel; exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import re
import site
import sys
from types import SimpleNamespace


def variants() -> dict[str, tuple]:
    """Every kernel variant the codecs launch: name -> (Python function, argument types)."""
    from numba import types as t

    from compcoll.kernels.cuda import blocks, frames, levels, randomized, records, scales, signs, sums

    def rows(dtype) -> t.Array:
        return t.Array(dtype, 2, "A")

    F32, F64, U8, U16, I16 = (t.Array(d, 1, "C") for d in (t.float32, t.float64, t.uint8, t.uint16, t.int16))
    I64 = t.int64
    FINISH = (t.Array(t.int32, 1, "C"), F64, I64, t.float64, I64, F32)
    """What ends a sum on the device: the block counts, the total, d, sqrt(d), the scale's mode and slot (the
    lane-sum kernels take their groups before it, 0 for none)."""
    found: dict[str, tuple] = {
        "tree: collapse to one block's width, then the last block": (sums._collapse.py_func, (F64, I64, F64, *FINISH)),
        "scale of a device sum": (records._scale_of.py_func, (F64, I64, t.float64, t.boolean, F32)),
        "max |x| of rows (reduce)": (randomized._absmax_rows.py_func, (F32, I64, F32)),
    }
    for out in (F32, I16):
        found[f"decode to {out.dtype}"] = (signs._select_decode.py_func, (rows(t.uint8), out, out, out, I64))
    found["average of rows"] = (signs._average_rows.py_func, (t.Array(t.float32, 2, "C"), F32))
    wire, coded = t.Array(t.uint8, 2, "C"), t.Array(t.float32, 2, "C")
    for power, src in ((0, F32), (2, F64), (1, F64)):
        found[f"code block scales, power {power}"] = (scales._code_blocks(power).py_func,
                                                      (src, I64, I64, F64, wire, coded))
        found[f"long rows' block scales and their parts' maxima, power {power}"] = (
            scales._part_maxima(power).py_func, (src, I64, I64, I64, coded, F32))
    found["code long rows' block scales from their parts' maxima"] = (scales._code_parts.py_func,
                                                                      (F64, I64, F32, wire, coded))
    found["decode block codes"] = (scales._decode_codes.py_func, (wire, F64, I64, coded))
    found["weights from the frame heads"] = (frames._head_weights.py_func, (rows(t.uint8), I64, F32))
    for name, raw in (("float32", t.uint32), ("float16", t.uint16), ("bfloat16", t.uint16)):
        found[f"decode to {name} with the scales in the frames"] = (
            frames._decode_framed(name, False).py_func, (rows(t.uint8), F64, I64, I64, t.Array(raw, 1, "C"), I64))
    for lut in (False, True):
        src = U16 if lut else F32
        for p in (1, 2):
            found[f"sum of |x|^{p}, table={lut}"] = (sums._power_lanes(lut, p).py_func,
                                                     (src, F32, F32, I64, F64, I64, *FINISH))
        for in_memory in (False, True):
            found[f"compensate + encode, table={lut}, scale in memory={in_memory}"] = (
                signs._compensate_encode(lut, in_memory).py_func,
                (src, F32, F32, I64, F32 if in_memory else t.float32, U8))
        found[f"max |x| of rows (lanes), table={lut}"] = (randomized._absmax_lanes(lut).py_func,
                                                          (src, F32, I64, I64, I64, F32))
        found[f"randomized encode, table={lut}"] = (randomized._randomized_encode(lut).py_func,
                                                    (src, F32, I64, F32, t.Array(t.uint64, 1, "C"), I64, wire))
        for p in (1, 2):
            found[f"block sums of |x|^{p}, table={lut}"] = (blocks._block_power_sums(lut, p).py_func,
                                                            (src, F32, F32, I64, I64, I64, F64))
        found[f"encode with block scales, table={lut}"] = (blocks._encode_blocks(lut).py_func,
                                                           (src, F32, F32, I64, F32, I64, I64, rows(t.uint8)))
        found[f"block max |x|, table={lut}"] = (blocks._block_absmax(lut).py_func,
                                                (src, F32, F32, I64, I64, I64, F32))
        found[f"encode levels, table={lut}"] = (levels._encode_levels(lut).py_func,
                                                (src, F32, F32, I64, F32, I64, I64, rows(t.uint8)))
    for name, raw in (("float32", t.uint32), ("float16", t.uint16), ("bfloat16", t.uint16)):
        found[f"decode to {name} with the block scales in the frames"] = (
            frames._decode_framed(name, True).py_func, (wire, F64, I64, I64, t.Array(raw, 1, "C"), I64))
    found["accumulate levels"] = (levels._accumulate_levels.py_func,
                                  (rows(t.uint8), rows(t.float32), I64, I64, F32, I64))
    found["decode levels"] = (levels._decode_levels.py_func, (rows(t.uint8), coded, I64, I64, F32, I64))
    found["accumulate groups of rows into their segments"] = (blocks._accumulate_groups.py_func,
                                                              (wire, coded, F32, I64))
    offsets = t.Array(t.int64, 1, "C")
    found["sums of squares by segment: lanes"] = (sums._segment_lanes.py_func, (F32, offsets, offsets, F64))
    found["sums of squares by segment: trees"] = (sums._segment_trees.py_func, (F64, offsets, F64))
    for base in (False, True):
        for p in (1, 2):
            found[f"accumulate signs, base={base}, power {p}"] = (
                sums._accumulate_lanes(base, p).py_func,
                (rows(t.uint8), F32, F32, F32, I64, F64, I64, *FINISH))
        found[f"accumulate with block weights, base={base}"] = (
            blocks._accumulate_blocks(base).py_func, (rows(t.uint8), rows(t.float32), I64, F32, F32, I64))
    return found


def ieee_problem(name: str, ptx: str) -> str | None:
    """What the PTX of kernel variant ``name`` lacks of the host's IEEE steps (step 3), or None.

    1. The operations its bits depend on, by variant: float64 roots, quotients and products
       (``mul.f64`` or ``mul.rn.f64``: both round to nearest), float32 quotients, roundings to float32.
    2. Where the CPU rounds each step, no fused multiply-add either (the sums' kernels fuse none
       that matter: their bits are the tree's, checked under the simulator).
    """
    exact = True
    if name == "scale of a device sum" or name.startswith(("tree:", "sum of", "accumulate signs")):
        wanted, exact = ("sqrt.rn.f64", "div.rn.f64", "cvt.rn.f32.f64"), False
    elif name.startswith(("code block scales", "long rows' block scales")):
        roots = {"2": ("sqrt.rn.f64", "div.rn.f64"), "1": ("div.rn.f64",), "0": ()}[name[-1]]
        coding = name.startswith("code")  # the 256 values; the parts' maxima kernel takes the scales alone
        wanted = (*roots, *("mul.f64",) * coding, *("cvt.rn.f32.f64",) * (coding or name[-1] != "0"))
    elif name.startswith("code long rows"):
        wanted = ("mul.f64", "cvt.rn.f32.f64")
    elif name == "decode block codes":
        wanted = ("mul.f64", "cvt.rn.f32.f64", "div.rn.f32")
    elif name.endswith("with the block scales in the frames"):
        wanted = ("mul.f64", "cvt.rn.f32.f64")
    elif name.startswith("encode levels"):
        wanted = ("div.rn.f32", "cvt.rn.f32.f64")
    elif "levels" in name:
        wanted = ("cvt.rn.f32.f64",)
    elif name in ("average of rows", "weights from the frame heads"):
        wanted = ("div.rn.f32",)
    else:
        return None
    found = ptx.replace("mul.rn.f64", "mul.f64")
    missing = [op for op in wanted if op not in found]
    fused = exact and "fma." in ptx
    problems = ([f"its PTX lacks {', '.join(missing)} (the host's IEEE steps)"] if missing else []) + (
        ["it fuses a multiply-add (the CPU rounds each step)"] if fused else [])
    return "; ".join(problems) or None


def ptx_parameter_sizes(ptx: str) -> list[int]:
    """The byte size of each parameter of the PTX's kernel entry (``.param .u64 name``, ``.b8``, ``.f32``, ...)."""
    entry = ptx[ptx.index(".entry"):]
    declared = entry[entry.index("(") + 1:entry.index(")")]
    return [int(bits) // 8 for bits in re.findall(r"\.param\s+\.[a-z]+?(\d+)\s", declared)]


def example_arguments(types: tuple) -> list:
    """Arguments as the codecs pass them for ``types``: DeviceArray views of (CPU) tensors, scalars."""
    import numpy as np
    import torch
    from numba import types as t

    from compcoll.kernels.launch import DeviceArray

    viewed = {"uint16": torch.int16, "uint32": torch.float32, "uint64": torch.int64}
    """Kernel dtypes the codecs view tensors of another dtype as (16-bit sources, a float32 output's bits, Birder's
    stream keys)."""
    made = []
    for ty in types:
        if isinstance(ty, t.Array):
            name = str(ty.dtype)
            dtype = viewed.get(name) or torch.from_numpy(np.zeros(1, name)).dtype
            tensor = torch.zeros((3, 16) if ty.ndim == 2 else (5,), dtype=dtype)
            array = DeviceArray.of(tensor[:, 2:] if ty.ndim == 2 and ty.layout == "A" else tensor)
            made.append(array.view(np.dtype(name)) if name in viewed else array)
        else:
            made.append({t.int64: 7, t.float64: 0.5, t.boolean: True, t.float32: np.float32(0.5),
                         t.uint64: np.uint64(3)}[ty])
    return made


def pin_problems() -> list[str]:
    """What differs from the numba-cuda the bound launcher reads (version, private attributes)."""
    import inspect
    from importlib.metadata import version

    from numba.cuda import codegen, dispatcher
    from numba.cuda.cudadrv import driver

    from compcoll.kernels.launch import PINNED_NUMBA_CUDA

    problems = []
    if version("numba-cuda") != PINNED_NUMBA_CUDA:
        problems.append(f"numba-cuda {version('numba-cuda')}, not {PINNED_NUMBA_CUDA}")
    if "self._codelibrary" not in inspect.getsource(dispatcher._Kernel):
        problems.append("numba.cuda.dispatcher._Kernel has no _codelibrary")
    if not hasattr(codegen.CUDACodeLibrary, "get_cufunc"):
        problems.append("CUDACodeLibrary has no get_cufunc")
    if not hasattr(driver, "_to_core_stream"):
        problems.append("numba.cuda.cudadrv.driver has no _to_core_stream")
    if "cufunc.kernel" not in inspect.getsource(dispatcher._Kernel.launch):
        problems.append("_Kernel.launch no longer launches cufunc.kernel through cuda.core")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="9.0", help="compute capability, major.minor (default 9.0: H100 / H200)")
    parser.add_argument("--site", help="a folder holding numba-cuda and the CUDA compiler's packages")
    args = parser.parse_args()
    if args.site:
        site.addsitedir(args.site)  # before numba.cuda is imported: numba-cuda's .pth redirects it
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda

    from compcoll.kernels.launch import _key, flattener, numba_type, parameter_widths

    cc = tuple(int(part) for part in args.cc.split("."))
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    failed = 0
    found = variants()
    for name, (function, types) in found.items():
        try:
            ptx, _ = cuda.compile_ptx(function, types, cc=cc)
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failed += 1
            print(f"FAILED  {name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        made = example_arguments(types)
        typed = tuple(numba_type(_key(a)) for a in made)
        flat: list = []
        for arg, ty in zip(made, typed):
            flattener(ty)(arg, flat)
        if typed != tuple(types):
            failed += 1
            print(f"FAILED  {name}: the launcher types the codecs' arguments as {typed}, not {tuple(types)}")
            continue
        declared, passed = ptx_parameter_sizes(ptx), parameter_widths(flat)
        if declared != passed:
            failed += 1
            print(f"FAILED  {name}: the PTX entry takes parameters of {declared} bytes, the launcher passes {passed}")
            continue
        print(f"ok      {name} ({len(ptx)} chars of PTX, {len(declared)} parameters as the launcher flattens them)")
        problem = ieee_problem(name, ptx)
        if problem:
            failed += 1
            print(f"FAILED  {name}: {problem}")
    for problem in pin_problems():
        failed += 1
        print(f"FAILED  the bound launcher's pin: {problem}")
    print(f"{len(found) - failed} of {len(found)} kernel variants compile for sm_{cc[0]}{cc[1]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
