"""complete_future: a future completed with an error raises a fresh copy of it from each wait.

Or torch's own set_exception where torch lacks the private hook the copies need.
"""

from __future__ import annotations

import pytest
import torch

from compcoll.comm.work import complete_future
from compcoll.errors import CollectiveTimeout, NonFiniteError, RemoteError


@pytest.mark.parametrize("error, kept", [
    (CollectiveTimeout("rank 2 never came", absent=[2]), {"absent": [2]}),
    (RemoteError("rank 1 refused", {1: "bad length"}), {"failures": {1: "bad length"}}),
    (NonFiniteError("NaN on rank 0"), {}),
    (ConnectionResetError(104, "Connection reset by peer"), {"errno": 104, "strerror": "Connection reset by peer"}),
], ids=["CollectiveTimeout", "RemoteError", "NonFiniteError", "ConnectionResetError"])
def test_each_wait_raises_a_fresh_copy_with_the_errors_attributes(error: BaseException, kept: dict) -> None:
    """Each wait raises a new copy, of the error's type, message and attributes. A CollectiveTimeout (RuntimeError
    and TimeoutError, laid out as OSError) was raised as the stored object itself until 2026-12-02, which kept
    every frame it passed through."""
    future: torch.futures.Future = torch.futures.Future()
    complete_future(future, None, error)
    raised = []
    for wait in (future.wait, future.value, future.wait):
        with pytest.raises(type(error)) as caught:
            wait()
        raised.append(caught.value)
    for copy in raised:
        assert copy is not error and type(copy) is type(error) and copy.args == error.args
        assert {name: getattr(copy, name) for name in kept} == kept
    assert len({id(copy) for copy in raised}) == 3, "two waits raised the same object"


class _WithoutUnwrap(torch.futures.Future):
    """A future of a torch that has no ``_set_unwrap_func``."""

    _set_unwrap_func = None


def test_a_torch_without_the_unwrap_hook_gets_set_exception_not_a_pending_future() -> None:
    error = CollectiveTimeout("rank 1 never came")
    future = _WithoutUnwrap()
    complete_future(future, None, error)
    assert future.done(), "the future was left pending: its waiters would hang"
    with pytest.raises(CollectiveTimeout, match="rank 1 never came"):
        future.wait()
