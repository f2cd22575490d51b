"""Tests of ``compcoll.bench`` and of the benchmark scripts in ``bench/``, which load as modules by path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def bench_script(path: str, name: str | None = None) -> ModuleType:
    """The script ``bench/<path>`` as a module (named ``name``, default its file's stem): the scripts are not a
    package, so tests load them by path."""
    file = ROOT / "bench" / path
    spec = importlib.util.spec_from_file_location(name or file.stem, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
