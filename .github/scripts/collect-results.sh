#!/usr/bin/env bash
# The cells' result artifacts, downloaded as DOWNLOADED/results-<cell>/, put in the results layout that
# `gdn-matrix report` and `gdn-matrix history add` read: RESULTS/<cell>/. A cell with no artifact (not
# run, or cancelled) is simply absent: the report records it as not run.
set -euo pipefail
usage="usage: collect-results.sh DOWNLOADED RESULTS"
downloaded=${1:?$usage}
results=${2:?$usage}
mkdir -p "$results"
for dir in "$downloaded"/results-*; do
    if [ -d "$dir" ]; then
        cp -r "$dir" "$results/${dir#"$downloaded"/results-}"
    fi
done
