#!/usr/bin/env bash
# The three reports under tests/data/history/: the `local` cell (bench/history/matrix.yaml: matrix.yaml's
# local cell with its probe family alone) run through the real runner in the host runtime, once per
# Triton release the project supports, each installed beside the venv's torch with
# `pip install --target DIR triton==VERSION --no-deps` and put first on PYTHONPATH; the kernels run
# under TRITON_INTERPRET=1 (no GPU here). Each run's report is built by `gdn-matrix report`, and its
# report.json and the cell's cell.json, manifest.json and kernels.json are copied to
# tests/data/history/triton-VERSION/, laid out as the results root was (report/, local/).
#
#   bench/history_reports.sh [VERSION ...]     (default: 3.2.0 3.6.0 3.9.0; run from the checkout)
set -euo pipefail
versions=("$@")
[[ $# -eq 0 ]] && versions=(3.2.0 3.6.0 3.9.0)
work=${TMPDIR:-/tmp}/gdn-history-reports
matrix=bench/history/matrix.yaml
for version in "${versions[@]}"; do
  target=$work/triton-$version
  results=$work/results-$version
  [[ -d $target/triton ]] || python -m pip install -q --target "$target" "triton==$version" --no-deps
  rm -rf "$results"
  # exit 1 (failed tests) is a result like any other; the report records it
  PYTHONPATH="$target:src" TRITON_INTERPRET=1 python -m gdn.matrix.cli run local --matrix "$matrix" \
    --results "$results" --runtime host || [[ $? -eq 1 ]]
  PYTHONPATH=src python -m gdn.matrix.cli report --results "$results" --matrix "$matrix"
  out=tests/data/history/triton-$version
  rm -rf "$out"
  mkdir -p "$out/report" "$out/local"
  cp "$results/report/report.json" "$out/report/"
  # report.json already holds the tests' counts and failures, the resolutions and the accuracy rows:
  # of the cell's own files, those the report holds nothing of, to keep the test data small
  for name in cell.json manifest.json kernels.json; do
    [[ -f $results/local/$name ]] && cp "$results/local/$name" "$out/local/"
  done
done
