"""In-kernel helpers shared by the chunk stages: the matmul every stage uses, where a program's chunk
(and its rows) or a state pass's segment lies in the packed token axis, and a masked exp.

Addressing is plain pointer arithmetic (no block pointers: Triton 3.9 removed them). Sequence bounds
are read from cu_seqlens (varlen) or derived from the runtime T (dense), so no argument of any kernel
changes with the sequence length except T itself and the state passes' segment sizes, which every
kernel marks do_not_specialize."""

from __future__ import annotations

import triton
import triton.language as tl

from gdn.backends.triton._common import accept_runtime_loop_bounds, is_interpreting

# Fixed when the kernels are decorated: Triton decides then whether they are interpreted.
INTERPRET = tl.constexpr(is_interpreting())
if INTERPRET:
    accept_runtime_loop_bounds()


@triton.jit
def mma(a, b, FP32_DOT: tl.constexpr):
    """a @ b accumulated in fp32.

    FP32_DOT (fp32 inputs, or the interpreter) upcasts both operands and multiplies at that precision:
    "ieee", or "tf32x3" on NVIDIA (fp32-accurate, on the tensor cores). The interpreter multiplies bf16
    bit patterns as integers, and plain TF32 would cost fp32 inputs their accuracy. Otherwise (None)
    the operands go to the tensor cores in the dtype the caller cast them to."""
    if FP32_DOT is not None:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=FP32_DOT)
    return tl.dot(a, b)


@triton.jit
def cast_as(x, ptr):
    """x in the element type of ptr. The interpreter truncates fp32 to bf16 where the GPU rounds to
    nearest even, doubling and biasing the rounding error; round first there, so that CPU runs see
    the GPU's numerics."""
    dtype = ptr.dtype.element_ty
    if INTERPRET and dtype == tl.bfloat16:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits += 0x7FFF + ((bits >> 16) & 1)
        x = ((bits >> 16) << 16).to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def masked_exp(x, mask):
    """exp(x) where mask, else 0. The argument is replaced before exp, so an entry outside the mask
    (a decay running backwards in time, a padded row) can never overflow into inf * 0 = NaN."""
    return tl.exp(tl.where(mask, x, float("-inf")))


@triton.jit
def within(o, N: tl.constexpr, BLOCK: tl.constexpr):
    """o < N for the offsets o of a block of BLOCK. Where blocks of BLOCK tile N exactly, a constant
    true block: a bound the compiler cannot see through (a program's V slice) otherwise predicates every
    store of the tile and keeps the state passes' stores apart from their products."""
    if N % BLOCK == 0:
        return tl.full([BLOCK], 1, tl.int1)
    return o < N


@triton.jit
def locate_chunk(i_c, T, cu_seqlens, chunk_indices, BT: tl.constexpr, IS_VARLEN):
    """Program i_c -> (chunk index within its sequence, first token of the sequence, its length).

    Chunks are numbered sequence by sequence, so i_c is also the chunk's row in the per-chunk
    state buffers. IS_VARLEN is a runtime flag (dense batches pass empty tables), so that a dense
    call and a packed one launch the same binary: a process, its numeric probe included, compiles
    one per kernel class, not two. A packed plan's grid is an upper bound of its chunks (chunk_index):
    its rows past the last chunk come out as chunks past their sequence's end (i_t * BT >= T_n), and
    the kernel ends such a program before it reads anything."""
    if IS_VARLEN != 0:
        i_n = tl.load(chunk_indices + 2 * i_c).to(tl.int32)
        i_t = tl.load(chunk_indices + 2 * i_c + 1).to(tl.int32)
        bos = tl.load(cu_seqlens + i_n).to(tl.int32)
        T_n = tl.load(cu_seqlens + i_n + 1).to(tl.int32) - bos
    else:
        NT = tl.cdiv(T, BT)
        i_t = i_c % NT
        bos = (i_c // NT) * T
        T_n = T
    return i_t, bos, T_n


@triton.jit
def chunk_rows(i_t, bos, T_n, BT: tl.constexpr):
    """A located chunk (locate_chunk) -> (its rows' offsets within the chunk, which of them lie within
    the sequence, their tokens in the packed token axis in 64 bits)."""
    o_t = tl.arange(0, BT)
    mt = i_t * BT + o_t < T_n
    tok = (bos + i_t * BT + o_t).to(tl.int64)
    return o_t, mt, tok


@triton.jit
def locate_segment(i_s, T, NSEG, SEG, bounds, chunk_offsets, BT: tl.constexpr, IS_VARLEN):
    """Segment i_s -> (its first token, its length, its first chunk's row). Dense batches: NSEG
    segments of SEG tokens per sequence of T tokens, the last shorter; packed: read from the tables."""
    if IS_VARLEN != 0:
        bos = tl.load(bounds + i_s).to(tl.int32)
        T_s = tl.load(bounds + i_s + 1).to(tl.int32) - bos
        boc = tl.load(chunk_offsets + i_s).to(tl.int32)
    else:
        j = i_s % NSEG
        bos = (i_s // NSEG) * T + j * SEG
        T_s = tl.minimum(SEG, T - j * SEG)
        boc = (i_s // NSEG) * tl.cdiv(T, BT) + j * (SEG // BT)
    return bos, T_s, boc
