"""Where the nox sessions take torch from.

PyPI's Linux torch wheels are CUDA builds: torch 2.13.0 for x86_64 is a CUDA 13.0 build that brings
the nvidia-* and cuda-toolkit wheels (about 2.8 GB of downloads in all) and pins triton
3.7.1, so no other Triton installs beside it cleanly. Its CPU build pins no Triton and is about
190 MB, but it is only on PyTorch's own index (download.pytorch.org/whl/cpu), or wherever a site keeps
a copy of the file. A session's torch comes from, in this order:

1. `UV_TORCH_BACKEND` when it is set: the user's choice of PyTorch index, passed on to uv;
2. on a machine with an NVIDIA GPU, for a session that runs on it (the `local` cell): PyPI's build;
3. a CPU torch wheel in the wheelhouse that this interpreter can install (CI, offline sites);
4. PyTorch's CPU index, when it answers within REACH_TIMEOUT_S (uv's `--torch-backend cpu`);
5. otherwise PyPI's build, and the sessions say once that it is the CUDA one, and how large.

The reachability check costs one HEAD request, at most REACH_TIMEOUT_S, once per nox run; without it
a user whose network has only PyPI would get an install error from uv rather than a working, if
large, environment, and a user with PyTorch's index would have to know to ask for it.
"""

from __future__ import annotations

import json
import sys
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.metadata import Metadata
from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

TORCH = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
REACH_TIMEOUT_S = 3.0
BACKEND_ENV = "UV_TORCH_BACKEND"
# measured in a clean container: 2.84 GB downloaded, 2.73 GB of it the CUDA stack
CUDA_BUILD_SIZE = "about 2.8 GB to download, 2.7 GB of it the nvidia-* and cuda-toolkit wheels"


@dataclass(frozen=True)
class TorchSource:
    """What a session installs torch with: the requirement, uv's arguments for where it comes from,
    whether that is the CPU build (None: uv decides, from UV_TORCH_BACKEND), the line that says so,
    and whether it is PyPI's CUDA build taken only because the CPU one could not be had."""

    requirement: str
    install_args: tuple[str, ...]
    cpu_build: bool | None
    description: str
    fallback: bool = False


def cpu_wheel(wheelhouse: Path) -> Path | None:
    """A CPU build of torch TORCH in the wheelhouse that this interpreter can install."""
    supported = set(sys_tags())
    for path in sorted(wheelhouse.glob(f"torch-{TORCH}+*.whl")):
        try:
            _, version, _, tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if version.local == "cpu" and tags & supported:
            return path
    return None


def index_answers(url: str, timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """Whether `url` answers a HEAD request with success within timeout_s."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s) as response:
            return 200 <= response.status < 300
    except (OSError, ValueError):  # no route, no name, TLS, timeout, HTTP errors (URLError is an OSError)
        return False


def _pypi_build(why: str) -> TorchSource:
    if sys.platform != "linux":  # PyPI's macOS and Windows wheels are the CPU builds
        return TorchSource(f"torch=={TORCH}", (), True, f"torch {TORCH} from PyPI (a CPU build on {sys.platform})")
    return TorchSource(
        f"torch=={TORCH}",
        (),
        False,
        f"{why}: installing PyPI's torch {TORCH}, the CUDA build: {CUDA_BUILD_SIZE}",
        fallback=True,
    )


def choose(
    wheelhouse: Path,
    *,
    gpu: bool,
    env: Mapping[str, str],
    answers: Callable[[str], bool] = index_answers,
) -> TorchSource:
    """The torch source of a session (see the module's docstring); `gpu`: the session runs on this
    machine's NVIDIA GPU, so it takes the CUDA build."""
    backend = env.get(BACKEND_ENV)
    if backend:
        return TorchSource(
            f"torch=={TORCH}",
            ("--torch-backend", backend),
            backend == "cpu" or None,
            f"torch {TORCH} from the PyTorch index {BACKEND_ENV}={backend} selects",
        )
    if gpu:
        return TorchSource(f"torch=={TORCH}", (), False, f"torch {TORCH} from PyPI, its CUDA build, for this GPU")
    wheel = cpu_wheel(wheelhouse)
    if wheel is not None:
        version = parse_wheel_filename(wheel.name)[1]
        return TorchSource(
            f"torch=={version}",
            ("--find-links", str(wheel.parent)),
            True,
            f"torch {version} (CPU build) from {wheel}",
        )
    if answers(f"{CPU_INDEX}/torch/"):
        return TorchSource(f"torch=={TORCH}", ("--torch-backend", "cpu"), True, f"torch {TORCH} from {CPU_INDEX}")
    return _pypi_build(f"PyTorch's CPU index ({CPU_INDEX}) did not answer and {wheelhouse} holds no CPU torch wheel")


def cpu_metadata_config(wheel: Path) -> str:
    """A uv configuration that gives torch TORCH the dependencies of this CPU wheel wherever it is
    resolved (uv's dependency-metadata), so that a resolution for every platform takes torch as its
    CPU build: no CUDA stack, no Triton pin. The versions of the wheel's extras are left out."""
    with zipfile.ZipFile(wheel) as archive:
        entry = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        metadata = Metadata.from_email(archive.read(entry), validate=False)
    # an extra's requirements carry `extra == "..."` in their marker; the rest apply to every install
    requires = [str(r) for r in metadata.requires_dist or [] if r.marker is None or "extra" not in str(r.marker)]
    return f'[[dependency-metadata]]\nname = "torch"\nversion = "{TORCH}"\nrequires-dist = {json.dumps(requires)}\n'
