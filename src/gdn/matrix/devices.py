"""The device kinds a cell can run on, one entry each: what torch calls the device, whether torch sees
one in this process, the file that says a machine has one, how a container gets it, the CI runners that
carry it, the platform its wheels are locked for, and what a cell of the kind needs. Config, the cell
runner, images, the probe, the cell's benchmark, the accuracy command and the report read this table and
nothing else about devices, so a new kind (ROCm, say) is one entry in KINDS and its Dockerfile.

It imports nothing from the rest of the matrix, and torch only when asked what torch sees: every other
matrix module may import it, on a machine without torch too."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# Where the host's /dev, driver and /etc are found; tests point it at a fake tree.
HOST_ROOT_ENV = "GDN_HOST_ROOT"
DOCKER_NEED = "a docker engine"

NPU_CARD = re.compile(r"davinci(\d+)")
NPU_CONTROL_DEVICES = ("dev/davinci_manager", "dev/devmm_svm", "dev/hisi_hdc")
NPU_DRIVER_MOUNTS = (
    "usr/local/dcmi",
    "usr/local/bin/npu-smi",
    "usr/local/Ascend/driver/lib64",
    "usr/local/Ascend/driver/version.info",
    "etc/ascend_install.info",
)


# The labels of GitHub's standard hosted runners (docs.github.com: "GitHub-hosted runners reference").
# GitHub routes by label and a self-hosted runner needs no `self-hosted` label in `runs-on`, so any
# label not on this list may reach a runner of ours: such cells must go to the guarded job. Only labels
# GitHub documents belong here; a hosted label missing from the list merely sends its cell to the
# guarded job, while a custom label on it would open our runners to forks. Retired labels
# (ubuntu-20.04, windows-2019, macos-13) are left out: no hosted runner answers to them any more, so
# only a runner of ours could take such a job.
GITHUB_HOSTED_LABELS = frozenset(
    {
        "ubuntu-latest",
        "ubuntu-24.04",
        "ubuntu-22.04",
        "ubuntu-slim",
        "ubuntu-24.04-arm",
        "ubuntu-22.04-arm",
        "windows-latest",
        "windows-2025",
        "windows-2022",
        "windows-11-arm",
        "macos-latest",
        "macos-26",
        "macos-15",
        "macos-26-intel",
        "macos-15-intel",
    }
)


def github_hosted(labels: Sequence[str]) -> bool:
    """Whether `runs-on: labels` can only be one of GitHub's hosted runners. Labels match without
    regard to case; several labels ask for a runner that has them all, which no hosted runner does."""
    names = {label.lower() for label in labels}
    return len(names) == 1 and names <= GITHUB_HOSTED_LABELS


@dataclass(frozen=True)
class GpuRequest:
    """A docker device request (`--gpus all` is count -1 with the `gpu` capability)."""

    count: int
    capabilities: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class ContainerAccess:
    """What a container needs to use the device: device nodes (`host:container:rwm`), a device request,
    read-only mounts (host path -> container path), environment, and extra groups of its user."""

    devices: tuple[str, ...] = ()
    gpu_request: GpuRequest | None = None
    mounts: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    group_add: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceKind:
    name: str
    torch_type: str
    # Present on a machine that has the device; None: every machine has it.
    host_marker: Path | None
    container: Callable[[Path], ContainerAccess]
    runner_labels: tuple[str, ...]
    lock_platform: str
    # What a cell of this kind needs beyond its runtime, as the end of "needs ...".
    needs: str | None
    # The package that gives torch its module for the device type (torch.npu), imported before asking it.
    torch_extension: str | None = None

    def visible(self) -> bool:
        """Whether torch sees a device of this kind in this process: its module for the device type
        (torch.cpu, torch.cuda, torch.npu) says one is available. An extension that does not import
        (absent, or without its driver) sees none."""
        with contextlib.suppress(Exception):
            import torch

            if self.torch_extension is not None:
                importlib.import_module(self.torch_extension)
            return bool(getattr(torch, self.torch_type).is_available())
        return False

    @property
    def accelerator(self) -> bool:
        return self.host_marker is not None

    def absent_reason(self, host_root: Path | None = None) -> str | None:
        """Why a cell of this kind cannot run on this machine, or None when it can."""
        if self.host_marker is None or (host_root_of(host_root) / self.host_marker.relative_to("/")).exists():
            return None
        return f"{self.host_marker} is absent on this machine: {self.name} cells need {self.needs}"


def host_root_of(host_root: Path | None = None) -> Path:
    return host_root or Path(os.environ.get(HOST_ROOT_ENV) or "/")


def npu_cards(host_root: Path | None = None) -> list[int]:
    root = host_root_of(host_root)
    found = (NPU_CARD.fullmatch(path.name) for path in (root / "dev").glob("davinci[0-9]*"))
    return sorted(int(match.group(1)) for match in found if match)


def _npu_access(root: Path) -> ContainerAccess:
    cards = npu_cards(root)
    devices = [root / "dev" / f"davinci{card}" for card in cards]
    devices += [root / rel for rel in NPU_CONTROL_DEVICES if (root / rel).exists()]
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES") or ",".join(map(str, cards))
    # The devices keep the host's owner in the container: usually the driver's HwHiAiUser group,
    # which the image's non-root user has to join to open them (root's group is never added).
    groups = sorted({device.stat().st_gid for device in devices} - {0})
    return ContainerAccess(
        devices=tuple(f"{device}:/{device.relative_to(root)}:rwm" for device in devices),
        mounts={str(root / rel): f"/{rel}" for rel in NPU_DRIVER_MOUNTS if (root / rel).exists()},
        environment={"ASCEND_RT_VISIBLE_DEVICES": visible} if visible else {},
        group_add=tuple(str(gid) for gid in groups),
    )


def _gpu_access(_root: Path) -> ContainerAccess:
    return ContainerAccess(gpu_request=GpuRequest(count=-1, capabilities=(("gpu",),)))


def _no_access(_root: Path) -> ContainerAccess:
    return ContainerAccess()


KINDS: dict[str, DeviceKind] = {
    kind.name: kind
    for kind in (
        DeviceKind(
            name="cpu",
            torch_type="cpu",
            host_marker=None,
            container=_no_access,
            runner_labels=("ubuntu-24.04",),
            lock_platform="x86_64-manylinux_2_28",
            needs=None,
        ),
        DeviceKind(
            name="cuda",
            torch_type="cuda",
            host_marker=Path("/dev/nvidiactl"),
            container=_gpu_access,
            runner_labels=("self-hosted", "linux", "x64", "gpu"),
            lock_platform="x86_64-manylinux_2_28",
            needs="an NVIDIA GPU (/dev/nvidiactl)",
        ),
        DeviceKind(
            name="npu",
            torch_type="npu",
            torch_extension="torch_npu",
            host_marker=Path("/dev/davinci_manager"),
            container=_npu_access,
            runner_labels=("self-hosted", "linux-aarch64-a2-1"),
            lock_platform="aarch64-manylinux_2_28",
            needs="an Ascend NPU runner (/dev/davinci_manager)",
        ),
    )
}


def kind(name: str) -> DeviceKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"unknown device kind {name!r}; expected one of {list(KINDS)}") from None


def visible_torch_types() -> list[str]:
    """The torch device types of the kinds torch sees in this process, in the table's order (cpu first),
    each once (two kinds may share one: ROCm builds of torch serve the cuda device type)."""
    return list(dict.fromkeys(kind.torch_type for kind in KINDS.values() if kind.visible()))


def visible_accelerator() -> str | None:
    """The torch device type of the first accelerator kind torch sees in this process, or None."""
    return next((kind.torch_type for kind in KINDS.values() if kind.accelerator and kind.visible()), None)


def needs_text(device: str, runtime: str) -> str:
    """What a cell needs in order to run: its device and, in a container, a docker engine."""
    needs = [need for need in (kind(device).needs, DOCKER_NEED if runtime == "docker" else None) if need]
    if not needs:
        return "needs only a Python environment with gdn installed"
    return "needs " + " and ".join(needs)
