"""comm.base: a communicator's timeout is a finite number of seconds above 0, given or from COMPCOLL_TIMEOUT."""

from __future__ import annotations

import math

import pytest

from compcoll.comm import SingleComm, default_timeout, local_world


@pytest.mark.parametrize("timeout", [0, -1.0, math.inf, math.nan, "30", True])
def test_a_timeout_that_is_not_seconds_above_zero_is_refused(timeout) -> None:
    """Before: 0 or -1 made every call time out, inf overflowed timedelta inside a wait, "30" failed in float()."""
    with pytest.raises(ValueError, match=f"timeout must be a finite number of seconds above 0, got {timeout!r}"):
        SingleComm(timeout=timeout)
    with pytest.raises(ValueError, match="timeout must be a finite number of seconds above 0"):
        local_world(2, timeout)


def test_the_timeout_is_given_or_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SingleComm(timeout=2).timeout == 2.0
    monkeypatch.delenv("COMPCOLL_TIMEOUT", raising=False)
    assert default_timeout() == 300.0 and SingleComm().timeout == 300.0
    monkeypatch.setenv("COMPCOLL_TIMEOUT", "12.5")
    assert SingleComm().timeout == 12.5
    for text in ("abc", "0", "-3", "inf"):
        monkeypatch.setenv("COMPCOLL_TIMEOUT", text)
        with pytest.raises(ValueError, match=f"COMPCOLL_TIMEOUT must be a finite number of seconds above 0, got "
                                             f"'{text}'"):
            SingleComm()
