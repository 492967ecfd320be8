"""Runs a child process that sees one stand-in fla_npu generation.

torch.ops registrations and a loaded fla_npu are process-global, so every generation gets a process
of its own: PYTHONPATH carries the stand-in site/ (fla_npu, torch_npu), tests/ (the `standins`
package) and a dist-info with the generation's version; a fake CANN tree plays the sourced set_env.sh.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from repo_paths import TESTS
from standins import profiles

SITE = Path(__file__).parent / "site"
CANN_VERSION = "9.1.0"
DRIVER_VERSION = "25.2.0"
# what the parent's environment must not leak into a child (each test sets what it means to)
CONTROLLED = (
    "GDN_COMPUTE_MODE",
    "GDN_STRICT",
    "GDN_NPU_FUSED_FWD",
    "GDN_ASCEND_ROOT",
    "ASCEND_HOME_PATH",
    "ASCEND_OPP_PATH",
    "TRITON_INTERPRET",
    profiles.ENV,
    profiles.TORCH_NPU_ENV,
)
# The child sees the stand-in's device and nothing else, whatever accelerators the machine has: with a
# GPU visible, the manifest would also resolve every op on cuda, where the stand-in routes cannot
# serve. `import torch` autoloads the torch_npu distribution's entry point (torch_npu:_autoload),
# which would find the stand-in module, which has none, and fail the import; the stand-in is loaded
# by its own import instead.
HIDDEN_DEVICES = {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}


def environment(root: Path, profile: str | None, *, cann: bool = True, **extra: str) -> dict[str, str]:
    """The child's environment, with the dist-info and the CANN tree written under `root`."""
    env = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
    paths = [str(SITE), str(TESTS)]
    if profile is not None:
        dist = root / "dist" / f"flash_linear_attention_npu-{profiles.PROFILES[profile].version}.dist-info"
        dist.mkdir(parents=True)
        version = profiles.PROFILES[profile].version
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flash-linear-attention-npu\nVersion: {version}\n")
        paths.append(str(root / "dist"))
        env[profiles.ENV] = profile
    ascend = root / "Ascend"
    env["GDN_ASCEND_ROOT"] = str(ascend)
    if cann:
        toolkit = ascend / "ascend-toolkit" / "latest"
        info = toolkit / f"{platform.machine()}-linux" / "ascend_toolkit_install.info"
        info.parent.mkdir(parents=True)
        info.write_text(f"package_name=Ascend-cann-toolkit\nversion={CANN_VERSION}\n")
        (ascend / "driver").mkdir()
        (ascend / "driver" / "version.info").write_text(f"Version={DRIVER_VERSION}\n")
        env["ASCEND_HOME_PATH"] = str(toolkit)  # what sourcing set_env.sh sets
    # keep the caller's PYTHONPATH: in a matrix cell gdn itself is found through it (/src/src)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    # the tensors are tiny: intra-op threads only add spin-waits, badly so on a busy machine
    env["OMP_NUM_THREADS"] = "1"
    return env | HIDDEN_DEVICES | extra


def run_json(env: dict[str, str], *module_args: str) -> dict[str, Any]:
    """Runs `python -m <module_args> --output FILE` and reads the JSON the module wrote to FILE.

    A file, not stdout: a library the child imports may print there (TileLang reports on stdout that
    it could not query torch.npu), and the child's result must survive whatever else is installed."""
    with tempfile.TemporaryDirectory(prefix="gdn-child-") as tmp:
        output = Path(tmp) / "result.json"
        command = [sys.executable, "-m", *module_args, "--output", str(output)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"{module_args} exited {done.returncode}:\n{done.stderr[-4000:]}")
        return json.loads(output.read_text())
