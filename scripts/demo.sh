#!/usr/bin/env bash
# Set up, then show compressed vs plain allreduce on 4 local MPI ranks (accuracy, bytes, time), and end with the
# performance model's verdict for real networks, from the kernel rates this machine measures.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== examples/direct_allreduce.py on 4 MPI ranks: accuracy and bytes per step"
.venv/bin/mpiexec -n 4 .venv/bin/python examples/direct_allreduce.py
echo
echo "== python -m compcoll.bench on 4 local MPI ranks: time and bytes, plain vs 1-bit"
.venv/bin/python -m compcoll.bench --launch 4 --backend mpi -b 64K -e 16M
echo
echo "== the verdict: local ranks share memory, no slow link; on a network, the model predicts"
.venv/bin/python -m compcoll.bench model --verdict
