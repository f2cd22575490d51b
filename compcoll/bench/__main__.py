"""Entry point of ``python -m compcoll.bench``."""

from .cli import main

main()
