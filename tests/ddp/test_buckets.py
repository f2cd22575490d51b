"""compcoll.ddp.buckets: the futures the hooks hand DDP complete with the parts' result, or with their error."""

from __future__ import annotations

import pytest
import torch

from compcoll.ddp.buckets import gather
from compcoll.errors import CollectiveTimeout


def test_a_gathered_bucket_completes_once_every_part_has() -> None:
    buffer = torch.randn(7)
    parts = [torch.futures.Future(), torch.futures.Future()]
    gathered = gather(parts, buffer)
    parts[1].set_result(buffer[3:])
    assert not gathered.done()
    parts[0].set_result(buffer[:3])
    assert gathered.wait() is buffer


def test_a_part_that_failed_fails_the_gathered_bucket() -> None:
    """A part's error (its call timed out) reaches DDP's wait: the bucket, one part unaveraged, is not a result."""
    buffer = torch.randn(7)
    parts = [torch.futures.Future(), torch.futures.Future()]
    gathered = gather(parts, buffer)
    parts[0].set_result(buffer[:3])
    parts[1].set_exception(CollectiveTimeout("part 1's call timed out"))
    with pytest.raises(CollectiveTimeout, match="part 1's call timed out"):
        gathered.wait()
