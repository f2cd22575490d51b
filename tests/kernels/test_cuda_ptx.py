"""Every CUDA kernel variant compiles to PTX and fits its launch's block, no GPU needed (``scripts/cuda_ptx.py``).

The simulator (``test_cuda.py``) checks the kernels' bits but runs them as Python; this checks that NVVM accepts
them, and that ptxas's machine code of each fits the block its launch asks for (registers, shared memory), which
would otherwise fail only on a GPU. It runs where numba-cuda is importable (``pip install -e '.[gpu]'``) or where CI
put the compiler's packages (``.ci/run``: ``.venv/cuda-compiler``), and is skipped elsewhere; the check of a
report runs everywhere.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests import background

ROOT = Path(__file__).resolve().parents[2]
COMPILER = ROOT / ".venv" / "cuda-compiler"


def _command() -> tuple[list[str], dict[str, str]] | None:
    """How to run the script here: with the packages in ``COMPILER``, or with numba-cuda installed; None: neither."""
    script = [sys.executable, str(ROOT / "scripts" / "cuda_ptx.py")]
    if COMPILER.is_dir():
        nvrtc = COMPILER / "nvidia" / "cuda_nvrtc" / "lib"  # found by the dynamic loader, not a site folder
        library_path = os.pathsep.join(filter(None, [str(nvrtc), background.environment().get("LD_LIBRARY_PATH")]))
        return script + ["--site", str(COMPILER)], {"LD_LIBRARY_PATH": library_path}
    if importlib.util.find_spec("numba_cuda") is not None:
        return script, {}
    return None


@background.cold
def compile_every_variant(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The script, as a background job (``tests/background.py``); no command where it cannot run."""
    found = _command()
    return ([found[0]], found[1]) if found else ([], {})


@pytest.mark.skipif(_command() is None, reason="needs numba-cuda with NVVM (pip install -e '.[gpu]'; CI installs it)")
@background.job(compile_every_variant)
def test_every_cuda_kernel_variant_compiles_for_hopper() -> None:
    [done] = background.results(compile_every_variant, timeout=900).outcomes
    assert done.returncode == 0, done.output + done.errors
    compiled = re.search(r"^(\d+) of (\d+) kernel variants compile for sm_90$", done.output, re.MULTILINE)
    assert compiled and compiled[1] == compiled[2] and int(compiled[2]) > 0, done.output
    fit = re.search(r"^(\d+) of (\d+) fit their launch's block on sm_90 \(ptxas: /", done.output, re.MULTILINE)
    assert fit and fit[1] == fit[2] == compiled[2], done.output


def _script() -> ModuleType:
    """``scripts/cuda_ptx.py`` as a module (its imports at the top are the standard library's)."""
    spec = importlib.util.spec_from_file_location("cuda_ptx", ROOT / "scripts" / "cuda_ptx.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPORT = """ptxas info    : Compiling entry function 'kernel' for 'sm_90'
ptxas info    : Function properties for kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 117 registers, used 1 barriers, 2048 bytes smem
"""
"""What ptxas -v reported for the 1-bit block scales' coding kernel (power 2) in the sm_90 build, 2026-12-04."""


def test_a_kernel_is_refused_where_its_block_would_not_launch_on_a_gpu() -> None:
    script = _script()
    taken, problem = script.resource_problem(REPORT, 256)  # what the kernel's launch asks for: it fits
    assert problem is None and taken.startswith("117 registers (30720 a block of 256), 2048 bytes shared"), taken
    taken, problem = script.resource_problem(REPORT, 1024)  # 117 x 32 rounded to 3840 a warp, 32 warps
    assert problem == "a block of 1024 threads holds 122880 registers, past 65536", problem
    _, problem = script.resource_problem(REPORT.replace("2048 bytes smem", "49156 bytes smem"), 128)
    assert problem == "49156 bytes of static shared memory, past 49152", problem
    _, problem = script.resource_problem(REPORT.replace("Used 117", "Used 16"), 2048)
    assert problem == "2048 threads a block, past 1024", problem
