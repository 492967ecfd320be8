"""STAND-IN for flash-linear-attention 0.6.0 (tests/peer_standins/README.md). Not fla."""

import importlib.util

__gdn_stand_in__ = "fla 0.6.0 registry (manifest test)"
__version__ = "0.6.0"

# fla imports its TileLang kernels whenever tilelang is installed; a broken tilelang breaks `import fla`
if importlib.util.find_spec("tilelang") is not None:
    import tilelang  # noqa: F401
