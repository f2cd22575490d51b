"""The tree's Python keeps the project's style: pycodestyle, pyflakes, one-line module summaries, type hints."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("compcoll", "tests", "bench", "scripts", "examples")
"""The folders whose Python files are checked: everything the repository ships but its virtual environments."""
MAX_LINE_LENGTH = 120


def python_files() -> list[str]:
    """Every ``.py`` file under ``CHECKED``, sorted."""
    return sorted(str(path) for folder in CHECKED for path in (ROOT / folder).rglob("*.py"))


def test_pycodestyle_finds_nothing() -> None:
    """1. Run pycodestyle's default checks at ``MAX_LINE_LENGTH`` over every file.
    2. Collect each finding as "path:line:column: code text" and expect none."""
    pycodestyle = pytest.importorskip("pycodestyle")
    found: list[str] = []

    class Collected(pycodestyle.BaseReport):
        def error(self, line_number: int, offset: int, text: str, check) -> str | None:
            code = super().error(line_number, offset, text, check)
            if code:
                found.append(f"{Path(self.filename).relative_to(ROOT)}:{line_number}:{offset + 1}: {text}")
            return code

    guide = pycodestyle.StyleGuide(max_line_length=MAX_LINE_LENGTH, reporter=Collected, quiet=True)
    guide.check_files(python_files())
    assert not found, f"{len(found)} finding(s):\n" + "\n".join(found)


def test_pyflakes_finds_nothing() -> None:
    """1. Run pyflakes over every file.
    2. Collect its warnings and syntax errors, and expect none."""
    pytest.importorskip("pyflakes")
    from pyflakes.api import checkPath
    from pyflakes.reporter import Reporter

    class Lines:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def write(self, text: str) -> None:
            self.lines.extend(line for line in text.splitlines() if line)

    out = Lines()
    count = sum(checkPath(path, Reporter(out, out)) for path in python_files())
    assert not count and not out.lines, f"{count} finding(s):\n" + "\n".join(out.lines)


def test_every_module_opens_with_a_one_line_summary() -> None:
    """1. Read each non-empty file's module docstring.
    2. Expect one, whose first line is the whole summary: the docstring ends there, or a blank line follows it."""
    found = []
    for path in python_files():
        text = Path(path).read_text()
        if not text.strip():
            continue
        docstring = ast.get_docstring(ast.parse(text), clean=False)
        lines = (docstring or "").split("\n")
        if not lines[0].strip() or (len(lines) > 1 and lines[1].strip()):
            found.append(f"{Path(path).relative_to(ROOT)}: {lines[0][:60]!r}")
    assert not found, f"{len(found)} module(s) without a one-line summary:\n" + "\n".join(found)


def test_the_library_annotates_every_function() -> None:
    """1. Walk every function of ``compcoll`` outside ``compcoll/kernels`` (whose kernels Numba compiles, typed by
       their calls), nested ones included (a lambda takes no annotations).
    2. Expect an annotation on each parameter but ``self`` and ``cls``, and on the return."""
    found = []
    for path in python_files():
        relative = Path(path).relative_to(ROOT)
        if relative.parts[0] != "compcoll" or relative.parts[1] == "kernels":
            continue
        for node in ast.walk(ast.parse(Path(path).read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            arguments = node.args
            named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            bare = [a.arg for a in named if a is not None and a.annotation is None and a.arg not in ("self", "cls")]
            if bare or node.returns is None:
                missing = bare + ["return"] * (node.returns is None)
                found.append(f"{relative}:{node.lineno} {node.name}: " + ", ".join(missing))
    assert not found, f"{len(found)} function(s) not annotated:\n" + "\n".join(found)
