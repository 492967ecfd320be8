"""STAND-IN for fla_npu (tests/standins), NOT the real package.

Reproduces the import-time surface of the fla_npu API generation that GDN_STAND_IN_FLA_NPU names
(standins.profiles): 26.6 registers its ops under torch.ops.npu on import; 26.10 registers nothing
and offers load_legacy_torch_ops(), which raises FileNotFoundError where no legacy extension ships.
Like the real package, it refuses to import before CANN's set_env.sh (ASCEND_HOME_PATH) is sourced.
"""

import os
from pathlib import Path

from standins import legacy, profiles

PROFILE = profiles.active()
__gdn_stand_in__ = PROFILE.label

if not (os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_OPP_PATH")):
    raise RuntimeError(
        "CANN environment is not initialized. Please source the CANN set_env.sh before importing fla_npu."
    )

_legacy_loaded = False

if PROFILE.decoupled:

    def load_legacy_torch_ops() -> Path:
        global _legacy_loaded
        if not PROFILE.legacy_extension:
            raise FileNotFoundError(f"not find custom_aclnn_extension_lib*.so in {Path(__file__).parent}")
        import torch_npu  # noqa: F401 - the real loader preloads torch_npu's libraries first

        legacy.register()
        _legacy_loaded = True
        return Path(legacy.__file__)

    def is_legacy_torch_ops_loaded() -> bool:
        return _legacy_loaded

else:
    import torch_npu  # noqa: F401 - 26.6 loads its extension against torch_npu on import

    legacy.register()
