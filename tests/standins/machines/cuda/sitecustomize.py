"""STAND-IN for a machine with a CUDA GPU, NOT a real one (see ../README.md): this sitecustomize makes
torch.cuda report one GPU at interpreter start, unless CUDA_VISIBLE_DEVICES hides every device, as
the CUDA driver does. It lets a CPU machine run the code paths a GPU machine takes when nothing in
them launches a CUDA kernel (the probe's device list and the resolution it makes per device type)."""

import os

if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
    import torch

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_name = lambda device=None: "NVIDIA H200 [stand-in]"
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    torch.cuda.is_current_stream_capturing = lambda: False
