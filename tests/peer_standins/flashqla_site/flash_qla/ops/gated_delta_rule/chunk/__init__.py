"""STAND-IN for FlashQLA 0.1.3's chunk module (tests/peer_standins/README.md): it imports the kernels of
one architecture (here `hopper`, as on an H200) and decides per forward call, in _auto_intra_cp_context,
whether to split the sequences across the card, as FlashQLA's does (B = 1 and auto_cp)."""

from types import SimpleNamespace

from .hopper import fused_gdr_fwd  # noqa: F401 - the architecture's kernels, as FlashQLA imports them


def _auto_intra_cp_context(k, v, cu_seqlens, chunk_size, auto_cp, is_train, force_intra_cp=False):
    return SimpleNamespace(is_intra=bool(auto_cp and k.shape[0] == 1), cu_seqlens=cu_seqlens)
