"""Run Python code in a child process that cannot import one module, as where that package is not installed."""

from __future__ import annotations

import subprocess
import sys


def run_without(module: str, code: str) -> str:
    """``code`` run by this interpreter in a child process whose ``import module`` fails (``sys.modules[module]`` is
    None, so it does wherever the module is installed); its output. Asserts that the child exited with 0."""
    done = subprocess.run([sys.executable, "-c", f"import sys\nsys.modules[{module!r}] = None\n{code}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout
