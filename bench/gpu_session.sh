#!/usr/bin/env bash
# The GPU issues' device call: everything a lent GPU machine should run, in one command, most telling first.
#
#   bash bench/gpu_session.sh [--quick]      (on the device machine, from the repository root)
#
# A lent machine is bare and reaches nothing outside it, and its image already holds numpy,
# regex, click, tqdm, safetensors, CuPy, PyTorch, mpi4py, pytest and hypothesis: tokenkit is
# installed from this checkout with no dependencies and no build isolation (or from a wheel
# built here and carried: device.run(..., carry=["build/gpu-wheel"])). Then, each step's
# full log under $OUT (what the device tool brings back; build/gpu-session/ elsewhere):
#   1. the machine: nvidia-smi, the Python packages that matter;
#   2. the GPU tests: fused attention (tests/test_gpu_attention.py) first, then every CUDA kernel
#      against its NumPy twin and whole steps against the CPU model (tests/test_gpu.py), the
#      backends' and the emulator's tests;
#   3. bench/gpu_attention.py: attention alone, fused against GEMMs and PyTorch's SDPA;
#   4. bench/gpu.py: tk next to PyTorch eager on GPT-2 124M's shapes (training and generation at
#      batch 1 and 8), the same without fused attention, generation without CUDA graphs, then S, M,
#      L (--quick: gpt2 only, short);
#   5. bench/gpu_profile.py: a GPT-2 step op by op;
#   6. bench/shakespeare.py --device cuda: nanoGPT's baby GPT, its validation loss and wall time.
# A failing step does not stop the next: the last lines printed are one short table, what the
# device tool's reply carries. bench/gpu_ranks.sh runs the MPI checks the same way.
set -uo pipefail
quick=""
[[ "${1:-}" == "--quick" ]] && quick="yes"
out="${OUT:-build/gpu-session}"
mkdir -p "$out"
py="${PY:-python3}"  # the device image's python3 holds PyTorch and CuPy
summary="$out/summary.txt"
: > "$summary"
row() { printf '%-34s %s\n' "$1" "$2" >> "$summary"; }
last() { grep -v '^\s*$' "$1" 2>/dev/null | tail -1 | cut -c1-120; }
export PYTHONUNBUFFERED=1

{ nvidia-smi; $py -c "import sys, numpy, cupy, torch; print(sys.version); print('numpy', numpy.__version__, 'cupy', cupy.__version__, 'torch', torch.__version__, torch.version.cuda)"; } > "$out/machine.txt" 2>&1
row machine "$(grep -m1 -o 'NVIDIA [A-Z0-9]*[^|]*' "$out/machine.txt" | head -1 | tr -s ' ')"

# An older setuptools there may not read pyproject's license field: then the wheel built here
# (python -m build --wheel --outdir build/gpu-wheel .) and carried with the call is installed.
if ! timeout 120 $py -m pip install --quiet --no-deps --no-build-isolation -e . > "$out/install.txt" 2>&1; then
    timeout 60 $py -m pip install --quiet --no-deps build/gpu-wheel/*.whl >> "$out/install.txt" 2>&1
fi
row install "$(cd /tmp && $py -c 'import tokenkit.transformer as t; print("tokenkit from", t.__file__)' 2>&1 | tail -1)"

tests="$out/tests.txt"
OMP_NUM_THREADS=8 timeout 120 $py -m pytest -q -p no:cacheprovider -x tests/test_gpu_attention.py > "$tests" 2>&1
row "tests: fused attention" "rc=$? $(last "$tests")"
OMP_NUM_THREADS=8 timeout 240 $py -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/test_backends.py \
    tests/test_cuda_emulator.py tests/test_fused_attention.py >> "$tests" 2>&1
row "tests: gpu, backends, emulator" "rc=$? $(last "$tests")"

bench="$out/bench.txt"
: > "$bench"
step() {  # $1: label, $2: seconds, rest: the command; its output appended to bench.txt
    local label="$1" limit="$2"
    shift 2
    echo "=== $label: $*" >> "$bench"
    timeout "$limit" "$@" >> "$bench" 2>&1
    row "$label" "rc=$? $(last "$bench")"
}
step "attention alone" 120 $py bench/gpu_attention.py
if [[ -n "$quick" ]]; then
    step "gpu.py gpt2 (quick)" 200 $py bench/gpu.py --configs gpt2 --quick
else
    step "gpu.py gpt2" 200 $py bench/gpu.py --configs gpt2
    step "gpu.py gpt2, GEMM attention" 120 $py bench/gpu.py --configs gpt2 --gemm-attention --gen-tokens 0
    step "gpu.py gpt2, no CUDA graphs" 90 $py bench/gpu.py --configs gpt2 --no-graphs --steps 2 --warmup 1
    step "gpu.py S, M, L" 200 $py bench/gpu.py --configs S,M,L
    step "profile" 120 $py bench/gpu_profile.py --steps 5
    step "shakespeare --device cuda" 150 $py bench/shakespeare.py --device cuda
fi

echo "== failures (first 30 lines) =="; grep -E '^(FAILED|ERROR)|Error' "$tests" | head -30
echo "== bench =="; grep -v '^\s*$' "$bench" | grep -v -E '^\s*[0-9]+%|it/s\]' | tail -60
echo "== summary =="; cat "$summary"
