"""mkdocs hooks: the benchmarks' PNGs on the site, and a warning (--strict: a failure) for each undocumented API."""

from __future__ import annotations

import importlib
import inspect
import logging
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REFERENCED = ("compcoll", "compcoll.comm", "compcoll.ddp", "compcoll.fsdp", "compcoll.optim", "compcoll.checkpoint",
              "compcoll.integrations.huggingface", "compcoll.launcher", "compcoll.bench.model")
"""The modules docs/reference.md renders; every public name in them needs a docstring."""

log = logging.getLogger("mkdocs.plugins.compcoll")


def on_files(files: Files, config) -> Files:
    """Add every PNG under bench/results as results/<path> (the benchmarks write them there; nothing is copied into
    docs/)."""
    for png in sorted(RESULTS.rglob("*.png")):
        files.append(File.generated(config, f"results/{png.relative_to(RESULTS).as_posix()}", abs_src_path=str(png)))
    return files


def undocumented(module_name: str) -> list[str]:
    """Public names of ``module_name`` (its ``__all__``, else what it defines) and their public methods and
    properties with no docstring, their own or inherited (``inspect.getdoc``)."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [
        n for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module_name
        and (inspect.isclass(v) or inspect.isfunction(v))]
    missing = [] if inspect.getdoc(module) else [module_name]
    for name in names:
        obj = getattr(module, name)
        if not inspect.getdoc(obj):
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if not attr.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)) \
                        and not inspect.getdoc(getattr(obj, attr)):
                    missing.append(f"{module_name}.{name}.{attr}")
    return missing


def on_pre_build(config) -> None:
    """Warn for every undocumented public name of the referenced modules (``mkdocs build --strict`` then fails)."""
    for module_name in REFERENCED:
        for path in undocumented(module_name):
            log.warning(f"no docstring: {path}")
