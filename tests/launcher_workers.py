"""Rank-side bodies of the tests of compcoll.launcher."""

from __future__ import annotations

import os

import compcoll


def placed(comm: compcoll.Communicator) -> None:
    """Rank r runs behind its own prefix and with its own environment."""
    assert os.environ["PREFIXED"] == str(comm.rank), os.environ.get("PREFIXED")
    assert os.environ["PLACED"] == str(comm.rank), os.environ.get("PLACED")
