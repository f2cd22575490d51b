"""compcoll.ddp.one_model: a hook state refuses a second DDP model's buckets, and follows one model's changes."""

from __future__ import annotations

import pytest
import torch

from compcoll.ddp.one_model import OneModel


def params(count: int) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.randn(3)) for _ in range(count)]


def iterations(watch: OneModel, *buckets_per_iteration: list[list[torch.Tensor]]) -> None:
    """Run ``watch`` over iterations, each a list of buckets (indices 0, 1, ...), each a list of parameters."""
    for buckets in buckets_per_iteration:
        for index, bucket in enumerate(buckets):
            watch.check(index, bucket)
        watch.end_iteration()


def test_one_model_passes_however_often() -> None:
    a = params(4)
    iterations(OneModel("S"), *[[a[:2], a[2:]]] * 5)


def test_two_models_in_turn_fail_at_the_first_one_back() -> None:
    """A GAN's discriminator and generator step in turn: the third iteration, back on the first model, fails."""
    a, b = params(2), params(3)
    watch = OneModel("OneBitState")
    iterations(watch, [a], [b])
    with pytest.raises(ValueError, match="bucket 0 holds parameters of the iteration before last.*give each DDP "
                                         "model its own OneBitState"):
        watch.check(0, a)


def test_a_bucket_index_twice_in_one_iteration_fails() -> None:
    """Two models' buckets interleaved in one backward: an index comes again before the iteration's last bucket."""
    a, b = params(2), params(2)
    watch = OneModel("S")
    watch.check(0, a)
    with pytest.raises(ValueError, match="bucket 0 came twice in one iteration"):
        watch.check(0, b)


def test_a_changed_or_replaced_model_passes() -> None:
    """A new DDP over the model with a layer frozen for one iteration and unfrozen again (a bucket of that layer
    alone), then a new model that replaces it while the old one stays alive."""
    model, layer, other = params(4), params(1), params(4)
    iterations(OneModel("S"), [model, layer], [model], [layer, model], [other], [other], [other])
