"""Every compcoll name the docs, README, examples, benchmarks and compcoll's messages give exists, with its keywords.

A dotted name (``compcoll.comm.MPIComm``) must import and resolve; a call written with keywords
(``compcoll.MPIComm(cuda_aware=True)``, or a public class by its short name, ``OneBitState(start_iter=...)``) must
pass only keywords its callable takes. DeepSpeed's ``cuda_aware`` note named ``MPIComm(device=...)``, which never
existed, until 2026-12-04.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLIC = ("compcoll", "compcoll.comm", "compcoll.ddp", "compcoll.optim", "compcoll.fsdp", "compcoll.checkpoint",
          "compcoll.algorithms")
"""The modules whose public classes the text may name by their short names."""
DOTTED = re.compile(r"(?<![\w.])compcoll(?:\.[A-Za-z_]\w*)+(?:\([^()]*\))?")
KEYWORD = re.compile(r"(?:^|,)\s*([A-Za-z_]\w*)\s*=(?!=)")


def _texts() -> dict[str, str]:
    """The text of each file that names compcoll's API: the docs, the README, the examples, the package, the
    benchmarks and scripts."""
    files = [*ROOT.glob("docs/**/*.md"), ROOT / "README.md", *ROOT.glob("examples/*.py"),
             *ROOT.glob("compcoll/**/*.py"), *ROOT.glob("bench/**/*.py"), *ROOT.glob("scripts/*.py")]
    return {str(f.relative_to(ROOT)): f.read_text() for f in files}


def _resolve(dotted: str) -> object:
    """The object ``dotted`` names: its longest importable module prefix, then attributes; None where that module
    needs an optional package this environment lacks (transformers for ``compcoll.integrations.huggingface``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as missing:
            if missing.name and not missing.name.startswith("compcoll"):
                return None
            continue
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ImportError(dotted)


def _unknown_keywords(target: object, arguments: str) -> list[str]:
    """The keywords in ``arguments`` (a call's text between its parentheses) that ``target`` does not take."""
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return []
    return [k for k in KEYWORD.findall(arguments) if k not in parameters]


def problems(texts: dict[str, str]) -> list[str]:
    """What in ``texts`` (name -> text) names a compcoll object that does not exist, or a keyword it does not take.

    1. Every dotted ``compcoll.`` name resolves (a file path, ``compcoll.x.py``, is not a name).
    2. Every call written after one, and every call of a public class by its short name (``PUBLIC``'s), passes
       only keywords the callable takes.
    """
    classes = {name: value for module in PUBLIC for name, value in vars(importlib.import_module(module)).items()
               if inspect.isclass(value) and not name.startswith("_")}
    short = re.compile(r"(?<![\w.])(" + "|".join(sorted(classes, key=len, reverse=True)) + r")\(([^()]*)\)")
    found = []
    for where, text in texts.items():
        for match in DOTTED.finditer(text):
            written = match.group(0)
            dotted = written.split("(")[0]
            if dotted.endswith((".py", ".md", ".txt")):
                continue
            try:
                target = _resolve(dotted)
            except (ImportError, AttributeError) as error:
                found.append(f"{where}: {dotted} does not exist ({error})")
                continue
            if target is not None and "(" in written:
                found += [f"{where}: {dotted} takes no keyword {k}" for k in
                          _unknown_keywords(target, written[written.index("(") + 1:-1])]
        for match in short.finditer(text):
            found += [f"{where}: {match.group(1)} takes no keyword {k}" for k in
                      _unknown_keywords(classes[match.group(1)], match.group(2))]
    return found


def test_every_name_and_keyword_the_text_gives_exists() -> None:
    assert problems(_texts()) == []


def test_a_name_or_keyword_that_does_not_exist_is_found() -> None:
    assert problems({"note": "through CUDA-aware MPI (compcoll.comm.MPIComm(device=...))"}) == [
        "note: compcoll.comm.MPIComm takes no keyword device"]
    assert problems({"note": "`OneBitState(start_iter=10, warmup=3)`, `compcoll.ddp.onebit_hok`"})[0] == (
        "note: compcoll.ddp.onebit_hok does not exist (module 'compcoll.ddp' has no attribute 'onebit_hok')")
    assert problems({"note": "`OneBitState(start_iter=10, warmup=3)`"}) == ["note: OneBitState takes no keyword warmup"]
