"""STAND-IN for tilelang 0.1.15 with z3-solver beside it: imports. Not tilelang."""

__gdn_stand_in__ = "tilelang (manifest test)"
__version__ = "0.1.15"
