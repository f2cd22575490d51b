#!/usr/bin/env bash
# Create .venv beside this repo, install compcoll with the pinned stack and the MPI wheel, and compile its kernels
# (COMPCOLL_SETUP_WARMUP=0 leaves that to the caller: .ci/run compiles them while it installs its extras).
# A torch already in .venv (a CPU or CUDA build you installed there first) is kept; otherwise torch==2.13.0 is
# installed from whatever index pip uses (see docs/guides/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
if .venv/bin/python -c "import torch" 2>/dev/null; then
    echo "setup: keeping torch $(.venv/bin/python -c 'import torch; print(torch.__version__)') already in .venv"
    grep -v '^torch==' requirements-ci.txt > .venv/requirements-but-torch.txt
    .venv/bin/python -m pip install -q -r .venv/requirements-but-torch.txt
else
    .venv/bin/python -m pip install -q -r requirements-ci.txt
fi
.venv/bin/python -m pip install -q --no-deps -e .
[ "${COMPCOLL_SETUP_WARMUP:-1}" = 0 ] || .venv/bin/python -m compcoll.warmup
