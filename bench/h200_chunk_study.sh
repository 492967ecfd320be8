#!/usr/bin/env bash
# The chunk kernels' study on the H200, in device calls made back to back on one warm machine. Each call
# carries at most one peer archive (bench/carry_peers.sh; no two fit one call) and unpacks it into
# /tmp/site, which the machine keeps while it stays warm, as it keeps the Triton and TileLang caches:
#
#   tests   carry .whl/flashqla.tar.xz .whl/base .trees: the cold start alone on an idle machine, then the
#           GPU tests, with FlashQLA's first calls of every bench row (its TileLang JIT) run beside them,
#           so that the peers call finds them compiled
#   timing [NAME=DIR ...]   (ROUNDS=5 rounds of public calls; ACCURACY=0 leaves the accuracy rows out)
#           carry .whl/base .trees (and .whl/flashinfer-mlir.tar.xz before a peers call): the public calls
#           on each named source tree and this checkout, round by round; triton's kernels profiled on each
#           tree at (1, 8192) and (4, 4096), each tree's results under $OUT/<NAME>/; the accuracy rows of
#           every triton op, this checkout (the split's sweep: bench.chunk --split --profile)
#   peers   carry .whl/flashinfer.tar.xz: bench.chunk --profile, every peer, one run
#   verify  carry .whl/base: the GPU tests alone (after a change the study decided)
#
# The GPU tests: the triton backend's, the chunk op's and the GRPO step's, CUDA graphs, the pools'
# guards, strides and prepared steps. .whl/base holds pydantic and what it needs (the H200 image has
# none; gdn.matrix reads with it), .trees the older trees (`git archive <commit> src | tar -x -C .trees
# --one-top-level=<name>`). Everything it writes lands under $OUT and bench/results.
set -uo pipefail
stage=${1:?usage: bench/h200_chunk_study.sh tests|timing [NAME=DIR ...]|peers|verify}
shift
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD/src:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/site
unpack() { tar -xJf "$1" -C /tmp/site; }
install_base() { python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/base/*.whl; }

gpu_tests() {
    timeout 420 python3 -m pytest -q -n 8 -p no:cacheprovider tests/backends/triton tests/ops/test_cuda_graphs.py \
        tests/ops/test_pool_guard.py tests/ops/test_complete_decay.py tests/ops/test_grpo.py tests/ops/test_strides.py \
        tests/ops/test_prepared.py \
        --junitxml="$OUT/gpu-tests.xml" >"$OUT/gpu-tests.log" 2>&1
    echo "pytest exit $?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu-tests.log" | tail -30
}

case "$stage" in
tests)
    install_base || exit
    nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    timeout 120 python3 -m bench.cold_start --impls gdn 2>&1 | tail -30
    unpack .whl/flashqla.tar.xz || exit
    timeout 330 python3 - >"$OUT/flashqla-warm.log" 2>&1 <<'EOF' &
import functools, time, torch
from bench.chunk import LENGTHS, ROWS, flashqla_impl, forward_of, fwd_bwd_of, packed_offsets
from gdn.matrix.timing import chunk_inputs
fn = flashqla_impl()
for B, T, H, HV, D, packed in ROWS:
    start = time.perf_counter()
    inputs = chunk_inputs(B, T, H, HV, D)
    do = torch.randn(B, T, HV, D, device="cuda", dtype=torch.bfloat16)
    bound = functools.partial(fn, cu_seqlens=packed_offsets(packed, T, LENGTHS, "cuda") if packed else None)
    forward_of(bound, inputs)()
    fwd_bwd_of(bound, inputs, do)()
    torch.cuda.synchronize()
    print(B, T, packed, f"{time.perf_counter() - start:.1f} s", flush=True)
EOF
    warm=$!
    gpu_tests
    wait $warm
    echo "flashqla warm-up exit $?"
    cat "$OUT/flashqla-warm.log" | tail -12
    ;;
timing)
    install_base || exit
    [[ -f .whl/flashinfer-mlir.tar.xz ]] && { unpack .whl/flashinfer-mlir.tar.xz & }
    trees=("$@" this=.)
    rounds=${ROUNDS:-5}
    # a round is about 25 s on the H100 (three trees, a child each), the first compiles about 60
    timeout $((90 + 30 * rounds)) python3 -m bench.public_calls --rounds "$rounds" "${trees[@]/#/--tree=}" 2>&1 | tail -15
    for tree in "${trees[@]}"; do
        name=${tree%%=*} dir=${tree#*=}
        echo "== $name: triton's kernels"
        # bench.chunk takes its inputs from the tree's gdn.matrix.timing, which older trees lack
        [[ -f $dir/src/gdn/matrix/timing.py ]] || { echo "no gdn.matrix.timing: not profiled"; continue; }
        mkdir -p "$OUT/$name" "$dir/bench/results"
        OUT=$OUT/$name PYTHONPATH=/tmp/site:$dir/src:$PWD timeout 120 python3 -m bench.chunk --profile --impls triton \
            --rows 0 1 2>&1 | tail -24
        echo "== $name: the pool decode"
        OUT=$OUT/$name PYTHONPATH=/tmp/site:$dir/src:$PWD timeout 100 python3 -m bench.decode --no-sweep --batches 1 256 \
            2>&1 | tail -24
    done
    [[ ${ACCURACY:-1} = 0 ]] || timeout 90 python3 -m gdn.matrix.accuracy --backends triton --budget-s 80 --output "$OUT/accuracy.json" 2>&1 | tail -40
    wait
    ;;
verify)
    install_base || exit
    gpu_tests
    ;;
peers)
    unpack .whl/flashinfer.tar.xz || exit
    timeout 540 python3 -m bench.chunk --profile --impls triton flashqla flashinfer 2>&1 | tail -80
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
ls bench/results | tail -5
