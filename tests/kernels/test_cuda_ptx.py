"""Every CUDA kernel variant compiles to PTX with numba-cuda's own compiler, no GPU needed (``scripts/cuda_ptx.py``).

The simulator (``test_cuda.py``) checks the kernels' bits but runs them as Python; this
checks that NVVM accepts them. It runs where numba-cuda is importable (``pip install -e
'.[gpu]'``) or where CI put the compiler's packages (``.ci/run``: ``.venv/cuda-compiler``),
and is skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

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
