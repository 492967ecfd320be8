"""Environment manifest of one matrix cell: interpreter, torch, triton flavour and backend, torch_npu,
CANN toolkit and driver, fla_npu and the API generation it exposes, fla, transformers, devices, and
which gdn backend resolves for every op on every device present.

`python -m gdn.probe --json` prints it. A missing or broken package is a finding, not a failure: each
section is computed on its own and an exception becomes {"error": "<ExcType>: <msg>"} in that section.
Only the standard library is imported at module level, so the probe runs however broken the stack is.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import platform
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from gdn.backends.base import describe_error

SCHEMA = 1

ASCEND_ROOT_ENV = "GDN_ASCEND_ROOT"
DEFAULT_ASCEND_ROOT = "/usr/local/Ascend"
TOOLKIT_INFO = "ascend_toolkit_install.info"

TRITON_DISTRIBUTIONS = ("triton", "triton-ascend")
FLA_NPU_DISTRIBUTIONS = ("flash-linear-attention-npu", "fla-npu", "fla_npu")
FLA_DISTRIBUTIONS = ("fla-core", "flash-linear-attention")
FLA_NPU_STABLE_MODULE = "fla_npu.ops.ascendc"
FLA_NPU_COMPOSITE_FWD = "npu_chunk_gated_delta_rule_fwd"
# one of the ops fla_npu 26.6 registers under torch.ops.npu on import
FLA_NPU_LEGACY_OP = "npu_chunk_gated_delta_rule_fwd_h"

Section = dict[str, Any]


def _section(build: Callable[[], Any]) -> Any:
    try:
        return build()
    except Exception as exc:  # a broken package is what the probe reports, never why it stops
        return {"error": describe_error(exc)}


def _guarded(section: Section, key: str, compute: Callable[[], Any]) -> None:
    """Set section[key]; on failure set it to None and record the cause under `<key>_error`."""
    try:
        section[key] = compute()
    except Exception as exc:
        section[key] = None
        section[f"{key}_error"] = describe_error(exc)


def _distribution(*names: str) -> dict[str, str] | None:
    """The first installed distribution among `names` (a package may be published under several)."""
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        return {"name": dist.metadata["Name"] or name, "version": dist.version}
    return None


def _import(module: str) -> tuple[ModuleType | None, Section]:
    try:
        imported = importlib.import_module(module)
    except Exception as exc:
        return None, {"ok": False, "error": describe_error(exc)}
    return imported, {"ok": True, "version": getattr(imported, "__version__", None)}


def python_section() -> Section:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "machine": platform.machine(),
    }


def torch_section() -> Section:
    import torch

    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "debug": torch.version.debug,
    }


def _triton_target(section: Section) -> None:
    try:
        from triton.runtime import driver

        target = driver.active.get_current_target()
    except Exception as exc:  # no GPU or NPU, no driver, or one that fails to initialise
        section.update(active_backend=None, arch=None, active_backend_error=describe_error(exc))
        return
    section.update(active_backend=target.backend, arch=str(target.arch))


def triton_section() -> Section:
    installed = {name: dist["version"] for name in TRITON_DISTRIBUTIONS if (dist := _distribution(name))}
    triton, imported = _import("triton")
    section: Section = {
        # both flavours install the same `triton` package directory, so "triton+triton-ascend" means
        # whichever was installed last won
        "flavour": "+".join(installed) or None,
        "distributions": installed,
        "import": imported,
        # the values triton itself accepts for its boolean knobs
        "interpret": os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on"),
    }
    if triton is None:
        section.update(active_backend=None, arch=None, active_backend_error="triton is not importable")
    else:
        _triton_target(section)
    return section


def _npu_device_names() -> list[str]:
    import torch

    return [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())]


def torch_npu_section() -> Section:
    # torch_npu's import fails without CANN (libhccl.so); _import turns that into the report
    torch_npu, imported = _import("torch_npu")
    section: Section = {"distribution": _distribution("torch_npu"), "import": imported}
    if torch_npu is not None:
        _guarded(section, "devices", _npu_device_names)
        section["device_count"] = len(section["devices"] or [])
    return section


def _read_info(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            pairs[key.strip()] = value.strip()
    return pairs


def _version_file(candidates: Sequence[Path], keys: Sequence[str]) -> Section:
    for path in candidates:
        if path.is_file():
            info = _read_info(path)
            version = next((info[key] for key in keys if key in info), None)
            return {"present": True, "version": version, "path": str(path)}
    return {"present": False, "reason": "not found: " + ", ".join(str(p) for p in candidates)}


def cann_section() -> Section:
    root = Path(os.environ.get(ASCEND_ROOT_ENV) or DEFAULT_ASCEND_ROOT)
    home = os.environ.get("ASCEND_HOME_PATH")
    # set_env.sh points ASCEND_HOME_PATH at the toolkit actually in use, so it wins over the default
    toolkit_dirs = [Path(home)] if home else []
    toolkit_dirs.append(root / "ascend-toolkit" / "latest")
    arch_dir = f"{platform.machine()}-linux"
    toolkit = _version_file([d / arch_dir / TOOLKIT_INFO for d in toolkit_dirs], ("version",))
    driver = _version_file([root / "driver" / "version.info"], ("Version", "version"))
    return {
        "present": toolkit["present"] or driver["present"],
        "root": str(root),
        "ascend_home_path": home,
        "toolkit": toolkit,
        "driver": driver,
    }


def fla_npu_generation(has_loader: bool, stable_api: bool, legacy_registered: bool) -> str:
    """26.10 moved the raw ops to fla_npu.ops.ascendc and put the torch.ops.npu registrations behind
    load_legacy_torch_ops(); 26.6 has no such loader and registers torch.ops.npu.* on import."""
    if has_loader and stable_api:
        return "26.10-stable"
    if not has_loader and legacy_registered:
        return "26.6-legacy"
    return "unknown"


def _legacy_ops_registered() -> bool:
    import torch

    return hasattr(torch.ops.npu, FLA_NPU_LEGACY_OP)


def fla_npu_api(fla_npu: ModuleType) -> Section:
    has_loader = callable(getattr(fla_npu, "load_legacy_torch_ops", None))
    ascendc, stable = _import(FLA_NPU_STABLE_MODULE)
    api: Section = {"load_legacy_torch_ops": has_loader, "legacy_torch_ops_loaded": None}
    is_loaded = getattr(fla_npu, "is_legacy_torch_ops_loaded", None)
    if callable(is_loaded):
        _guarded(api, "legacy_torch_ops_loaded", lambda: bool(is_loaded()))
    api["stable_module"] = stable
    api["composite_fwd"] = ascendc is not None and hasattr(ascendc, FLA_NPU_COMPOSITE_FWD)
    _guarded(api, "legacy_ops_registered", _legacy_ops_registered)
    api["generation"] = fla_npu_generation(has_loader, ascendc is not None, api["legacy_ops_registered"] is True)
    return api


def fla_npu_section() -> Section:
    fla_npu, imported = _import("fla_npu")
    section: Section = {"distribution": _distribution(*FLA_NPU_DISTRIBUTIONS), "import": imported}
    if fla_npu is not None:
        section["api"] = _section(lambda: fla_npu_api(fla_npu))
    return section


def fla_section() -> Section:
    return {"distribution": _distribution(*FLA_DISTRIBUTIONS), "import": _import("fla")[1]}


def transformers_section() -> Section:
    # metadata only: importing transformers costs seconds and tells nothing more here
    return {"distribution": _distribution("transformers")}


def _cuda_devices() -> Section:
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "count": 0, "devices": []}
    devices = [
        {"name": torch.cuda.get_device_name(i), "capability": "{}.{}".format(*torch.cuda.get_device_capability(i))}
        for i in range(torch.cuda.device_count())
    ]
    return {"available": True, "count": len(devices), "devices": devices}


def devices_section(torch_npu: Section) -> Section:
    return {
        "cpu_count": os.cpu_count(),
        "cuda": _section(_cuda_devices),
        "npu": {"count": torch_npu.get("device_count", 0), "names": torch_npu.get("devices") or []},
    }


def gdn_section() -> Section:
    import gdn
    from gdn.resolve import backends, strict

    section: Section = {"version": gdn.__version__}
    _guarded(section, "compute_mode", gdn.compute_mode)
    section["strict"] = strict()
    section["backends"] = list(backends())
    return section


def device_types(torch_npu: Section) -> list[str]:
    import torch

    types = ["cpu"]
    if torch.cuda.is_available():
        types.append("cuda")
    if torch_npu.get("device_count"):
        types.append("npu")
    return types


def resolution_section(torch_npu: Section) -> list[Section]:
    from gdn.op_names import OP_NAMES
    from gdn.resolve import resolve

    records = []
    for op in OP_NAMES:
        for device in device_types(torch_npu):
            try:
                records.append(resolve(op, device).record())
            except Exception as exc:  # strict mode or an invalid mode: the error is the finding
                records.append({"op": op, "device": device, "error": describe_error(exc)})
    return records


def collect_manifest(include_resolution: bool = True) -> dict[str, Any]:
    torch_npu = _section(torch_npu_section)
    manifest: dict[str, Any] = {
        "schema": SCHEMA,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "python": _section(python_section),
        "torch": _section(torch_section),
        "triton": _section(triton_section),
        "torch_npu": torch_npu,
        "cann": _section(cann_section),
        "fla_npu": _section(fla_npu_section),
        "fla": _section(fla_section),
        "transformers": _section(transformers_section),
        "devices": _section(lambda: devices_section(torch_npu)),
        "gdn": _section(gdn_section),
    }
    if include_resolution:
        manifest["resolution"] = _section(lambda: resolution_section(torch_npu))
    return manifest


def _dist_text(dist: dict[str, str] | None) -> str:
    return f"{dist['name']} {dist['version']}" if dist else "not installed"


def _import_text(result: Section) -> str:
    if not result["ok"]:
        return f"import failed: {result['error']}"
    return f"import ok ({result['version']})" if result.get("version") else "import ok"


def _version_text(part: Section) -> str:
    return part["version"] if part["present"] else "absent"


def _triton_text(s: Section) -> str:
    dists = ", ".join(f"{name} {version}" for name, version in s["distributions"].items()) or "not installed"
    backend = s["active_backend"] or f"none ({s['active_backend_error']})"
    return f"{dists}; {_import_text(s['import'])}; backend {backend}; interpret={s['interpret']}"


def _fla_npu_text(s: Section) -> str:
    text = f"{_dist_text(s['distribution'])}; {_import_text(s['import'])}"
    api = s.get("api")
    if api is None:
        return text
    return f"{text}; generation {api.get('generation', api.get('error'))}"


def _devices_text(s: Section) -> str:
    cuda = s["cuda"]
    cuda_text = cuda["error"] if "error" in cuda else f"{cuda['count']} {[d['name'] for d in cuda['devices']]}"
    return f"cpu {s['cpu_count']}; cuda {cuda_text}; npu {s['npu']['count']} {s['npu']['names']}"


def _gdn_text(s: Section) -> str:
    mode = s["compute_mode"] or s["compute_mode_error"]
    return f"{s['version']}; mode {mode}; strict={s['strict']}; backends {s['backends']}"


SUMMARIES: dict[str, Callable[[Section], str]] = {
    "python": lambda s: f"{s['version']} {s['implementation']} on {s['platform']} ({s['executable']})",
    "torch": lambda s: f"{s['version']} (cuda {s['cuda']}, hip {s['hip']}, debug {s['debug']})",
    "triton": _triton_text,
    "torch_npu": lambda s: (
        f"{_dist_text(s['distribution'])}; {_import_text(s['import'])}"
        + (f"; {s['device_count']} device(s)" if "device_count" in s else "")
    ),
    "cann": lambda s: f"toolkit {_version_text(s['toolkit'])}; driver {_version_text(s['driver'])} (root {s['root']})",
    "fla_npu": _fla_npu_text,
    "fla": lambda s: f"{_dist_text(s['distribution'])}; {_import_text(s['import'])}",
    "transformers": lambda s: _dist_text(s["distribution"]),
    "devices": _devices_text,
    "gdn": _gdn_text,
}


def _resolution_line(record: Section) -> str:
    head = f"{record['op']:<40} {record['device']:<5}"
    if "error" in record:
        return f"{head} -> error: {record['error']}"
    line = f"{head} -> {record['route']}"
    if record["rejected"]:
        line += "  (rejected: " + "; ".join(f"{r['backend']}: {r['reason']}" for r in record["rejected"]) + ")"
    return line


def format_summary(manifest: dict[str, Any]) -> str:
    lines = [f"gdn probe (schema {manifest['schema']}) on {manifest['hostname']} at {manifest['generated_at']}"]
    for name, describe in SUMMARIES.items():
        section = manifest[name]
        text = f"error: {section['error']}" if "error" in section else describe(section)
        lines.append(f"{name:<13} {text}")
    resolution = manifest.get("resolution")
    if isinstance(resolution, dict):
        lines.append(f"resolution    error: {resolution['error']}")
    elif resolution is not None:
        lines += ["", "resolution:", *(_resolution_line(r) for r in resolution)]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The probe's flags; `gdn-matrix probe` declares the same ones through this."""
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    parser.add_argument("--mode", help="gdn compute mode to resolve with (default: GDN_COMPUTE_MODE, else auto)")
    parser.add_argument("--output", type=Path, metavar="PATH", help="also write the JSON manifest to PATH")


def run(args: argparse.Namespace) -> int:
    import gdn

    if args.mode is not None:
        try:
            gdn.set_compute_mode(args.mode)
        except ValueError as exc:
            print(f"gdn probe: error: {exc}", file=sys.stderr)
            return 2
    try:
        # packages that print while importing must not corrupt the JSON on stdout
        with contextlib.redirect_stdout(sys.stderr):
            manifest = collect_manifest()
    finally:
        # run() is also called in-process (gdn-matrix, tests), so the mode must not outlive it
        if args.mode is not None:
            gdn.set_compute_mode(None)
    text = json.dumps(manifest, indent=2, default=str)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    print(text if args.json else format_summary(manifest))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gdn.probe", description="Print the environment manifest and gdn's backend resolution."
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
