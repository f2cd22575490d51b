"""The numba.cuda kernels give the CPU kernels' bits under the CUDA simulator (in subprocesses: it precedes numba)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests import background
from tests.kernels.cuda_sim_checks import PARTS

GROUPS = (("tree", "float16", "bfloat16", "levels", "races", "scale"),
          ("float32", "blocks", "grid"))
"""``cuda_sim_checks``' parts in two processes of about equal time, run side by side on two cores."""


@background.cold
def simulator_runs(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The two simulator processes (``GROUPS``), on lengths 1, 37, 1000 and 8200."""
    command = [sys.executable, "-m", "tests.kernels.cuda_sim_checks", "1", "37", "1000", "8200"]
    return ([command + [f"--part={part}" for part in group] for group in GROUPS],
            {"NUMBA_ENABLE_CUDASIM": "1"})


def test_the_groups_cover_every_part() -> None:
    assert sorted(part for group in GROUPS for part in group) == sorted(PARTS)


@background.job(simulator_runs)
def test_cuda_kernels_match_cpu_kernels_under_the_simulator() -> None:
    for group, done in zip(GROUPS, background.results(simulator_runs, timeout=900).outcomes):
        assert done.returncode == 0, f"parts {group}:\n{done.output}{done.errors}"
        assert "cuda kernels == cpu kernels" in done.output, done.output


def test_a_block_size_is_a_shift_and_only_a_power_of_two_is_taken() -> None:
    """The kernels shift by log2 of the block size where they would divide by it: a size that is not a power of two
    (``spec`` refuses one first) would shift to other blocks, so it is refused here too."""
    from compcoll.kernels.cuda.common import shift_of

    assert [shift_of(b) for b in (1, 8, 64, 8192)] == [0, 3, 6, 13]
    with pytest.raises(ValueError, match="block size 48 is not a power of two"):
        shift_of(48)


def test_device_functions_that_read_cuda_are_called_only_from_their_own_module() -> None:
    """numba's simulator swaps its stand-in for ``cuda`` into another module's globals only for each device call,
    and back when that call ends, while the launch's other threads may still be inside it: a device function that
    reads ``cuda`` (threads, barriers, shared memory) and is imported by another kernel module fails there
    ("module 'numba.cuda' has no attribute 'threadIdx'"), as a first split of ``kernels/cuda`` did. So none is.

    1. Each module's device functions whose bodies read ``cuda``, found in its syntax tree.
    2. Every ``from .module import ...`` of the package's modules: none of those names.
    """
    package = Path(__file__).parents[2] / "compcoll" / "kernels" / "cuda"
    trees = {path.stem: ast.parse(path.read_text()) for path in package.glob("*.py")}
    device = [(name, node) for name, tree in trees.items() for node in tree.body if isinstance(node, ast.FunctionDef)
              and any("device=True" in ast.unparse(d) for d in node.decorator_list)]
    reading = {(name, node.name) for name, node in device
               if any(isinstance(n, ast.Name) and n.id == "cuda" for n in ast.walk(ast.Module(node.body, [])))}
    assert ("sums", "_finish_lanes") in reading and ("common", "row_of") not in reading
    imported = [(node.module, alias.name) for tree in trees.values() for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module for alias in node.names]
    assert ("common", "row_of") in imported and not [pair for pair in imported if pair in reading]


def test_no_shared_array_is_read_as_a_wider_dtype_than_it_is_declared() -> None:
    """numba declares a shared array aligned to its own dtype (``.shared .align 4`` for float32), and a kernel that
    reads it through a view of a wider dtype (float64) would fault on a GPU where the array lands on an address that
    is not a multiple of the wider size, which the simulator cannot see: the lane sums' blocks are declared float64
    and viewed as float32 (``kernels.cuda.sums.BLOCK_WORDS``), not the other way round.

    1. Every ``NAME = cuda.shared.array(SIZE, np.DTYPE)`` of the package's modules, and every ``NAME.view(np.DTYPE)``
       in the same function.
    2. No view is of a dtype wider than its array's.
    """
    import numpy as np

    package = Path(__file__).parents[2] / "compcoll" / "kernels" / "cuda"
    found = []
    for path in package.glob("*.py"):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef):
                continue
            declared = {node.targets[0].id: ast.unparse(node.value.args[1]) for node in ast.walk(function)
                        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                        and ast.unparse(node.value).startswith("cuda.shared.array(")}
            views = [(node.func.value.id, ast.unparse(node.args[0])) for node in ast.walk(function)
                     if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "view"
                     and isinstance(node.func.value, ast.Name) and node.func.value.id in declared]
            found += [(path.stem, function.name, name, declared[name], dtype) for name, dtype in views]

    def size(dtype: str) -> int:
        return np.dtype(getattr(np, dtype.split(".")[-1])).itemsize

    assert ("sums", "kernel", "block", "np.float64", "np.float32") in found
    assert not [view for view in found if size(view[4]) > size(view[3])], found
