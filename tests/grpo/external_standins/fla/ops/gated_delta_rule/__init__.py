"""Stand-in (see fla/__init__.py): the kernels transformers imports, raising when called."""


def chunk_gated_delta_rule(*args, **kwargs):
    raise RuntimeError("stand-in fla: chunk_gated_delta_rule called")


def fused_recurrent_gated_delta_rule(*args, **kwargs):
    raise RuntimeError("stand-in fla: fused_recurrent_gated_delta_rule called")
