"""The fla_npu API generations the stand-in reproduces; GDN_STAND_IN_FLA_NPU picks one per process."""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "GDN_STAND_IN_FLA_NPU"
TORCH_NPU_ENV = "GDN_STAND_IN_TORCH_NPU"  # "missing-cann": import fails the way it does without CANN


@dataclass(frozen=True)
class Profile:
    label: str  # the stand-in's __gdn_stand_in__
    version: str  # the distribution version it reports
    decoupled: bool  # 26.10: load_legacy_torch_ops() exists and import registers nothing
    legacy_extension: bool  # torch.ops.npu ops ship (26.6: registered on import; 26.10: by the loader)
    composite: bool = False  # fla_npu.ops.ascendc.npu_chunk_gated_delta_rule_fwd
    broken_conv: bool = False  # the stable conv returns zeros for ones and garbage otherwise


PROFILES = {
    "26.6": Profile("fla_npu 26.6 (legacy torch.ops.npu on import)", "26.6.0", decoupled=False, legacy_extension=True),
    "26.10": Profile("fla_npu 26.10 (stable API + legacy extension)", "26.10.0", decoupled=True, legacy_extension=True),
    "26.10-no-legacy": Profile(
        "fla_npu 26.10 (stable API, no legacy extension)", "26.10.0", decoupled=True, legacy_extension=False
    ),
    "26.10-composite": Profile(
        "fla_npu 26.10 (composite)", "26.10.0", decoupled=True, legacy_extension=False, composite=True
    ),
    "26.10-broken-conv": Profile(
        "fla_npu 26.10.0+dev (broken stable conv, legacy extension)",
        "26.10.0+dev",
        decoupled=True,
        legacy_extension=True,
        broken_conv=True,
    ),
    "26.10-broken-conv-no-legacy": Profile(
        "fla_npu 26.10.0+dev (broken stable conv, no legacy extension)",
        "26.10.0+dev",
        decoupled=True,
        legacy_extension=False,
        broken_conv=True,
    ),
}


def active() -> Profile:
    name = os.environ.get(ENV)
    if name not in PROFILES:
        raise ImportError(f"the fla_npu stand-in needs {ENV} set to one of {sorted(PROFILES)}, got {name!r}")
    return PROFILES[name]
