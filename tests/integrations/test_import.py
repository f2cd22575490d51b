"""``import compcoll.integrations.huggingface`` without transformers: an error naming the extra to install."""

from __future__ import annotations

import subprocess
import sys


def test_without_transformers_the_error_says_how_to_install_it() -> None:
    """The import fails at once with a ModuleNotFoundError for transformers that names ``compcoll[hf]``, and the rest
    of compcoll runs (runs where transformers is installed too: it is hidden from the child process)."""
    code = ("import sys\n"
            "sys.modules['transformers'] = None\n"
            "import compcoll, compcoll.ddp, compcoll.optim\n"
            "try:\n    import compcoll.integrations.huggingface\n"
            "except ModuleNotFoundError as error:\n    print(error.name, '|', error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("transformers | compcoll.integrations.huggingface needs transformers"), done.stdout
    assert "pip install 'compcoll[hf]'" in done.stdout, done.stdout
