"""Stand-in: the machine flags fla computes at import, as on an H200 with Triton 3.6."""

IS_NVIDIA_HOPPER = True
TRITON_ABOVE_3_4_0 = True
TRITON_ABOVE_3_7_1 = False


def has_usable_nvcc() -> bool:
    return True
