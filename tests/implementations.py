"""One backend's implementation of one op, as the tests that hand validated calls to each backend
take it; the test is skipped where the backend is unavailable or does not serve the op."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from gdn.resolve import backends


def implementation(backend: str, op: str, device: str) -> Callable:
    found = backends()[backend]
    reason = found.why_unavailable(torch.device(device).type)
    if reason:
        pytest.skip(f"{backend} is unavailable here: {reason}")
    impl = found.implementation(op)
    if impl is None:
        pytest.skip(f"{backend} does not serve {op}")
    return impl
