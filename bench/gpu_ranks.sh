#!/usr/bin/env bash
# MPI ranks on the GPU machine, in one command: what MPI is there, whether NCCL takes two ranks
# on one GPU, and the two-rank training checks.
#
#   bash bench/gpu_ranks.sh [--quick]      (on the device machine, from the repository root)
#
# 1. tokenkit installed from this checkout (no dependencies, no build isolation);
# 2. MPI: `which mpirun mpiexec`, mpi4py's MPI library, and whether `mpirun -n 2` gives ranks that
#    see each other (COMM_WORLD of size 2 in both). When not, and .whl/ holds the MPICH wheel
#    (carried from the machine that prepared this checkout), it is installed under /tmp/mpich and
#    put first on PATH, with mpi4py pointed at its libmpi (MPI4PY_LIBMPI), and probed again; if
#    the image's mpi4py still cannot use it, the carried mpi4py wheel replaces it, and a last probe;
# 3. NCCL: two ranks on GPU (local rank % GPUs) make a cupy.cuda.nccl communicator and allreduce
#    four floats; each rank prints OK or its error line (recent NCCLs refuse two ranks on one GPU:
#    NCCL_ERROR_INVALID_USAGE on an H200 with CuPy 14.2);
# 4. tests/test_gpu_ranks.py: 2 and 3 ranks against one process computing the same shards in turn,
#    bit for bit; `tk train-model --device cuda` on 2 ranks, stopped and resumed;
# 5. bench/gpu_ranks.py: ms/step and tokens/s of one process (batch whole, and its shards in turn)
#    and of 2 ranks; whether the ranks ended with the bits of the one process (--quick: shape m only).
# Every step runs under `timeout` and a failing one does not stop the next. Each step's full log
# goes under $OUT (what the device tool brings back; build/gpu-ranks/ elsewhere); the last lines
# printed are one short table.
set -uo pipefail
quick=""
[[ "${1:-}" == "--quick" ]] && quick="yes"
out="${OUT:-build/gpu-ranks}"
mkdir -p "$out"
py="${PY:-python3}"  # the device image's python3 holds CuPy, mpi4py and pytest
summary="$out/summary.txt"
: > "$summary"
row() { printf '%-22s %s\n' "$1" "$2" >> "$summary"; }
last() { grep -v '^\s*$' "$1" 2>/dev/null | tail -1 | cut -c1-150; }
# Open MPI refuses root without these and may want more slots than cores; MPICH ignores them
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # no ptrace between containers' processes

# 1. tokenkit
# (an older setuptools there may not read pyproject's license field: then a wheel built here and
# carried in build/gpu-wheel/, as bench/gpu_session.sh does)
if ! timeout 120 $py -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.txt" 2>&1; then
    timeout 60 $py -m pip install -q --no-deps build/gpu-wheel/*.whl >> "$out/install.txt" 2>&1
fi
row install "$(cd /tmp && $py -c 'import tokenkit.transformer as t; print("tokenkit from", t.__file__)' 2>&1 | tail -1)"

# 2. MPI
probe_mpi() {  # $1: label; writes $out/mpi-$1.txt; status 0 when 2 ranks see each other
    local log="$out/mpi-$1.txt"
    {
        echo "which: $(which mpirun mpiexec 2>/dev/null | tr '\n' ' ')"
        timeout 30 $py -c "
try:
    from mpi4py import MPI
    print('library:', MPI.Get_library_version().splitlines()[0])
except Exception as err:
    print('library: none:', type(err).__name__, str(err).strip().splitlines()[-1][:80])
" 2>&1
        local launcher
        launcher="$(command -v mpirun || command -v mpiexec)"
        if [[ -n "$launcher" ]]; then
            echo "launcher: $launcher ($(timeout 10 "$launcher" --version 2>&1 | grep -v '^\s*$' | head -1))"
            timeout 30 "$launcher" -n 2 $py -c "from mpi4py import MPI; print('size', MPI.COMM_WORLD.Get_size())" 2>&1
        fi
    } > "$log" 2>&1
    [[ "$(grep -c '^size 2$' "$log")" == 2 ]]
}
mpi_from="the image's"
if ! probe_mpi image; then
    wheel="$(ls .whl/mpich-*.whl 2>/dev/null | head -1)"
    if [[ -n "$wheel" ]]; then
        # --prefix, not --target: --target drops the wheel's lib/ (libmpi.so.12)
        timeout 60 $py -m pip install -q --no-index --no-deps --ignore-installed --prefix /tmp/mpich "$wheel" \
            > "$out/mpich-install.txt" 2>&1
        export PATH="/tmp/mpich/bin:$PATH" LD_LIBRARY_PATH="/tmp/mpich/lib:${LD_LIBRARY_PATH:-}"
        export MPI4PY_LIBMPI=/tmp/mpich/lib/libmpi.so.12
        mpi_from="carried $(basename "$wheel")"
        if ! probe_mpi carried && ls .whl/mpi4py-*.whl > /dev/null 2>&1; then
            # an mpi4py built for another MPI: the carried one (PyPI's, which takes MPICH's libmpi)
            # replaces it on this bare machine; its tests' subprocesses set PYTHONPATH themselves
            for extra in "" "--break-system-packages"; do
                timeout 60 $py -m pip install -q --no-index --no-deps --ignore-installed --find-links .whl $extra \
                    mpi4py >> "$out/mpich-install.txt" 2>&1 && break
            done
            mpi_from="carried $(basename "$wheel") and mpi4py"
            probe_mpi carried-mpi4py
        fi
    fi
fi
mpi_log="$(ls -t "$out"/mpi-*.txt | head -1)"
mpi_ok="no"; [[ "$(grep -c '^size 2$' "$mpi_log")" == 2 ]] && mpi_ok="yes"
grep -h -E '^(which|library|launcher):' "$out/mpi-image.txt" | cut -c1-110 | while IFS= read -r line; do row "mpi (image)" "$line"; done
row "mpi used" "$mpi_from; 2 ranks see each other: $mpi_ok"
if command -v mpiexec > /dev/null && ! command -v mpirun > /dev/null; then  # the tests call mpirun
    mkdir -p /tmp/mpirun-shim && ln -sf "$(command -v mpiexec)" /tmp/mpirun-shim/mpirun
    export PATH="/tmp/mpirun-shim:$PATH"
fi

# 3. NCCL: two ranks, each on GPU (local rank % GPUs)
cat > "$out/nccl_probe.py" << 'EOF'
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
try:
    import cupy
    from cupy.cuda import nccl

    if getattr(nccl, "available", True) is False:
        raise RuntimeError("CuPy has no NCCL (cupy.cuda.nccl.available is False)")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    gpu = node.Get_rank() % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(gpu).use()
    mine = nccl.get_unique_id()  # bytes in CuPy 14, a tuple of signed chars before
    raw = bytes(mine) if isinstance(mine, (bytes, bytearray)) else bytes(c & 0xFF for c in mine)
    uid = np.frombuffer(raw, dtype=np.uint8).copy()
    comm.Bcast(uid, root=0)  # raw bytes, never pickled
    shared = bytes(uid) if isinstance(mine, (bytes, bytearray)) else tuple(int(c) - 256 * (c > 127) for c in uid)
    nc = nccl.NcclCommunicator(size, shared, rank)
    x = cupy.full(4, rank + 1, dtype=cupy.float32)
    y = cupy.empty_like(x)
    nc.allReduce(x.data.ptr, y.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, cupy.cuda.Stream.null.ptr)
    cupy.cuda.Stream.null.synchronize()
    version = nccl.get_version() if hasattr(nccl, "get_version") else "?"
    print(f"rank {rank} of {size} on GPU {gpu}: OK (NCCL {version}): {y.get().tolist()}", flush=True)
except Exception as err:
    print(f"rank {rank} of {size}: {type(err).__name__}: {' '.join(str(err).split())[:160]}", flush=True)
EOF
if [[ "$mpi_ok" == yes ]]; then
    timeout 40 mpirun -n 2 $py "$out/nccl_probe.py" > "$out/nccl.txt" 2>&1
    rc=$?
    row "nccl 2 ranks 1 GPU" "rc=$rc $(grep -m1 '^rank 0' "$out/nccl.txt" | cut -c1-120)"
    row "" "$(grep -m1 '^rank 1' "$out/nccl.txt" | cut -c1-120)"
else
    row "nccl 2 ranks 1 GPU" "not run: no working mpirun"
fi

# 4. the tests
nvidia-smi -L > "$out/gpus.txt" 2>&1
if [[ "$mpi_ok" == yes ]]; then
    OMP_NUM_THREADS=4 timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_gpu_ranks.py > "$out/tests.txt" 2>&1
    row "tests/test_gpu_ranks" "rc=$? $(last "$out/tests.txt")"
else
    row "tests/test_gpu_ranks" "not run: no working mpirun"
fi

# 5. the bench
shapes="m,gpt2"; [[ -n "$quick" ]] && shapes="m"
if [[ "$mpi_ok" == yes ]]; then
    OMP_NUM_THREADS=4 timeout 150 $py bench/gpu_ranks.py --shapes "$shapes" --timeout 60 > "$out/bench.txt" 2>&1
    row "bench/gpu_ranks.py" "rc=$? $(last "$out/bench.txt")"
else
    row "bench/gpu_ranks.py" "not run: no working mpirun"
fi

echo "== GPUs =="; cat "$out/gpus.txt"
echo "== nccl probe =="; cat "$out/nccl.txt" 2>/dev/null | tail -6
echo "== test failures (first 30 lines) =="; grep -E '^(FAILED|ERROR)|Error' "$out/tests.txt" 2>/dev/null | head -30
echo "== bench =="; tail -12 "$out/bench.txt" 2>/dev/null
echo "== summary =="; cat "$summary"
