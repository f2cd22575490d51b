"""``import compcoll.integrations.huggingface`` without transformers: an error naming the extra to install."""

from __future__ import annotations

from tests.hidden import run_without


def test_without_transformers_the_error_says_how_to_install_it() -> None:
    """The import fails at once with a ModuleNotFoundError for transformers that names ``compcoll[hf]``, and the rest
    of compcoll runs (runs where transformers is installed too: it is hidden from the child process)."""
    out = run_without("transformers", "import compcoll, compcoll.ddp, compcoll.optim\n"
                                      "try:\n    import compcoll.integrations.huggingface\n"
                                      "except ModuleNotFoundError as error:\n    print(error.name, '|', error)\n")
    assert out.startswith("transformers | compcoll.integrations.huggingface needs transformers"), out
    assert "pip install 'compcoll[hf]'" in out, out
