"""The names of the built-in backends (kept free of torch so that configuration code can read them)."""

BACKEND_NAMES = ("eager", "ascendc", "triton", "fla", "flashqla", "torch_npu")
