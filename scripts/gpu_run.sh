#!/usr/bin/env bash
# The real-GPU run as one command on a lent GPU machine (its image has torch, numba-cuda, cupy): every CUDA kernel
# against the CPU kernels on the hardware, tests/gpu, bench/gpu_suite.py, then the rest of the suite until the deadline.
# Needs wheels for its Python in .whl/: mpich, mpi4py, and numpy<2.5 (numba-cuda 0.30.4 uses np.row_stack, gone in 2.5).
# Where a compute-sanitizer is found (the PATH, /usr/local, /opt, an nvidia wheel), its memcheck and racecheck run the
# kernel checks. Logs and figures go to $OUT.
# Usage: OUT=dir SECONDS_LEFT=450 bash scripts/gpu_run.sh [pytest args for the GPU tests] (the suite stops at
# SECONDS_LEFT and may take 30 s more to print its summary: give the device call that much beyond it)
# (it writes about ten files and the device tool returns eight: give it OUT=/tmp/g and tar /tmp/g into the tool's
# $OUT)
# (SUITE=0: skip the rest of the suite; SUITE_RUNS, SUITE_SIZES, SUITE_LAUNCHERS, SUITE_S: gpu_suite's runs per median,
# sizes, launchers and time limit; GRAPHS_S: bench/gpu_graphs.py's time limit; NCU_S, NCU_NUMEL: bench/gpu_ncu.py's
# time limit under Nsight Compute (0: skipped) and size)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu_run}
mkdir -p "$out"
deadline=$((SECONDS + ${SECONDS_LEFT:-450}))
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD COMPCOLL_GPU_DIFFS=$out/optim_diffs.txt
py=python3
left() { echo $((deadline - SECONDS > 10 ? deadline - SECONDS : 10)); }
{
    nvidia-smi -L
    $py -m pip install -q --no-index --no-deps .whl/*.whl
    $py -m pip install -q --no-index --no-deps --no-build-isolation -e .
    $py -c "import sys, torch, numba, numba.cuda, mpi4py; from mpi4py import MPI
print(sys.version.split()[0], 'torch', torch.__version__, 'numba', numba.__version__, 'mpi4py', mpi4py.__version__,
      MPI.Get_library_version().splitlines()[0], torch.cuda.get_device_name())"
    $py -m pip list 2>/dev/null | grep -i -E '^(numba|numba-cuda|cupy|cuda-core|cuda-bindings) '
    $py -m compcoll.warmup
} 2>&1 | tee "$out/env.txt"
echo "== CUDA kernels == CPU kernels, on the GPU (beside tests/gpu, 8 workers sharing the GPU, and compute-sanitizer)"
timeout "${GPU_TESTS_S:-200}" $py -m tests.kernels.cuda_sim_checks 1 37 1000 8200 100003 1048577 > "$out/kernels.log" 2>&1 &
find_tool() {  # the first executable $1 on the PATH, else under /usr/local and /opt (the image's CUDA and Nsight)
    (command -v "$1"; find /usr/local /opt -maxdepth 4 -name "$1" -type f -perm -u+x) 2>/dev/null | head -1
}
sanitizer=$(find_tool compute-sanitizer)
[ -n "$sanitizer" ] || sanitizer=$($py -c "import nvidia, pathlib
print(next((p for d in nvidia.__path__ for p in sorted(pathlib.Path(d).glob('cu*/bin/compute-sanitizer'))), ''))" \
    2>/dev/null)
sanitize() {  # every kernel on short lengths: memcheck (out-of-bounds and misaligned accesses), racecheck (shared memory)
    [ -n "$sanitizer" ] || { echo "no compute-sanitizer (none on the PATH, under /usr/local or /opt, or in a wheel)"
        return; }
    echo "compute-sanitizer: $sanitizer"
    for tool in memcheck racecheck; do
        echo "== $tool"
        timeout $((${GPU_TESTS_S:-200} / 2)) "$sanitizer" --tool "$tool" --error-exitcode 3 --print-limit 10 \
            $py -m tests.kernels.cuda_sim_checks 37 8200 2>&1 | tail -15
        echo "$tool: rc ${PIPESTATUS[0]}"
    done
}
sanitize > "$out/sanitizer.log" 2>&1 &
timeout "${GPU_TESTS_S:-200}" $py -m pytest -q -ra -p xdist -n 8 tests/gpu "$@" 2>&1 | tee "$out/tests_gpu.log" | tail -25
wait
tail -3 "$out/kernels.log"
grep -E "^(== |memcheck|racecheck|no compute)|ERROR SUMMARY" "$out/sanitizer.log"
echo "== bench/gpu_suite.py"
timeout "${SUITE_S:-200}" $py bench/gpu_suite.py --runs "${SUITE_RUNS:-20}" ${SUITE_SIZES:+--sizes "$SUITE_SIZES"} \
    ${SUITE_LAUNCHERS:+--launchers "$SUITE_LAUNCHERS"} \
    --out "$out/gpu_kernels" 2>&1 | tail -12
echo "== bench/gpu_graphs.py: the hook's default call, its device part replayed from a CUDA graph; NCCL's rounds on"
echo "   the device and on host numbers side by side"
timeout "${GRAPHS_S:-60}" $py bench/gpu_graphs.py --calls 50 --runs 5 --sizes 4096,1048576,16777216 \
    --out "$out/gpu_graphs" 2>&1 | tail -10
echo "== scripts/cuda_launches.py: the same counts on meta tensors (tests/gpu checks that they are equal), and the meta"
echo "   proxy's host time on this machine's CPU, to set beside gpu_suite's host time of the same calls"
$py scripts/cuda_launches.py --numel 4096 --time 2>&1 | tee "$out/cuda_launches.txt"
echo "== bench/gpu_host_profile.py: where one call's host time goes, over SingleComm and a one-rank NCCL group (its"
echo "   rounds on the device, and on host numbers), and every protocol's host time over each"
timeout 120 $py bench/gpu_host_profile.py --out "$out/gpu_host_profile" 2>&1 | tail -3
ncu=$(find_tool ncu)
if [ -n "$ncu" ] && [ "${NCU_S:-90}" != 0 ]; then
    echo "== bench/gpu_ncu.py under $ncu: every kernel of gpu_suite at ${NCU_NUMEL:-67108864} elements"
    timeout "${NCU_S:-90}" "$ncu" --clock-control none --profile-from-start off --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats --csv --page details \
        $py bench/gpu_ncu.py --numel "${NCU_NUMEL:-67108864}" --names "$out/ncu_names.json" \
        > "$out/ncu.csv" 2> "$out/ncu.log"
    echo "ncu: rc $?"
    $py bench/gpu_ncu.py --summary "$out/ncu.csv" --names "$out/ncu_names.json" 2>&1 | tee "$out/ncu_summary.txt"
else
    echo "no ncu (none on the PATH, under /usr/local or /opt), or NCU_S=0"
fi
[ "${SUITE:-1}" = 0 ] && exit 0
echo "== the rest of the suite, $(left) s left"
# SIGINT at the deadline: pytest stops as on Ctrl-C and still prints its failures and summary (a plain TERM left the
# run of 2026-12-04 without a traceback)
timeout -s INT -k 30 "$(left)" $py -m pytest -ra -p xdist -n 12 -v --tb=short --ignore=tests/gpu 2>&1 |
    tee "$out/suite.log" | grep -E "FAILED|ERROR|passed|failed"
