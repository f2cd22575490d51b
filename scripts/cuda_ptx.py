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
   numpy scalars) must type as the variant's types, and what ``kernels.bound`` flattens
   them to must be the entry's ``.param`` list: as many values, of the same widths
   (``parameter_widths``).
5. The numba-cuda in use is the one the bound launcher was written against
   (``PINNED_NUMBA_CUDA``), with the private attributes it reads, and the launcher's host side runs as far as it
   goes without a GPU (``host_side_problems``).
6. Each variant's PTX assembles to machine code with ``ptxas`` (what the driver does at its first launch on a
   GPU), and fits the block its launch asks for: registers, static shared memory and threads, which would
   otherwise fail only on a GPU ("too many resources requested for launch").
Prints one line per kernel and what it takes; exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import re
import site
import sys
from types import SimpleNamespace


def variants() -> dict[str, tuple]:
    """Every kernel variant the codecs launch: name -> (Python function, argument types, threads per block).

    The threads are the constant each variant's launch passes (``launch(kernel, grid, THREADS, ...)``), read from
    the same module, so that the resources it takes are checked against the block it runs in (step 6).
    """
    from numba import types as t

    from compcoll.kernels.cuda import blocks, common, frames, levels, randomized, records, scales, signs, sums

    def rows(dtype) -> t.Array:
        return t.Array(dtype, 2, "A")

    F32, F64, U8, U16, I16 = (t.Array(d, 1, "C") for d in (t.float32, t.float64, t.uint8, t.uint16, t.int16))
    I64 = t.int64
    FINISH = (t.Array(t.int32, 1, "C"), F64, I64, t.float64, I64, F32)
    """What ends a sum on the device: the block counts, the total, d, sqrt(d), the scale's mode and slot (the
    lane-sum kernels take their groups before it, 0 for none)."""
    FLAGGED = (t.Array(t.int32, 1, "C"), F64)
    """What ends a fold with its finite test (``blocks._staged_fold``, ``randomized._absmax_lanes``): the block count
    and flag, and the finite value's slot."""
    THREADS, LANE, CODE, FOLD = common.THREADS, sums.LANE_THREADS, scales.CODE_THREADS, blocks.FOLD_THREADS
    found: dict[str, tuple] = {
        "tree: collapse to one block's width, then the last block": (
            sums._collapse.py_func, (F64, I64, F64, *FINISH), sums.COLLAPSE_THREADS),
        "scale of a device sum": (records._scale_of.py_func, (F64, I64, t.float64, t.boolean, F32), 1),
    }
    for out in (F32, I16):
        found[f"decode to {out.dtype}"] = (signs._select_decode.py_func, (rows(t.uint8), out, out, out, I64), THREADS)
    found["average of rows"] = (signs._average_rows.py_func, (t.Array(t.float32, 2, "C"), F32), THREADS)
    wire, coded = t.Array(t.uint8, 2, "C"), t.Array(t.float32, 2, "C")
    for power, src in ((0, F32), (2, F64), (1, F64), (-4, F32)):
        found[f"code block scales, power {power}"] = (scales._code_blocks(power).py_func,
                                                      (src, I64, I64, F64, wire, coded), CODE)
        found[f"long rows' block scales and their parts' maxima, power {power}"] = (
            scales._part_maxima(power).py_func, (src, I64, I64, I64, coded, F32), CODE)
    found["code long rows' block scales from their parts' maxima"] = (scales._code_parts.py_func,
                                                                      (F64, I64, F32, wire, coded), CODE)
    found["decode block codes"] = (scales._decode_codes.py_func, (wire, F64, I64, coded), THREADS)
    found["weights from the frame heads"] = (frames._head_weights.py_func, (rows(t.uint8), I64, F32), THREADS)
    for name, raw in (("float32", t.uint32), ("float16", t.uint16), ("bfloat16", t.uint16)):
        found[f"decode to {name} with the scales in the frames"] = (
            frames._decode_framed(name, False).py_func, (rows(t.uint8), F64, I64, I64, t.Array(raw, 1, "C"), I64),
            THREADS)
    for lut in (False, True):
        src = U16 if lut else F32
        for p in (1, 2):
            found[f"sum of |x|^{p}, table={lut}"] = (sums._power_lanes(lut, p).py_func,
                                                     (src, F32, F32, I64, F64, I64, *FINISH), LANE)
        for in_memory in (False, True):
            found[f"compensate + encode, table={lut}, scale in memory={in_memory}"] = (
                signs._compensate_encode(lut, in_memory).py_func,
                (src, F32, F32, I64, F32 if in_memory else t.float32, U8), THREADS)
        found[f"compensate + encode, table={lut}, scale and weights from the agreed sums"] = (
            signs._compensate_encode_agreed(lut).py_func,
            (src, F32, F32, I64, F64, I64, I64, I64, t.Array(t.int32, 1, "C"), I64, t.float64, t.boolean, t.float32,
             F32, U8), THREADS)
        found[f"max |x| of rows (lanes), table={lut}"] = (
            randomized._absmax_lanes(lut).py_func, (src, F32, I64, I64, I64, t.boolean, F32, F32, *FLAGGED), THREADS)
        found[f"randomized encode, table={lut}"] = (randomized._randomized_encode(lut).py_func,
                                                    (src, F32, I64, F32, t.Array(t.uint64, 1, "C"), I64, wire),
                                                    THREADS)
        for p in (1, 2):
            found[f"block sums of |x|^{p}, table={lut}"] = (blocks._block_power_sums(lut, p).py_func,
                                                            (src, F32, F32, I64, I64, I64, F64, *FLAGGED), FOLD)
        found[f"encode with block scales, table={lut}"] = (blocks._encode_blocks(lut).py_func,
                                                           (src, F32, F32, I64, F32, I64, I64, rows(t.uint8)),
                                                           THREADS)
        found[f"block max |x|, table={lut}"] = (blocks._block_absmax(lut).py_func,
                                                (src, F32, F32, I64, I64, I64, F32, *FLAGGED), FOLD)
        found[f"encode levels, table={lut}"] = (levels._encode_levels(lut).py_func,
                                                (src, F32, F32, I64, F32, I64, I64, rows(t.uint8)), THREADS)
    for name, raw in (("float32", t.uint32), ("float16", t.uint16), ("bfloat16", t.uint16)):
        found[f"decode to {name} with the block scales in the frames"] = (
            frames._decode_framed(name, True).py_func, (wire, F64, I64, I64, t.Array(raw, 1, "C"), I64), THREADS)
    for source, weights in (("table", rows(t.float32)), ("codes", wire)):
        found[f"accumulate levels, weights from the {source}"] = (
            levels._accumulate_levels[source].py_func, (rows(t.uint8), weights, F64, I64, I64, I64, F32, F32, I64),
            THREADS)
    found["decode levels"] = (levels._decode_levels.py_func, (rows(t.uint8), coded, I64, I64, F32, I64), THREADS)
    found["accumulate groups of rows into their segments"] = (blocks._accumulate_groups.py_func,
                                                              (wire, coded, F32, I64), THREADS)
    offsets = t.Array(t.int64, 1, "C")
    found["sums of squares by segment: lanes"] = (sums._segment_lanes.py_func, (F32, offsets, offsets, F64), LANE)
    found["sums of squares by segment: trees"] = (sums._segment_trees.py_func, (F64, offsets, F64),
                                                  sums.COLLAPSE_THREADS)
    for base in (False, True):
        for p in (1, 2):
            found[f"accumulate signs, base={base}, power {p}"] = (
                sums._accumulate_lanes(base, p).py_func,
                (rows(t.uint8), F32, F32, F32, I64, F64, I64, *FINISH), LANE)
        for source, weights in (("table", rows(t.float32)), ("codes", wire), ("heads", wire)):
            found[f"accumulate sign bytes with weights from the {source}, base={base}"] = (
                blocks._accumulate_blocks(base, source).py_func,
                (rows(t.uint8), weights, F64, I64, I64, I64, F32, F32, I64), THREADS)
    return found


def ieee_problem(name: str, ptx: str) -> str | None:
    """What the PTX of kernel variant ``name`` lacks of the host's IEEE steps (step 3), or None.

    1. The operations its bits depend on, by variant: float64 roots, quotients and products
       (``mul.f64`` or ``mul.rn.f64``: both round to nearest; likewise float32's), float32 quotients, roundings to
       float32.
    2. Where the CPU rounds each step, no fused multiply-add either (the sums' kernels fuse none
       that matter: their bits are the tree's, checked under the simulator).
    """
    exact = True
    if name == "scale of a device sum" or name.startswith(("tree:", "sum of", "accumulate signs")):
        wanted, exact = ("sqrt.rn.f64", "div.rn.f64", "cvt.rn.f32.f64"), False
    elif name.startswith(("code block scales", "long rows' block scales")):
        power = name.rsplit(" ", 1)[1]  # -4: the steps of 4-bit levels, one float32 product
        roots = {"2": ("sqrt.rn.f64", "div.rn.f64"), "1": ("div.rn.f64",), "0": (), "-4": ("mul.f32",)}[power]
        coding = name.startswith("code")  # the 256 values; the parts' maxima kernel takes the scales alone
        wanted = (*roots, *("mul.f64",) * coding, *("cvt.rn.f32.f64",) * (coding or power in ("1", "2")))
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
    elif name.endswith("from the agreed sums"):
        wanted = ("sqrt.rn.f64", "div.rn.f64", "cvt.rn.f32.f64", "div.rn.f32")
    elif name in ("average of rows", "weights from the frame heads"):
        wanted = ("div.rn.f32",)
    else:
        return None
    found = ptx.replace("mul.rn.f64", "mul.f64").replace("mul.rn.f32", "mul.f32")
    missing = [op for op in wanted if op not in found]
    fused = exact and "fma." in ptx
    problems = ([f"its PTX lacks {', '.join(missing)} (the host's IEEE steps)"] if missing else []) + (
        ["it fuses a multiply-add (the CPU rounds each step)"] if fused else [])
    return "; ".join(problems) or None


BLOCK_REGISTERS = 65536
"""Registers a block may hold (compute capability 5.0 to 12.0)."""
REGISTER_UNIT = 256
"""A warp's registers are allocated in units of this many."""
STATIC_SHARED = 48 * 1024
"""Shared memory a kernel may declare statically, as numba's ``cuda.shared.array`` does."""


def ptxas_candidates() -> list[str]:
    """Every ``ptxas`` here: the CUDA compiler's pip package's on ``sys.path`` (``nvidia/cuda_nvcc``, beside the NVVM
    numba-cuda loads from it), then ``CUDA_HOME``'s and ``PATH``'s (a toolkit's, whose NVVM numba-cuda may load
    instead)."""
    import os
    import shutil
    from pathlib import Path

    found = [Path(entry) / "nvidia" / "cuda_nvcc" / "bin" / "ptxas" for entry in sys.path if entry]
    found += [Path(os.environ[name]) / "bin" / "ptxas" for name in ("CUDA_HOME", "CUDA_PATH") if name in os.environ]
    found += [Path(p) for p in (shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas") if p]
    return list(dict.fromkeys(str(p) for p in found if p.is_file()))


def assemble(ptx: str, cc: tuple[int, int], readers: dict) -> tuple[str, str] | str:
    """(ptxas's report, its path) for ``ptx`` assembled to sm_``cc`` machine code, as the driver does at a launch; or
    why it could not be.

    1. The first of ``ptxas_candidates`` that reads the PTX's ``.version`` (an NVVM newer than a ptxas writes a
       version that ptxas refuses) assembles it with ``-v``, which reports each entry's registers, shared memory and
       stack; ``readers`` caches it by version.
    2. Any other refusal (shared memory beyond ``STATIC_SHARED``, say) is the kernel's problem, returned as it is.
    """
    import subprocess
    import tempfile

    version = re.search(r"^\.version\s+(\S+)", ptx, re.MULTILINE)[1]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        for ptxas in ([readers[version]] if version in readers else ptxas_candidates()):
            done = subprocess.run([ptxas, f"-arch=sm_{cc[0]}{cc[1]}", "-v", source.name, "-o", "/dev/null"],
                                  capture_output=True, text=True)
            if "Unsupported .version" in done.stderr:
                continue
            readers[version] = ptxas
            if done.returncode != 0:
                return f"ptxas refused it: {done.stderr.strip()}"
            return done.stderr, ptxas
    return f"no ptxas here reads PTX .version {version} (pip install nvidia-cuda-nvcc-cu12, or a CUDA toolkit's)"


def resource_problem(report: str, threads: int) -> tuple[str, str | None]:
    """(what the kernel takes, or None) and why it cannot launch on ``threads`` threads a block (step 6), or None.

    A block of T threads holds ceil(T / 32) warps, each of R registers a thread rounded up to ``REGISTER_UNIT`` per
    warp; the launch fails ("too many resources requested") past ``BLOCK_REGISTERS``, and a kernel's static shared
    memory may not pass ``STATIC_SHARED``.
    """
    from compcoll.kernels.launch import MAX_BLOCK

    registers = int(re.search(r"Used (\d+) registers", report)[1])
    shared = re.search(r"(\d+) bytes smem", report)
    shared = int(shared[1]) if shared else 0
    stack = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", report)
    warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    held = warp * -(-threads // 32)
    taken = (f"{registers} registers ({held} a block of {threads}), {shared} bytes shared, "
             f"{stack[1] if stack else 0} bytes stack, {stack[2] if stack else 0} spilled")
    problems = ([f"{threads} threads a block, past {MAX_BLOCK}"] if threads > MAX_BLOCK else []) + (
        [f"a block of {threads} threads holds {held} registers, past {BLOCK_REGISTERS}"] if held > BLOCK_REGISTERS
        else []) + ([f"{shared} bytes of static shared memory, past {STATIC_SHARED}"] if shared > STATIC_SHARED else [])
    return taken, "; ".join(problems) or None


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

    from compcoll.kernels.arrays import DeviceArray

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

    from compcoll.kernels.bound import PINNED_NUMBA_CUDA

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
    return problems + host_side_problems()


def host_side_problems() -> list[str]:
    """What fails in the bound launcher's host side, run as far as it goes without a GPU (``kernels.bound``).

    Its launch shape and ``cuda.core.launch`` are made here; the default stream's cuda.core view needs the driver,
    so a ``RuntimeError`` (no driver library) is as far as it can go, and any other error (a misspelt private name, a
    changed signature) is a problem that would otherwise show first on a GPU.
    """
    from compcoll.kernels import bound

    problems = []
    for name, step in (("launch_config(1, 1)", lambda: bound.launch_config(1, 1)),
                       ("cuda.core.launch", bound._core_launcher),
                       ("core_stream(0)", lambda: bound.core_stream.__wrapped__(0))):
        try:
            step()
        except RuntimeError:
            continue
        except Exception as exc:  # noqa: BLE001 - report it, then fail
            problems.append(f"kernels.bound.{name}: {type(exc).__name__}: {exc}")
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

    from compcoll.kernels.bound import flattener, numba_type, parameter_widths, variant_key

    cc = tuple(int(part) for part in args.cc.split("."))
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=cc)
    failed = unfit = 0
    readers: dict[str, str] = {}
    found = variants()
    for name, (function, types, threads) in found.items():
        try:
            ptx, _ = cuda.compile_ptx(function, types, cc=cc)
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failed += 1
            print(f"FAILED  {name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
            continue
        made = example_arguments(types)
        typed = tuple(numba_type(variant_key(a)) for a in made)
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
        assembled = assemble(ptx, cc, readers)
        taken, problem = resource_problem(assembled[0], threads) if isinstance(assembled, tuple) else (None, assembled)
        if problem:
            unfit += 1
            print(f"FAILED  {name}: {problem}")
        else:
            print(f"        {taken}")
    for problem in pin_problems():
        failed += 1
        print(f"FAILED  the bound launcher's pin: {problem}")
    print(f"{len(found) - failed} of {len(found)} kernel variants compile for sm_{cc[0]}{cc[1]}")
    print(f"{len(found) - unfit} of {len(found)} fit their launch's block on sm_{cc[0]}{cc[1]} "
          f"(ptxas: {', '.join(sorted(set(readers.values()))) or 'none'})")
    return 1 if failed or unfit else 0


if __name__ == "__main__":
    sys.exit(main())
