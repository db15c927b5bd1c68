#!/usr/bin/env bash
# Issue 23's first device call: everything a lent GPU machine should run first, in one command.
#
#   bash bench/gpu_session.sh [--quick]      (on the device machine, from the repository root)
#
# A lent machine is bare and reaches nothing outside it, and its image already holds numpy,
# regex, click, tqdm, safetensors, CuPy, PyTorch, mpi4py, pytest and hypothesis: tokenkit is
# installed from this checkout with no dependencies and no build isolation (or from a wheel
# built here and carried: device.run(..., carry=["build/gpu-wheel"])). Then, each step's
# full log under $OUT (what the device tool brings back; build/gpu-session/ elsewhere):
#   1. the machine: nvidia-smi, the Python packages that matter;
#   2. tests/test_gpu.py (every CUDA kernel against its NumPy twin, whole steps against the CPU
#      model's) and the model tests the backends share;
#   3. bench/gpu.py (tk's CuPy backend next to PyTorch eager: GPT-2 124M shapes, S, M, L;
#      --quick: a smoke run of it).
# A failing step does not stop the next: the last lines printed are one short table, what the
# device tool's reply carries.
set -uo pipefail
quick=""
[[ "${1:-}" == "--quick" ]] && quick="--quick"
out="${OUT:-build/gpu-session}"
mkdir -p "$out"
py="${PY:-python3}"  # the device image's python3 holds PyTorch and CuPy
status() { printf '%-28s %s\n' "$1" "$2" >> "$out/summary.txt"; }
: > "$out/summary.txt"

{ nvidia-smi; $py -c "import sys, numpy, cupy, torch; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__, torch.version.cuda)"; } > "$out/machine.txt" 2>&1
status machine "$(grep -m1 -o 'NVIDIA [A-Z0-9]*[^|]*' "$out/machine.txt" | head -1 | tr -s ' ')"

# An older setuptools there may not read pyproject's license field: then the wheel built here
# (python -m build --wheel --outdir build/gpu-wheel .) and carried with the call is installed.
if ! $py -m pip install --quiet --no-deps --no-build-isolation -e . > "$out/install.txt" 2>&1; then
    $py -m pip install --quiet --no-deps build/gpu-wheel/*.whl >> "$out/install.txt" 2>&1
fi
status install "$($py -c 'import tokenkit.transformer as t; print("tokenkit from", t.__file__)' 2>&1 | tail -1)"

OMP_NUM_THREADS=8 $py -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_backends.py > "$out/tests.txt" 2>&1
status "tests (gpu, backends)" "rc=$? $(tail -1 "$out/tests.txt")"

timeout 480 $py bench/gpu.py $quick > "$out/bench.txt" 2>&1
status "bench/gpu.py $quick" "rc=$?"

echo "== failures (first 40 lines) =="; grep -E '^(FAILED|ERROR)' "$out/tests.txt" | head -40
echo "== bench (last 30 lines) =="; tail -30 "$out/bench.txt"
echo "== summary =="; cat "$out/summary.txt"
