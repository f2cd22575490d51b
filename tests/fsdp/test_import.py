"""``import compcoll.fsdp`` on a torch whose FSDP2 takes no custom reduce-scatter (before 2.9): a clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.versions import FSDP_COMPRESSES


@pytest.mark.skipif(FSDP_COMPRESSES, reason="this torch's FSDP2 takes a custom reduce-scatter")
def test_an_older_torch_gets_an_import_error_naming_both_versions() -> None:
    """The import fails at once, naming the torch it needs and the one it found, and the rest of compcoll runs."""
    code = ("import compcoll, compcoll.ddp, compcoll.optim\n"
            "try:\n    import compcoll.fsdp\nexcept ImportError as error:\n    print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "compcoll.fsdp needs torch 2.9 or newer" in done.stdout, done.stdout
    assert f"this is torch {torch.__version__}" in done.stdout, done.stdout
