"""STAND-IN for tilelang 0.1.15 installed without z3-solver: its import fails loading libz3, as the
real one does. Not tilelang."""

__gdn_stand_in__ = "tilelang without z3-solver (manifest test)"

raise OSError("libz3.so: cannot open shared object file: No such file or directory")
