"""Stand-ins for the Ascend packages (fla_npu, torch_npu), for tests only.

Nothing here is the real software: the `fla_npu` and `torch_npu` packages under site/ reproduce the
import-time surface and the failure modes of each fla_npu API generation, and the kernels_* modules
compute each AscendC op's contract (argument names, layouts, dtypes, host int lists) in fp32 torch on
whatever device the tensors live on. They let the ascendc backend's adapters run on cpu tensors, so
that their outputs and gradients can be compared with the eager backend. Every stand-in carries a
`__gdn_stand_in__` label, and results produced with them are reported as stand-in results.
"""
