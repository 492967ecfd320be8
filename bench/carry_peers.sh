#!/usr/bin/env bash
# The chunk benchmark's external peers as archives for a GPU machine that cannot reach a package index
# (the device tool's H200: Python 3.12, torch 2.11 with CUDA 13, Triton 3.6, numpy, einops, protobuf,
# cuda-bindings already there). Each set's wheels are downloaded for CPython 3.12 on manylinux x86_64,
# installed into one directory here (pip install --target, no dependencies: each set names every wheel
# the image lacks) and packed with xz -9 under .whl/ (ignored by git). A device call carries at most
# 64 MiB with the working tree (about 5 MB), so the FlashInfer set goes as two archives: cutlass-dsl's
# MLIR extension (one 193 MB library) apart from the rest.
#
#   bench/carry_peers.sh flashinfer   # FlashInfer 0.7.2.post1 and what its GDN prefill imports:
#                                     # .whl/flashinfer-mlir.tar.xz (50.2 MB) and .whl/flashinfer.tar.xz
#                                     # (27.0 MB), 361 MB installed
#   bench/carry_peers.sh flashqla     # FlashQLA 0.1.3 (TileLang) and fla-core: .whl/flashqla.tar.xz
#                                     # (45.1 MB), 251 MB installed
# (2026-12-05.) No two of the three fit one call with the working tree: the FlashInfer peer needs two
# calls in a row on one warm machine, and FlashQLA beside it a third.
#
# On the machine, from the repository root, each archive named in a call's carry list (the machine keeps
# /tmp/site between calls while it stays warm):
#   mkdir -p /tmp/site && tar -xJf .whl/<archive> -C /tmp/site &&
#   export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PWD/src:$PWD
# (cutlass-dsl puts its packages on the path through a .pth file, which a directory on PYTHONPATH does
# not run: hence its dsl_packages.)
set -euo pipefail

case "${1:-}" in
flashinfer)
    # Left out: nccl4py and nccl-extensions (its communication ops) and nvidia-cudnn-frontend (its cuDNN
    # routes), which flashinfer imports only where used or under a guard (flashinfer.gdn_prefill imports
    # without them); of cutlass-dsl's builds, the cu13 libraries alone (a CUDA 13 driver)
    wheels=(
        flashinfer-python==0.7.2.post1
        apache-tvm-ffi==0.1.12
        torch-c-dlpack-ext==0.1.5
        cuda-tile==1.7.0
        nvidia-cutlass-dsl==4.8.1
        nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1
        nvidia-cutlass-dsl-libs-cu13==4.8.1
    )
    ;;
flashqla)
    wheels=(
        fla-core==0.6.0
        flash-qla==0.1.3
        tilelang==0.1.15
        apache-tvm-ffi==0.1.12
        torch-c-dlpack-ext==0.1.5
        z3-solver==4.15.4.0
    )
    ;;
*)
    echo "usage: $0 flashinfer|flashqla" >&2
    exit 2
    ;;
esac

root="$(git rev-parse --show-toplevel)/.whl"
set_name="$1"
work="$root/peers/$set_name"
target=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
rm -rf "$work"
mkdir -p "$work/wheels"
python3 -m pip download -q "${target[@]}" -d "$work/wheels" "${wheels[@]}"
python3 -m pip install -q --no-index --no-compile "${target[@]}" --target "$work/site" "$work"/wheels/*.whl
archives=("$root/$set_name.tar.xz")
if [ "$set_name" = flashinfer ]; then
    # the CUDA sources its JIT-built modules compile from (326 MB): its GDN prefill on Hopper is a CuTe
    # DSL kernel, which reads none of them (flashinfer.gdn_prefill imports without them)
    rm -rf "$work/site/flashinfer/data/csrc" "$work/site/flashinfer/data/cccl" "$work/site/flashinfer/data/cutlass"
    mlir=nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs
    (cd "$work/site" && ls ./$mlir/_cutlass_ir.cu13.*.so) >"$work/mlir.list"
    tar -C "$work/site" -cf - -T "$work/mlir.list" | xz -9 -T0 >"$root/flashinfer-mlir.tar.xz"
    tar -C "$work/site" -cf - -X "$work/mlir.list" . | xz -9 -T0 >"$root/$set_name.tar.xz"
    archives+=("$root/flashinfer-mlir.tar.xz")
else
    tar -C "$work/site" -cf - . | xz -9 -T0 >"$root/$set_name.tar.xz"
fi
du -sh "$work/wheels" "$work/site" "${archives[@]}"
