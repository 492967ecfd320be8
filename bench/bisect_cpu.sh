#!/usr/bin/env bash
# The bisect demonstration on a CPU: between a cpu-cell lock with Triton 3.2.0 / transformers 5.2.0 and
# one with Triton 3.9.0 / transformers 5.25.0 (13 packages differ: transformers 5.25 brings
# huggingface-hub 2, which brings httpx2 and others), which change breaks a kernel written with block
# pointers under Triton's interpreter (bench/bisect/block_pointer_probe.py)?
# The two locks were made with `gdn-matrix lock cpu` from copies of matrix.yaml whose cpu cell pinned
# those versions. Needs uv, PyPI, Python 3.11 and torch 2.13.0+cpu's wheel in the wheelhouse
# ($GDN_WHEELHOUSE or ./wheelhouse). Usage: bash bench/bisect_cpu.sh [WORK_DIR]; the output is saved
# under bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
work="${1:-${TMPDIR:-/tmp}/gdn-bisect-demo}"
out="bench/results/bisect-cpu-$(date -u +%F).txt"
PYTHONPATH=src python -m gdn.matrix.cli bisect cpu \
    --good bench/bisect/cpu-triton32.txt \
    --bad bench/bisect/cpu-triton39-transformers525.txt \
    --test bench/bisect/block_pointer_probe.py::test_block_pointer_kernel_runs_under_the_interpreter \
    --work "$work" 2>&1 | tee "$out"
exit "${PIPESTATUS[0]}"
