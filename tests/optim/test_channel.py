"""ErrorFeedbackChannel's choice of algorithm over real ranks."""

from __future__ import annotations

import pytest

from compcoll.launcher import BACKENDS, run


@pytest.mark.parametrize("backend", BACKENDS)
def test_layout_disagreement_raises_on_every_rank(backend: str) -> None:
    run("tests.optim.channel_workers:layout_disagreement", 2, backend)
