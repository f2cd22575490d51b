"""The README's and the docs' Python blocks run as written, each in the context it assumes (``tests/docs_snippets.py``).

They run together in one child process over a 1-rank Gloo group (about 7 s); a block that names an API compcoll no
longer has, or leaves out an import, fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.docs_snippets import CONTEXTS, ROOT, blocks, first_line

BLOCKS = blocks()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, str]:
    """Every block's outcome, from one run of ``tests.docs_snippets``."""
    out = tmp_path_factory.mktemp("docs") / "outcomes.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "tests.docs_snippets", str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("block", list(BLOCKS))
def test_the_block_runs_as_written(block: str, outcomes: dict[str, str]) -> None:
    outcome = outcomes[block]
    if outcome.startswith("skipped: "):
        pytest.skip(outcome.removeprefix("skipped: "))
    assert outcome == "ok", f"{block}\n{outcome}"


def test_every_context_is_of_a_block() -> None:
    """A context whose block changed its first line or left the docs would check nothing."""
    named = set(BLOCKS) | {first_line(b) for b in BLOCKS}
    assert not set(CONTEXTS) - named, sorted(set(CONTEXTS) - named)
