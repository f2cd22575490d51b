"""python -m compcoll.warmup compiles every kernel specialisation a job's first calls need, into Numba's cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests import background

_FIRST_CALLS = """
import json
import torch
from numba.core.registry import CPUDispatcher
import compcoll
from compcoll.ddp.onebit import BLOCK_SIZE
from compcoll.kernels import cpu
from compcoll.launcher import run_threads
from compcoll.warmup import warm

def specialisations():
    kernels = {name: d for name, d in vars(cpu).items() if isinstance(d, CPUDispatcher)}
    kernels.update({"serial " + name: d for name, d in cpu.SERIAL.items()})
    return {name: {str(signature) for signature in d.signatures} for name, d in kernels.items()}, kernels

def first_calls(comm):
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for block_size in (None, BLOCK_SIZE):
            full = compcoll.padded_numel(1001, comm.size)
            compcoll.compressed_allreduce(torch.ones(1001, dtype=dtype), torch.zeros(full),
                                          torch.zeros(full // comm.size), comm, block_size=block_size)

warm()
warmed, kernels = specialisations()
first_calls(compcoll.SingleComm())
run_threads(first_calls, 2)
after, _ = specialisations()
print(json.dumps({"new": {name: sorted(after[name] - warmed[name]) for name in after if after[name] - warmed[name]},
                  "hits": sum(sum(d.stats.cache_hits.values()) for d in kernels.values()),
                  "misses": sum(sum(d.stats.cache_misses.values()) for d in kernels.values())}))
"""


def warmup_then_first_calls(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """One process: ``compcoll.warmup.warm``, loading the session's cache, then a job's first calls."""
    return [[sys.executable, "-c", _FIRST_CALLS]], {}


@background.job(warmup_then_first_calls)
def test_warmup_compiles_what_first_calls_need_and_loads_it_from_the_cache() -> None:
    """The warm-up into an empty cache itself runs in ``scripts/setup.sh`` and ``.ci/run`` before the tests, which stop
    if it fails; here, in the cache the session fixture warmed:
    1. ``warm()`` loads each specialisation from the cache (hits, no misses);
    2. the first calls of a job (1 rank, and 2 ranks whose wire rows are strided views; each input dtype; one scale
       and block scales) then need no specialisation ``warm()`` had not made: none compiled, none loaded."""
    [done] = background.results(warmup_then_first_calls, timeout=300).outcomes
    assert done.returncode == 0, done.output + done.errors
    found = json.loads(done.output.splitlines()[-1])
    assert found["new"] == {}, found["new"]
    assert found["hits"] > 0 and found["misses"] == 0, found
