"""The probe: the environment manifest of one matrix cell (manifest.json): interpreter, torch, CANN
toolkit and driver, transformers, devices, what each backend says about itself (Backend.describe: the
triton flavour and target, torch_npu, fla_npu and the API generation it exposes with the ascendc routes,
fla and its own dispatch), which gdn backend resolves for every op on every device present, and the
wheel-compat checks read from all of it.

`python -m gdn.matrix.probe --json` (also `python -m gdn.manifest` and `gdn-matrix manifest`) prints it.
A missing or broken package is a finding, not a failure: each section is computed on its own and an
exception becomes {"error": "<ExcType>: <msg>"} in that section. Only the standard library is imported
at module level, so the manifest is written however broken the stack is; where torch itself does not
import, the backends cannot be listed, and each section they describe holds that error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import socket
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gdn.backends.base import describe_error
from gdn.backends.findings import Section, distribution, guarded, section_of
from gdn.backends.fla_choices import fla_kernel, kernel_text
from gdn.matrix.devices import KINDS, DeviceKind, visible_torch_types
from gdn.matrix.program import Program

SCHEMA = 1
# The manifest's sections in their order, which is also the order they are computed in (torch_npu is
# imported after triton's driver is asked for its target, fla_npu before the ascendc routes load from
# it). The probe builds its own sections; the others are those the registered backends describe
# (Backend.describe), and one that this order does not name comes after the probe's own.
LAYOUT = (
    "python",
    "torch",
    "triton",
    "torch_npu",
    "cann",
    "fla_npu",
    "ascendc",
    "fla",
    "transformers",
    "devices",
    "gdn",
)

ASCEND_ROOT_ENV = "GDN_ASCEND_ROOT"
DEFAULT_ASCEND_ROOT = "/usr/local/Ascend"
TOOLKIT_INFO = "ascend_toolkit_install.info"


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
        # set_env.sh sets these; fla_npu refuses to import without one of them
        "ascend_opp_path": os.environ.get("ASCEND_OPP_PATH"),
        "toolkit": toolkit,
        "driver": driver,
    }


def transformers_section() -> Section:
    # metadata only: importing transformers costs seconds and tells nothing more here
    return {"distribution": distribution("transformers")}


def _cuda_devices() -> Section:
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "count": 0, "devices": []}
    devices = [
        {"name": torch.cuda.get_device_name(i), "capability": "{}.{}".format(*torch.cuda.get_device_capability(i))}
        for i in range(torch.cuda.device_count())
    ]
    return {"available": True, "count": len(devices), "devices": devices}


def _torch_devices(kind: DeviceKind) -> Section:
    """The devices of a kind the probe has no builder of its own for, as torch's module for its device
    type names them."""
    if not kind.visible():
        return {"available": False, "count": 0, "devices": []}
    import torch

    module = getattr(torch, kind.torch_type)
    devices = [{"name": module.get_device_name(i)} for i in range(module.device_count())]
    return {"available": True, "count": len(devices), "devices": devices}


def devices_section(torch_npu: Section) -> Section:
    # npu shaped like cuda, so that a card's name is found the same way for every device kind
    npu = [{"name": name} for name in torch_npu.get("devices") or []]
    section: Section = {
        "cpu_count": os.cpu_count(),
        "cuda": section_of(_cuda_devices),
        "npu": {"count": torch_npu.get("device_count", 0), "devices": npu},
    }
    for kind in KINDS.values():  # a kind added to the table: its cards the same way
        if kind.accelerator and kind.torch_type not in section:
            section[kind.torch_type] = section_of(lambda kind=kind: _torch_devices(kind))
    return section


def gdn_section() -> Section:
    import gdn
    from gdn.errors import strict
    from gdn.resolve import backends

    section: Section = {"version": gdn.__version__}
    guarded(section, "compute_mode", gdn.compute_mode)
    section["strict"] = strict()
    section["backends"] = list(backends())
    return section


def resolution_section() -> list[Section]:
    """The resolution of every op on every device type torch sees (gdn.matrix.devices)."""
    from gdn.op_names import OP_NAMES
    from gdn.resolve import resolve

    records = []
    for op in OP_NAMES:
        for device in visible_torch_types():
            try:
                records.append(resolve(op, device).record())
            except Exception as exc:  # strict mode or an invalid mode: the error is the finding
                records.append({"op": op, "device": device, "error": describe_error(exc)})
    return records


# ---------------------------------------------------------------- wheel-compat checks
# Each check reads the sections above and gives a verdict: ok, warn (works, degraded or worth a
# look), fail (broken: an NPU stack piece that cannot work, a kernel rejected by its numeric probe)
# or n/a (the piece is not part of this cell's stack).

Check = dict[str, str]
HINTS = {
    "libhccl.so": "CANN's libraries are not on the loader path: install CANN and source its set_env.sh",
    "set_env.sh": "source CANN's set_env.sh before importing fla_npu",
}


def _check(name: str, verdict: str, detail: str) -> Check:
    return {"name": name, "verdict": verdict, "detail": detail}


def _ok(section: Any) -> bool:
    return isinstance(section, dict) and "error" not in section


def _not_installed(section: Section) -> bool:
    return section.get("distribution") is None and str(section["import"].get("error", "")).startswith(
        "ModuleNotFoundError"
    )


def _with_hint(error: str) -> str:
    hints = [hint for marker, hint in HINTS.items() if marker in error]
    return error + (f" ({hints[0]})" if hints else "")


def _stand_in_note(section: Section) -> str:
    return f" [stand-in: {section['stand_in']}]" if section.get("stand_in") else ""


def _npu_stack(m: dict[str, Any]) -> bool:
    """Whether this cell carries an Ascend stack (then a missing piece of it is a failure)."""
    return any(_ok(m[name]) and not _not_installed(m[name]) for name in ("torch_npu", "fla_npu"))


def _cann_checks(m: dict[str, Any], missing: str) -> list[Check]:
    cann = m["cann"]
    if not _ok(cann):
        return [_check("cann", "fail", cann["error"])]
    checks = []
    for name, part in (("cann_toolkit", cann["toolkit"]), ("npu_driver", cann["driver"])):
        if part["present"]:
            checks.append(_check(name, "ok", f"{part['version']} ({part['path']})"))
        else:
            checks.append(_check(name, missing, part["reason"]))
    sourced = cann["ascend_home_path"] or cann["ascend_opp_path"]
    env = "set_env.sh sourced" if sourced else "set_env.sh not sourced: ASCEND_HOME_PATH and ASCEND_OPP_PATH unset"
    checks.append(_check("cann_env", "ok" if sourced else missing, env))
    return checks


def _package_check(name: str, section: Any, describe: Callable[[Section], str]) -> Check:
    if not _ok(section):
        return _check(name, "fail", section["error"])
    if _not_installed(section):
        return _check(name, "n/a", "not installed")
    if not section["import"]["ok"]:
        return _check(name, "fail", "import failed: " + _with_hint(section["import"]["error"]))
    return _check(name, "ok", describe(section) + _stand_in_note(section))


def _installed_text(section: Section) -> str:
    dist = section["distribution"]
    return _dist_text(dist) if dist else "imports (no distribution metadata)"


def _npu_devices_check(m: dict[str, Any]) -> Check:
    torch_npu = m["torch_npu"]
    if not _ok(torch_npu) or not torch_npu["import"]["ok"]:
        return _check("npu_devices", "n/a", "torch_npu does not import")
    if torch_npu.get("device_count"):
        return _check("npu_devices", "ok", f"{torch_npu['device_count']} x {torch_npu['devices'][0]}")
    return _check("npu_devices", "warn", "torch_npu imports but sees no NPU" + _stand_in_note(torch_npu))


def _triton_ascend_check(m: dict[str, Any], npu: bool) -> Check:
    triton = m["triton"]
    if not npu:
        return _check("triton_ascend", "n/a", "no Ascend stack")
    if not _ok(triton):
        return _check("triton_ascend", "fail", triton["error"])
    installed = triton["distributions"]
    if "triton-ascend" not in installed:
        return _check("triton_ascend", "warn", "not installed: the triton backend cannot target the NPU")
    if "triton" in installed:
        return _check(
            "triton_ascend", "warn", f"both triton and triton-ascend installed ({triton['flavour']}): the last wins"
        )
    return _check("triton_ascend", "ok", installed["triton-ascend"])


def _fla_npu_api_check(fla_npu: Any) -> Check:
    api = fla_npu.get("api") if _ok(fla_npu) else None
    if api is None:
        return _check("fla_npu_api", "n/a", "fla_npu does not import")
    if "error" in api:
        return _check("fla_npu_api", "fail", api["error"])
    generation = api["generation"]
    return _check("fla_npu_api", "warn" if generation == "unknown" else "ok", f"generation {generation}")


def _ascendc_checks(m: dict[str, Any]) -> list[Check]:
    plan = m["ascendc"]
    if not _ok(plan):
        return [_check("ascendc", "fail", plan["error"])]
    if "reason" in plan:
        return [_check("ascendc", "n/a", plan["reason"])]
    surface = plan["surface"]
    if surface["import_error"]:
        return [_check("ascendc", "n/a", f"fla_npu does not import: {surface['import_error']}")]
    legacy = surface["legacy_torch_ops"]
    checks = [
        _check(
            "fla_npu_legacy_extension",
            "ok" if surface["legacy_loaded"] else "warn",
            legacy if surface["legacy_loaded"] else f"{legacy} (torch.ops.npu.* callers fail; the stable API serves)",
        )
    ]
    chunk = plan["routes"].get("chunk_gated_delta_rule", {})
    composite = [r["reason"] for r in chunk.get("rejected", []) if r["route"].endswith("composite-fwd")]
    if chunk.get("route", "").endswith("composite-fwd"):
        checks.append(_check("fla_npu_composite_fwd", "ok", chunk["detail"]))
    else:
        why = composite[0] if composite else "the chunk op has no route"
        verdict = "n/a"
        if plan["fused_fwd"].endswith("=1"):  # asked for and missing: GDN_STRICT=1 refuses to serve then
            verdict = "fail" if _ok(m["gdn"]) and m["gdn"]["strict"] else "warn"
        checks.append(_check("fla_npu_composite_fwd", verdict, f"{plan['fused_fwd']}: {why}"))
    for op, entry in plan["routes"].items():
        probed = [r for r in entry["rejected"] if r["probe"] is not None]
        others = "; ".join(f"{r['route']}: {r['reason']}" for r in entry["rejected"])
        if entry["route"] is None:
            verdict = "fail" if probed else "warn"
            checks.append(_check(f"ascendc_route:{op}", verdict, f"no route, another backend serves ({others})"))
        else:
            verdict = "warn" if probed else "ok"
            checks.append(_check(f"ascendc_route:{op}", verdict, entry["route"] + (f" ({others})" if others else "")))
    return checks


def checks_section(m: dict[str, Any]) -> list[Check]:
    npu = _npu_stack(m)
    missing = "fail" if npu else "n/a"
    return [
        *_cann_checks(m, missing),
        _package_check("torch_npu", m["torch_npu"], _installed_text),
        _npu_devices_check(m),
        _triton_ascend_check(m, npu),
        _package_check("fla_npu", m["fla_npu"], _installed_text),
        _fla_npu_api_check(m["fla_npu"]),
        *_ascendc_checks(m),
    ]


def described_sections() -> dict[str, Callable[[], Any]]:
    """The sections the registered backends describe (Backend.describe), in registration order. A
    backend whose description fails has one section, under its name, that says why."""
    from gdn.resolve import backends

    described: dict[str, Callable[[], Any]] = {}
    for backend in backends().values():
        try:
            described.update(backend.describe())
        except Exception as exc:
            error = {"error": describe_error(exc)}
            described[backend.name] = lambda error=error: error
    return described


def _undescribed() -> Section:
    raise LookupError("no registered backend describes this section")


def collect_manifest(include_resolution: bool = True) -> dict[str, Any]:
    manifest: dict[str, Any] = {
        "schema": SCHEMA,
        "generated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
    }
    builders: dict[str, Callable[[], Any]] = {
        "python": python_section,
        "torch": torch_section,
        "cann": cann_section,
        "transformers": transformers_section,
        "devices": lambda: devices_section(manifest["torch_npu"]),
        "gdn": gdn_section,
    }
    described = section_of(described_sections)
    if "error" in described:  # the backends cannot be listed (torch itself broken): their sections say why
        unlisted = described
        described = {name: (lambda: unlisted) for name in LAYOUT if name not in builders}
    builders = {**described, **builders}
    for name in [*LAYOUT, *(name for name in builders if name not in LAYOUT)]:
        manifest[name] = section_of(builders.get(name, _undescribed))
    manifest["checks"] = section_of(lambda: checks_section(manifest))
    if include_resolution:
        manifest["resolution"] = section_of(resolution_section)
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
    text = f"{_dist_text(s['distribution'])}; {_import_text(s['import'])}{_stand_in_note(s)}"
    api = s.get("api")
    if api is None:
        return text
    return f"{text}; generation {api.get('generation', api.get('error'))}"


def _ascendc_text(s: Section) -> str:
    if "reason" in s:
        return f"not active: {s['reason']}"
    routes = ", ".join(f"{op} -> {entry['route'] or 'none'}" for op, entry in s["routes"].items())
    return f"{s['surface']['generation']}; {routes or s['surface']['import_error']}"


def fla_kernel_text(s: Section) -> str | None:
    """The kernels fla runs per dtype and whether the Hopper guard stops a backward, in one line."""
    if not isinstance(s.get("dispatch"), dict):
        return None
    return kernel_text(fla_kernel({"fla": s}))


def _fla_text(s: Section) -> str:
    text = f"{_dist_text(s['distribution'])}; {_import_text(s['import'])}{_stand_in_note(s)}"
    peers = ", ".join(f"{name} {version}" for name, version in (s.get("peer_packages") or {}).items() if version)
    kernel = fla_kernel_text(s)
    return text + (f"; {kernel}" if kernel else "") + (f"; beside {peers}" if peers else "")


def _devices_text(s: Section) -> str:
    cuda = s["cuda"]
    cuda_text = cuda["error"] if "error" in cuda else f"{cuda['count']} {[d['name'] for d in cuda['devices']]}"
    return f"cpu {s['cpu_count']}; cuda {cuda_text}; npu {s['npu']['count']} {[d['name'] for d in s['npu']['devices']]}"


def _gdn_text(s: Section) -> str:
    mode = s["compute_mode"] or s["compute_mode_error"]
    return f"{s['version']}; mode {mode}; strict={s['strict']}; backends {s['backends']}"


SUMMARIES: dict[str, Callable[[Section], str]] = {
    "python": lambda s: f"{s['version']} {s['implementation']} on {s['platform']} ({s['executable']})",
    "torch": lambda s: f"{s['version']} (cuda {s['cuda']}, hip {s['hip']}, debug {s['debug']})",
    "triton": _triton_text,
    "torch_npu": lambda s: (
        f"{_dist_text(s['distribution'])}; {_import_text(s['import'])}{_stand_in_note(s)}"
        + (f"; {s['device_count']} device(s)" if "device_count" in s else "")
    ),
    "cann": lambda s: f"toolkit {_version_text(s['toolkit'])}; driver {_version_text(s['driver'])} (root {s['root']})",
    "fla_npu": _fla_npu_text,
    "ascendc": _ascendc_text,
    "fla": _fla_text,
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
    lines = [f"gdn manifest (schema {manifest['schema']}) on {manifest['hostname']} at {manifest['generated_at']}"]
    for name, describe in SUMMARIES.items():
        section = manifest[name]
        text = f"error: {section['error']}" if "error" in section else describe(section)
        lines.append(f"{name:<13} {text}")
    checks = manifest["checks"]
    if isinstance(checks, dict):
        lines.append(f"checks        error: {checks['error']}")
    else:
        lines += ["", "checks:", *(f"{c['verdict']:<5} {c['name']}: {c['detail']}" for c in checks)]
    resolution = manifest.get("resolution")
    if isinstance(resolution, dict):
        lines.append(f"resolution    error: {resolution['error']}")
    elif resolution is not None:
        lines += ["", "resolution:", *(_resolution_line(r) for r in resolution)]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The manifest's flags; `gdn-matrix manifest` declares the same ones through this."""
    parser.add_argument("--json", action="store_true", help="print the manifest as JSON")
    parser.add_argument("--mode", help="gdn compute mode to resolve with (default: GDN_COMPUTE_MODE, else auto)")
    parser.add_argument("--output", type=Path, metavar="PATH", help="also write the JSON manifest to PATH")


def run(args: argparse.Namespace) -> int:
    import gdn

    if args.mode is not None:
        try:
            gdn.set_compute_mode(args.mode)
        except ValueError as exc:
            print(f"gdn manifest: error: {exc}", file=sys.stderr)
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


PROGRAM = Program(
    "python -m gdn.matrix.probe", "Print the environment manifest and gdn's backend resolution.", add_arguments, run
)
main = PROGRAM.main


if __name__ == "__main__":
    sys.exit(main())
