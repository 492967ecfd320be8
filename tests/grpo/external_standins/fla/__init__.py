"""Stand-in for flash-linear-attention as a GPU machine has it installed: importable, and every kernel
raises. Only tests/ops/test_grpo.py puts it on sys.path, in a subprocess, to check that the transformers
baseline runs transformers' torch code even where transformers would hand its GDN work to fla."""

__gdn_stand_in__ = "fla whose kernels raise (transformers baseline check)"
__version__ = "0.6.0"
