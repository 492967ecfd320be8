"""chunk_gated_delta_rule: gdn's Triton kernels vs flash-linear-attention vs FlashQLA vs FlashInfer vs gdn
eager, same run (GPU); a peer that does not import is left out with its reason.

Times forward and forward+backward (median of triton.testing.do_bench) and the peak memory each
allocates, bf16, q/k l2norm in the kernel, at the issue's shapes. FLA's Hopper guard (its gated
backward refuses Triton >= 3.4, < 3.7.1) is bypassed for timing only: its numbers there are not a
statement that its backward is correct on that stack. Also checks each implementation against eager:
the worst of o and the five gradients, and the gate's gradient summed over the tokens per head.

gdn's triton forward+backward is also timed replayed from a CUDA graph (dense and packed rows: a packed
call plans its chunks on the device), which leaves out the host work between its launches; a call that
cannot be captured records why (`graph_error`). With --sweep, also the triton forward+backward under
each setting of SWEEP (knobs of gdn.backends.triton.common.config.OVERRIDES); with --profile, the CUDA
time of every kernel of one forward+backward (torch.profiler), triton's, fla's, FlashQLA's and
FlashInfer's side by side, to say where the time goes, and their sum per row (`kernel_ms`) with gdn's
ratios to each peer, so that host overhead hides neither side.

FlashInfer (0.7.2: `flashinfer.gdn_prefill.chunk_gated_delta_rule`, its CuTe DSL kernels on Hopper) is a
forward-only peer: it takes packed [T, heads, D] tensors with cu_seqlens (a dense row goes as B
sequences of T), the gate as a factor (exp(g), fp32) and beta in fp32, and has no backward; its rows
time, profile and compare the forward alone (`fwd_*`, `kernel_ms` of the forward), against gdn's
forward kernels (`fwd_kernel_vs_flashinfer`).

Rows: (B, T) = (1, 8192), (4, 4096), (1, 32768), a packed row of 64 sequences of uneven length (64-960
tokens drawn, scaled to 32,768 in all) as GRPO rollouts pack, (1, 65536), and 512 packed sequences of
65,536 tokens in all. Where FlashQLA is installed, fla hands it the chunk op; `fla-triton` is fla with
FLA_FLASH_QLA=0, its own Triton path.

With --split, the state passes' intra-sequence split (config.could_split, segment_programs) is timed
alone, triton only: few-sequence rows (1 x 32768, 1 x 65536, 2 x 16384) at 32, 8 and 4 value heads (16,
4 and 2 q/k heads), forward+backward wall and summed kernel time, under the rule (the defaults: it
splits only where one program per sequence, head and slice would leave most SMs idle), never splitting
(segment_programs 0), and forced everywhere (the rule read as if the device had 1000 SMs: 16 segments a
sequence in 32-column slices) at 2 and 4 programs an SM.

Usage: PYTHONPATH=src:. python -m bench.chunk [--quick] [--sweep [KNOB ...]] [--split] [--profile]
[--rows I ...] [--impls NAME ...] [--shape B T H HV D ...]. `--sweep KNOB ...` runs only the settings
whose knobs are all among those named; with --profile each sweep setting's kernels are profiled too
(`kernel_ms` and the per-kernel times), so that a setting's gain or loss is placed in the kernel it
changed. `--shape` adds a dense row of its own (the heads of one tensor-parallel rank, say) and leaves
the standard rows out unless --rows names them.

The results file (bench/results/chunk-<date>.json, chunk-split-<date>.json with --split) is written again
after every row: a run cut short (a peer's first compile past the time a device call gives) keeps the
rows it measured and lists the ones it did not under `not_run`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
from collections.abc import Iterator

import torch

import gdn
from gdn.matrix.timing import chunk_inputs, environment, median_ms, peak_gib, print_table, write_results

# (B, T, H, HV, D, packed sequences or 0 for a dense row). A packed row, as GRPO rollouts pack: that many
# sequences of uneven length (drawn from LENGTHS, seeded, then scaled to T in all) in one B = 1 row with
# cu_seqlens. Indices stay as they were when rows were added (0-3, then 4-5).
ROWS = [
    (1, 8192, 16, 32, 128, 0),
    (4, 4096, 16, 32, 128, 0),
    (1, 32768, 16, 32, 128, 0),
    (1, 32768, 16, 32, 128, 64),
    (1, 65536, 16, 32, 128, 0),
    (1, 65536, 16, 32, 128, 512),
]
LENGTHS = (64, 960)
# --split: few sequences, at the model's heads and at one tensor-parallel rank's
SPLIT_ROWS = [(1, 32768), (1, 65536), (2, 16384)]
SPLIT_HEADS = [(16, 32), (4, 8), (2, 4)]
# "sms": the SM count the split's rule reads (config.processors); the rest are config.OVERRIDES knobs
SPLIT_SETTINGS = [{}, {"segment_programs": 0}, {"sms": 1000}, {"sms": 1000, "segment_programs": 4}]
# Knob settings next to the defaults. From ptxas on sm_90 (bf16, K=V=128, defaults): the WY backward
# uses 255 registers with 308 bytes of spills at 4 warps (228 and none at 8), qk_grads 255 with 68 at
# 8 warps (249 and none with BK=32, which also narrows the other K-sliced stages); prepare 190 at 1
# warp, the state passes 234-238.
SWEEP = [
    {"num_stages": 2},
    {"state_stages": 2},
    {"prepare_warps": 2},
    {"prepare_warps": 4},
    {"wy_bwd_warps": 8},
    {"BK": 32},
    {"dqkwg_warps": 4},
    {"state_warps": 8},
    {"state_bv": 32},
    # wider state slices read w and k for more columns (the passes move w and k once per V slice)
    {"state_bv": 128, "state_warps": 8},
    {"state_bv_short": 64},
    {"state_bv_short": 128, "state_warps": 8},
    {"BV": 32},
    {"BV": 128},
    {"BK": 32, "dqkwg_warps": 4},
    # qk_grads one value head a program over the whole K: 128 registers and no spills at 16 warps (ptxas)
    {"dqkwg_warps": 16},
    {"output_bv": 64},
    # the state passes' slices and split (config.state_slice, config.could_split): the split off, at 3
    # and 4 programs per SM, shorter and longer segments, the forward alone; 32-wide slices where the
    # rule takes 16
    {"segment_programs": 0},
    {"segment_programs": 3},
    {"segment_programs": 4},
    {"segment_chunks": 4},
    {"segment_chunks": 16},
    {"split_backward": 0},
    {"combine_stages": 3},
    {"state_bv_narrow": 32},
    # ncu on the H200: the state passes run one program per SM, held there by the shared memory of their
    # pipeline (117 KiB forward, 165 KiB backward at 3 stages), at one warp per scheduler issuing every
    # 4-5 cycles: latency-bound, DRAM at 40%. Fewer stages let two programs share an SM, which only
    # more programs (narrower slices or segments) can use; measured, none of these won. Settings that
    # put the state backward at 1 stage with a split, or the WY backward at 32-wide K slices, are left
    # out: on Triton 3.6 their dots read shared memory out of bounds (compute-sanitizer), an illegal
    # memory access that ends the process's CUDA context.
    {"state_stages": 2, "state_bwd_stages": 2},
    {"state_stages": 1, "state_bwd_stages": 1},
]
PROFILED_REPS = 5


def packed_offsets(sequences: int, tokens: int, lengths: tuple[int, int], device: str) -> torch.Tensor:
    """cu_seqlens [sequences + 1] of uneven lengths drawn from `lengths` and scaled to `tokens` in all."""
    drawn = torch.randint(lengths[0], lengths[1] + 1, (sequences,), generator=torch.Generator().manual_seed(0))
    scaled = (drawn.double() * tokens / drawn.sum()).floor().long().clamp_min(1)
    scaled[-1] += tokens - scaled.sum()
    return torch.cat([scaled.new_zeros(1), scaled.cumsum(0)]).to(device, torch.int32)


def gdn_impl(mode: str):
    """gdn's public op on a backend."""

    def run(q, k, v, g, beta, cu_seqlens=None):
        gdn.set_compute_mode(mode)
        return gdn.chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens)

    return run


@contextlib.contextmanager
def overrides(knobs: dict) -> Iterator[None]:
    """config.OVERRIDES set to `knobs` (an "sms" entry: the SM count the state passes' rule reads)."""
    from gdn.backends.triton.common import config

    knobs = dict(knobs)
    sms = knobs.pop("sms", None)
    saved, counted = dict(config.OVERRIDES), config.processors
    config.OVERRIDES.clear()
    config.OVERRIDES.update(knobs)
    if sms is not None:
        config.processors = lambda device: sms
    try:
        yield
    finally:
        config.OVERRIDES.clear()
        config.OVERRIDES.update(saved)
        config.processors = counted


@contextlib.contextmanager
def environment_set(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def fla_impl(env: dict[str, str] | None = None):
    """fla's chunk op as its users call it; with `env` set around each call (fla's registry reads its
    switches per call: FLA_FLASH_QLA=0 keeps it on its own Triton kernels where FlashQLA is installed)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as exc:
        print(f"fla not importable: {exc}; timing without it")
        return None

    def run(q, k, v, g, beta, cu_seqlens=None):
        with environment_set(env or {}):
            return chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=_long(cu_seqlens))

    return run


def flashqla_impl():
    try:
        import flash_qla
    except Exception as exc:  # absent, or its import refuses this GPU or misses tilelang / z3
        print(f"flash_qla not importable: {type(exc).__name__}: {exc}; timing without it")
        return None

    def run(q, k, v, g, beta, cu_seqlens=None):
        return flash_qla.chunk_gated_delta_rule(
            q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=_long(cu_seqlens)
        )

    return run


def flashinfer_impl():
    """FlashInfer's GDN prefill (forward only), called as its users call it: packed [T, heads, D] with
    cu_seqlens (a dense batch as B sequences of T), the gate as a factor exp(g) and beta in fp32."""
    try:
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
    except Exception as exc:  # absent, or its import misses cutlass-dsl, tvm-ffi, cudnn-frontend, cuda-tile
        print(f"flashinfer not importable: {type(exc).__name__}: {exc}; timing without it")
        return None

    def run(q, k, v, g, beta, cu_seqlens=None):
        B, T = q.shape[:2]
        if cu_seqlens is None:
            cu_seqlens = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=q.device)

        def packed(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(B * T, *x.shape[2:])

        o = chunk_gated_delta_rule(
            packed(q),
            packed(k),
            packed(v),
            packed(g).float().exp(),
            packed(beta).float(),
            cu_seqlens=cu_seqlens,
            use_qk_l2norm_in_kernel=True,
        )
        return o.view(B, T, *o.shape[1:]), None

    return run


def _long(cu_seqlens: torch.Tensor | None) -> torch.Tensor | None:
    """The peers declare LongTensor offsets."""
    return None if cu_seqlens is None else cu_seqlens.long()


def fwd_bwd_of(fn, inputs, do):
    def fwd_bwd():
        out, _ = fn(*inputs)
        out.backward(do)

    return fwd_bwd


def forward_of(fn, inputs):
    def fwd():
        with torch.no_grad():
            return fn(*inputs)

    return fwd


def measure(fn, inputs, do, forward_only: bool = False) -> dict:
    fwd = forward_of(fn, inputs)
    found = {"fwd_ms": round(median_ms(fwd), 3), "fwd_peak_gib": round(peak_gib(fwd), 3)}
    if not forward_only:
        fwd_bwd = fwd_bwd_of(fn, inputs, do)
        found["fwd_bwd_ms"] = round(median_ms(fwd_bwd, grad_to_none=inputs), 3)
        found["fwd_bwd_peak_gib"] = round(peak_gib(fwd_bwd), 3)
    return found


def graphed_ms(fn, inputs, do) -> float:
    """forward+backward captured once in a CUDA graph and replayed: the kernels' time with no host work
    between them (dense and packed calls; a packed call whose state passes would split a sequence reads
    its plan back to the host and cannot be captured)."""
    fwd_bwd = fwd_bwd_of(fn, inputs, do)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as capture requires
        for _ in range(3):
            fwd_bwd()
    torch.cuda.current_stream().wait_stream(side)
    for x in inputs:
        x.grad = None  # the captured backward allocates the gradients from the graph's pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fwd_bwd()
    return median_ms(graph.replay)


GRADS = ("dq", "dk", "dv", "dg", "dbeta")


def agreement(fn, ref, inputs, do, forward_only: bool = False) -> dict[str, float]:
    """||impl - eager|| / ||eager|| of o and each of the five gradients, and of the gate's gradient
    summed over the tokens per head (`dg summed`: what a per-head gate parameter such as A_log
    receives, where errors of one sign add up instead of averaging out); of o alone for a forward-only
    peer."""
    results = []
    for f in (fn, ref):
        if forward_only:
            results.append({"o": forward_of(f, inputs)()[0].double()})
            continue
        for x in inputs:
            x.grad = None
        out, _ = f(*inputs)
        out.backward(do)
        found = dict(zip(("o", *GRADS), [out.detach(), *(x.grad for x in inputs)], strict=True))
        found["dg summed"] = found["dg"].sum(dim=(0, 1))
        results.append({name: t.double() for name, t in found.items()})
    impl, eager = results
    return {name: float(f"{((impl[name] - want).norm() / want.norm()).item():.2e}") for name, want in eager.items()}


def sweep_rows(
    inputs, do, shape: str, settings: list[dict], profiled: bool, cu_seqlens=None
) -> tuple[list[dict], dict | None]:
    """forward+backward of the triton backend under each knob setting, next to its defaults (none when
    the settings hold them, as --split's do); with `profiled`, each setting's summed kernel time and its
    kernels. -> (rows, the setting under which a fault lost the CUDA context, or None)."""
    rows, lost = [], None
    for knobs in settings if {} in settings else [{}, *settings]:
        row = {"shape": shape, "knobs": knobs or "defaults"}
        if lost is not None:  # a fault left the CUDA context unusable: every later launch would fail with it
            rows.append(row | {"error": f"not run: the CUDA context was lost under {lost}"})
            continue
        fn = functools.partial(gdn_impl("triton"), cu_seqlens=cu_seqlens)
        try:
            # around the backward too: its state passes read the SM count again
            with overrides(knobs):
                row["fwd_bwd_ms"] = round(median_ms(fwd_bwd_of(fn, inputs, do), grad_to_none=inputs), 3)
                if profiled:
                    kernels = kernel_times(fn, inputs, do, shape, "triton")
                    row["kernel_ms"] = round(sum(r["ms"] for r in kernels), 3)
                    row["kernels"] = {r["kernel"]: r["ms"] for r in kernels}
        except Exception as exc:  # a setting the compiler or the GPU refuses is a result too
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            if isinstance(exc, torch.AcceleratorError):
                lost = knobs
        rows.append(row)
    return rows, lost


def kernel_times(fn, inputs, do, shape: str, impl: str, forward_only: bool = False) -> list[dict]:
    """CUDA time per kernel of one forward+backward, or of one forward (mean of PROFILED_REPS), largest
    first."""
    from torch.profiler import ProfilerActivity, profile

    fwd_bwd = forward_of(fn, inputs) if forward_only else fwd_bwd_of(fn, inputs, do)
    for x in inputs:
        x.grad = None
    fwd_bwd()  # compiled and autotuned outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED_REPS):
            for x in inputs:
                x.grad = None
            fwd_bwd()
        torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", 0) or getattr(event, "self_cuda_time_total", 0)
        if us > 0:
            rows.append(
                {
                    "shape": shape,
                    "impl": impl,
                    "kernel": event.key[:80],
                    "ms": round(us / PROFILED_REPS / 1000, 4),
                    "launches": event.count // PROFILED_REPS,
                }
            )
    return sorted(rows, key=lambda r: -r["ms"])


IMPLS = ("triton", "fla", "flashqla", "fla-triton", "flashinfer", "eager")
FORWARD_ONLY = {"flashinfer"}


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first row only")
    parser.add_argument("--rows", type=int, nargs="+", help="row indices into ROWS")
    parser.add_argument(
        "--shape", type=int, nargs=5, action="append", metavar=("B", "T", "H", "HV", "D"), help="a dense row of its own"
    )
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS), help="eager is always timed")
    parser.add_argument("--sweep", nargs="*", metavar="KNOB", help="all of SWEEP, or the settings of these KNOBs only")
    parser.add_argument("--split", action="store_true", help="the split's rows and settings alone (triton)")
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    rows = len(ROWS)
    if any(not 0 <= i < rows for i in args.rows or []):
        parser.error(f"--rows: indices 0-{rows - 1}, got {args.rows}")
    if args.sweep:
        unknown = set(args.sweep) - {knob for setting in SWEEP for knob in setting}
        if unknown:
            parser.error(f"--sweep: no setting touches {sorted(unknown)}")
    return args


def selected_rows(args: argparse.Namespace) -> list[tuple[int, int, int, int, int, int]]:
    """(B, T, H, HV, D, packed sequences or 0) of each row: with --split its rows; else those --rows
    names (all without --shape, the first with --quick), then each --shape."""
    if args.split:
        return [(B, T, H, HV, 128, 0) for B, T in SPLIT_ROWS for H, HV in SPLIT_HEADS]
    picked = args.rows or ([] if args.shape else [0] if args.quick else range(len(ROWS)))
    return [ROWS[i] for i in picked] + [(*shape, 0) for shape in args.shape or []]


def selected_settings(args: argparse.Namespace) -> list[dict] | None:
    """The sweep's settings: SPLIT_SETTINGS with --split; None without --sweep, all of SWEEP with it
    bare, else those whose knobs are all among the named."""
    if args.split:
        return SPLIT_SETTINGS
    if args.sweep is None:
        return None
    return [s for s in SWEEP if not args.sweep or set(s) <= set(args.sweep)]


def main() -> None:
    from gdn.backends.fla import bypass_hopper_guard

    args = arguments()
    shapes, settings = selected_rows(args), selected_settings(args)
    wanted = {"triton"} if args.split else set(args.impls) | {"eager"}  # every error is measured against eager
    impls = {
        "triton": gdn_impl("triton") if "triton" in wanted else None,
        "fla": fla_impl() if "fla" in wanted else None,
        "flashqla": flashqla_impl() if wanted & {"flashqla", "fla-triton"} else None,
        "flashinfer": flashinfer_impl() if "flashinfer" in wanted else None,
        "eager": gdn_impl("eager") if "eager" in wanted else None,
    }
    if impls["flashqla"] is not None and "fla-triton" in wanted:
        # where FlashQLA is installed fla hands it the chunk op: its own Triton path is a peer of its own
        impls["fla-triton"] = fla_impl({"FLA_FLASH_QLA": "0"})
    impls = {name: fn for name, fn in impls.items() if fn is not None and name in wanted}
    rows, sweep, kernels, done = [], [], [], 0
    results_name = "chunk-split" if args.split else "chunk"  # a --split run beside a plain one keeps both
    env = environment("fla-core", "flash-qla", "tilelang", "flashinfer-python", "nvidia-cutlass-dsl")
    # the guard lives in fla: without fla there is nothing to lift
    with bypass_hopper_guard() if "fla" in impls else contextlib.nullcontext():
        for B, T, H, HV, D, packed in shapes:
            inputs = chunk_inputs(B, T, H, HV, D)
            do = torch.randn(B, T, HV, D, device="cuda", dtype=torch.bfloat16)
            cu = packed_offsets(packed, T, LENGTHS, "cuda") if packed else None
            shape = f"B={B} T={T} H={H} HV={HV} K=V={D}" + (f" packed N={packed}" if packed else "")
            bound = {name: functools.partial(fn, cu_seqlens=cu) for name, fn in impls.items()}
            for name, fn in bound.items() if not args.split else ():
                forward_only = name in FORWARD_ONLY
                row = {"shape": shape, "impl": name, **measure(fn, inputs, do, forward_only)}
                if name != "eager":
                    errors = agreement(fn, bound["eager"], inputs, do, forward_only)
                    worst = max(v for k, v in errors.items() if k != "dg summed")
                    row |= {"rel_err_vs_eager": worst, "dg_summed_err": errors.get("dg summed"), "rel_err": errors}
                if name.startswith("triton"):
                    try:
                        row["fwd_bwd_graph_ms"] = round(graphed_ms(fn, inputs, do), 3)
                    except Exception as exc:  # a call that cannot be captured is a result too
                        row["graph_error"] = f"{type(exc).__name__}: {exc}"[:200]
                rows.append(row)
                print_table(rows[-1:], ["shape", "impl", "fwd_ms", "fwd_bwd_ms"])
            if settings is not None:
                swept, lost = sweep_rows(inputs, do, shape, settings, args.profile, cu)
                sweep += swept
                print_table(swept, ["shape", "knobs", "fwd_bwd_ms", "kernel_ms", "error"])
                if lost is not None:
                    print(f"the CUDA context was lost under {lost}: the remaining rows are not run")
                    done += 1  # this shape's rows were measured; its sweep says where it stopped
                    break
            if args.profile and not args.split:
                for name in ("triton", "fla", "flashqla"):
                    if name in bound:
                        kernels += kernel_times(bound[name], inputs, do, shape, name)
                if "flashinfer" in bound:  # forward against forward: gdn's forward kernels beside it
                    kernels += kernel_times(bound["flashinfer"], inputs, do, shape, "flashinfer", forward_only=True)
                    if "triton" in bound:
                        kernels += kernel_times(bound["triton"], inputs, do, shape, "triton-forward", forward_only=True)
            del inputs, do, bound
            torch.cuda.empty_cache()
            done += 1
            # written after every shape: a run cut short (a peer's JIT past the time given) keeps its rows
            write_results(results_name, results_payload(env, compared(rows, kernels), sweep, kernels, shapes[done:]))
    rows = compared(rows, kernels)
    columns = [
        "shape",
        "impl",
        "fwd_ms",
        "fwd_bwd_ms",
        "fwd_peak_gib",
        "fwd_bwd_peak_gib",
        "rel_err_vs_eager",
        "dg_summed_err",
    ]
    print_table(rows, [*columns, "fwd_bwd_graph_ms", "kernel_ms", "fwd_bwd_vs_fla", "fwd_bwd_vs_flashqla"])
    print_table(rows, ["shape", "impl", "kernel_vs_fla", "kernel_vs_flashqla", "fwd_vs_flashinfer", "graph_error"])
    if kernels:
        print_table(kernels, ["shape", "impl", "kernel", "ms", "launches"])
    print(f"written {write_results(results_name, results_payload(env, rows, sweep, kernels, shapes[done:]))}")


def compared(rows: list[dict], kernels: list[dict]) -> list[dict]:
    """The rows with each one's summed kernel time (where profiled) and, for the triton rows, its
    forward, forward+backward and kernel time over each peer's of the same shape."""
    out = []
    for row in rows:
        row = dict(row)
        same = [r for r in kernels if r["shape"] == row["shape"] and r["impl"] == row["impl"]]
        if same:
            row["kernel_ms"] = round(sum(r["ms"] for r in same), 3)
        out.append(row)
    for row in out:
        if not row["impl"].startswith("triton"):
            continue
        for peer in ("fla", "flashqla", "flashinfer"):
            other = next((r for r in out if r["shape"] == row["shape"] and r["impl"] == peer), None)
            if other:
                row[f"fwd_vs_{peer}"] = round(row["fwd_ms"] / other["fwd_ms"], 3)
                if "fwd_bwd_ms" in other:
                    row[f"fwd_bwd_vs_{peer}"] = round(row["fwd_bwd_ms"] / other["fwd_bwd_ms"], 3)
                if "kernel_ms" in row and "kernel_ms" in other and "fwd_bwd_ms" in other:
                    row[f"kernel_vs_{peer}"] = round(row["kernel_ms"] / other["kernel_ms"], 3)
        # forward kernels against a forward-only peer's (both profiled forward alone)
        forward = [r for r in kernels if r["shape"] == row["shape"] and r["impl"] == "triton-forward"]
        peer_kernels = [r for r in kernels if r["shape"] == row["shape"] and r["impl"] == "flashinfer"]
        if row["impl"] == "triton" and forward and peer_kernels:
            row["fwd_kernel_ms"] = round(sum(r["ms"] for r in forward), 3)
            row["fwd_kernel_vs_flashinfer"] = round(row["fwd_kernel_ms"] / sum(r["ms"] for r in peer_kernels), 3)
    return out


def results_payload(env: dict, rows: list[dict], sweep: list[dict], kernels: list[dict], pending: list[tuple]) -> dict:
    """The results file's content from rows already `compared`; `pending`: the selected rows (B, T, H,
    HV, D, packed sequences) not run yet, listed so that a file from a run cut short says what it lacks."""
    payload = {
        "environment": env,
        "dtype": "bfloat16",
        "use_qk_l2norm_in_kernel": True,
        "rows": rows,
        "note": "fla timed with its Hopper guard bypassed (timing only)",
    }
    if pending:
        payload["not_run"] = [list(shape) for shape in pending]
    if sweep:
        payload["sweep"] = sweep
    if kernels:
        payload["kernels"] = kernels
    return payload


if __name__ == "__main__":
    main()
