"""Where the nox sessions take torch from (gdn.matrix.torch_source): the CPU build wherever it can be
had, PyPI's CUDA build said plainly otherwise, and the reachability check bounded in time."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
import time
import zipfile

import pytest
from packaging.tags import sys_tags

from gdn.matrix import torch_source
from gdn.matrix.torch_source import TORCH, choose, cpu_metadata_config, cpu_wheel, index_answers
from repo_paths import ROOT

pytestmark = pytest.mark.tooling

LINUX = sys.platform == "linux"


def wheel_name(version: str = f"{TORCH}+cpu", *, tag=None) -> str:
    tag = tag or next(iter(sys_tags()))
    return f"torch-{version}-{tag.interpreter}-{tag.abi}-{tag.platform}.whl"


def unreachable(url: str) -> bool:
    raise AssertionError(f"the index {url} was asked although the source was already known")


def test_a_cpu_wheel_for_this_interpreter_in_the_wheelhouse_is_taken_without_asking_the_network(tmp_path):
    (tmp_path / wheel_name()).write_bytes(b"")
    source = choose(tmp_path, gpu=False, env={}, answers=unreachable)
    assert source.requirement == f"torch=={TORCH}+cpu"
    assert source.install_args == ("--find-links", str(tmp_path))
    assert source.cpu_build is True


def test_wheels_this_interpreter_cannot_install_or_of_other_builds_are_passed_over(tmp_path):
    other_python = next(iter(sys_tags())).__class__("cp39", "cp39", "win_arm64")
    (tmp_path / wheel_name(tag=other_python)).write_bytes(b"")
    (tmp_path / wheel_name(f"{TORCH}+cu130")).write_bytes(b"")
    (tmp_path / wheel_name("2.12.0+cpu")).write_bytes(b"")
    assert cpu_wheel(tmp_path) is None
    asked = []
    source = choose(tmp_path, gpu=False, env={}, answers=lambda url: asked.append(url) or True)
    assert asked == [f"{torch_source.CPU_INDEX}/torch/"]
    assert (source.requirement, source.install_args, source.cpu_build) == (
        f"torch=={TORCH}",
        ("--torch-backend", "cpu"),
        True,
    )


@pytest.mark.skipif(not LINUX, reason="PyPI's torch is a CUDA build on Linux only")
def test_without_the_cpu_index_or_a_wheel_the_cuda_build_is_named_with_its_size(tmp_path):
    source = choose(tmp_path, gpu=False, env={}, answers=lambda url: False)
    assert (source.requirement, source.install_args, source.cpu_build) == (f"torch=={TORCH}", (), False)
    assert source.fallback
    assert "CUDA build" in source.description and "2.8 GB" in source.description
    assert torch_source.CPU_INDEX in source.description and str(tmp_path) in source.description


@pytest.mark.skipif(not LINUX, reason="PyPI's torch is a CUDA build on Linux only")
def test_a_gpu_session_takes_pypis_cuda_build_even_beside_a_cpu_wheel(tmp_path):
    (tmp_path / wheel_name()).write_bytes(b"")
    source = choose(tmp_path, gpu=True, env={}, answers=unreachable)
    assert (source.requirement, source.install_args, source.cpu_build) == (f"torch=={TORCH}", (), False)
    assert not source.fallback


@pytest.mark.parametrize(("backend", "cpu_build"), [("cpu", True), ("cu130", None), ("auto", None)])
def test_uv_torch_backend_is_the_users_choice_over_everything(tmp_path, backend, cpu_build):
    (tmp_path / wheel_name()).write_bytes(b"")
    source = choose(tmp_path, gpu=True, env={"UV_TORCH_BACKEND": backend}, answers=unreachable)
    assert (source.install_args, source.cpu_build) == (("--torch-backend", backend), cpu_build)


class _Index(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(200 if self.path == "/whl/cpu/torch/" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_index_check_answers_true_only_for_a_successful_head_request():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert index_answers(f"{base}/whl/cpu/torch/")
        assert not index_answers(f"{base}/nothing/")
    finally:
        server.shutdown()


def test_the_index_check_gives_up_within_its_timeout_on_a_silent_host():
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        started = time.monotonic()
        assert not index_answers(f"http://127.0.0.1:{silent.getsockname()[1]}/torch/", timeout_s=0.5)
        assert time.monotonic() - started < 3


def test_the_constraints_resolution_sees_torch_as_its_cpu_wheel(tmp_path):
    """uv's dependency-metadata for torch is the wheel's own Requires-Dist, without its extras'."""
    wheel = tmp_path / wheel_name()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(
            f"torch-{TORCH}+cpu.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\nRequires-Dist: filelock\n"
            'Requires-Dist: sympy>=1.13.3\nRequires-Dist: optree>=0.13.0; extra == "optree"\n',
        )
    config = cpu_metadata_config(wheel)
    assert f'name = "torch"\nversion = "{TORCH}"\n' in config
    assert 'requires-dist = ["filelock", "sympy>=1.13.3"]' in config


def test_the_sessions_constraints_pin_the_project_with_torchs_cpu_closure():
    """constraints/sessions.txt pins every requirement of the extras the sessions install, at versions
    that satisfy pyproject.toml, and torch as TORCH without the CUDA stack or a Triton."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib")
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    root = ROOT
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    pinned: dict[str, str] = {}
    for line in (root / "constraints" / "sessions.txt").read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate(default_environment()):
                pinned[canonicalize_name(requirement.name)] = str(next(iter(requirement.specifier)).version)
    assert pinned.get("torch") == TORCH
    assert not [name for name in pinned if name.startswith(("nvidia-", "cuda-")) or name == "triton"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["test"]]
    wanted += project["optional-dependencies"]["matrix"]
    for text in wanted:
        requirement = Requirement(text)
        version = pinned.get(canonicalize_name(requirement.name))
        assert version is not None, f"{requirement.name} is not pinned in constraints/sessions.txt"
        assert requirement.specifier.contains(version, prereleases=True), f"{requirement.name}=={version} vs {text}"
