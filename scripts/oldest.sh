#!/usr/bin/env bash
# The oldest stack pyproject.toml admits (requirements-oldest.txt: Python 3.10, torch 2.6, numpy 1.26, numba 0.59)
# in .venv-oldest, and the tests of what an older torch changes under it: the communicators, the collectives, the
# DDP hooks, the optimizers, checkpoints, torch.compile, and compcoll.fsdp's refusal (it needs torch 2.9).
# The Python is $PYTHON, else python3.10 on the PATH or pyenv's 3.10 (a newer one, said, where there is none).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-}
if [ -z "$python" ] && python3.10 --version >/dev/null 2>&1; then
    python=python3.10
fi
if [ -z "$python" ]; then
    versions="$(pyenv root 2>/dev/null || echo ~/.pyenv)/versions"
    python=$(ls -d "$versions"/3.10.*/bin/python3.10 2>/dev/null | tail -1 || true)
fi
if [ -z "$python" ]; then
    python=python3
    echo "oldest: no Python 3.10 here; the oldest torch, numpy and numba under $($python --version)"
fi
[ -x .venv-oldest/bin/python ] || "$python" -m venv .venv-oldest
.venv-oldest/bin/python -m pip install -q --no-cache-dir -r requirements-oldest.txt
.venv-oldest/bin/python -m pip install -q --no-deps -e .
.venv-oldest/bin/python -c 'import sys, torch, numpy, numba; print("oldest: Python", sys.version.split()[0],
    "torch", torch.__version__, "numpy", numpy.__version__, "numba", numba.__version__)'
.venv-oldest/bin/python -m compcoll.warmup
# each case on ranks of its own: under torch 2.6 a pooled Gloo rank now and then stays in the destructor of a case's
# process group (tests/README.md, "Versions")
export COMPCOLL_TEST_POOL=${COMPCOLL_TEST_POOL:-0}
.venv-oldest/bin/python -m pytest -p no:cacheprovider "$@" tests/comm tests/ddp tests/optim tests/fsdp \
    tests/algorithms/test_onebit.py tests/test_checkpoint.py tests/test_eager.py tests/codecs
