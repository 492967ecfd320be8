#!/usr/bin/env bash
# The chunk kernels' study on the H200, in three device calls made back to back on one warm machine.
# Each call carries one peer archive (bench/carry_peers.sh; no two fit one call) and unpacks it into
# /tmp/site, which the machine keeps while it stays warm, as it keeps the Triton and TileLang caches:
#
#   tests   carry .whl/flashqla.tar.xz .whl/base .trees: the cold start alone on an idle machine, then the
#           GPU tests of the chunk op, CUDA graphs and the pools' guards, with FlashQLA's first calls
#           of every bench row (its TileLang JIT) run beside them, so that the peers call finds them
#           compiled
#   timing  carry .whl/flashinfer-mlir.tar.xz .trees: the public calls on three source trees (before
#           the op specs, after them, this checkout), the split sweep, the accuracy rows of the chunk op
#   peers   carry .whl/flashinfer.tar.xz: bench.chunk --profile, every peer, one run
#   verify  carry nothing: the GPU tests alone (after a change the study decided)
#
# .whl/base holds pydantic and what it needs (the H200 image has none; gdn.matrix reads with it), .trees
# the older trees (`git archive <commit> src | tar -x -C .trees --one-top-level=<name>`). Everything it
# writes lands under $OUT and bench/results.
set -uo pipefail
stage=${1:?usage: bench/h200_chunk_study.sh tests|timing|peers}
export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD/src:$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/site
unpack() { tar -xJf "$1" -C /tmp/site; }

gpu_tests() {
    timeout 320 python3 -m pytest -q -n 4 -p no:cacheprovider \
        tests/backends/triton/test_triton_chunk.py tests/ops/test_cuda_graphs.py tests/ops/test_pool_guard.py tests/ops/test_complete_decay.py \
        --junitxml="$OUT/gpu-tests.xml" >"$OUT/gpu-tests.log" 2>&1
    echo "pytest exit $?"
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu-tests.log" | tail -30
}

case "$stage" in
tests)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/base/*.whl || exit
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
    unpack .whl/flashinfer-mlir.tar.xz &
    unpacking=$!
    timeout 240 python3 -m bench.public_calls --rounds 3 \
        --tree before-specs=.trees/before45 --tree after-specs=.trees/after45 --tree this=. 2>&1 | tail -15
    timeout 180 python3 -m bench.chunk --split --profile 2>&1 | tail -45
    timeout 90 python3 -m gdn.matrix.accuracy --backends triton --ops chunk_gated_delta_rule --budget-s 60 \
        --output "$OUT/accuracy.json" 2>&1 | tail -30
    wait $unpacking
    echo "unpacked flashinfer-mlir: $?"
    ;;
verify)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/base/*.whl || exit
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
