"""gdn.matrix.images without a docker engine: content-hash tags, device passthrough per device kind
against a fake host tree, and build/run driven through a fake client."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from gdn.matrix import devices, images
from gdn.matrix.config import Cell, Versions
from gdn.matrix.lockfile import NOT_RECORDED, render_header

pytestmark = pytest.mark.tooling
# Cell images collect tests/ too (then deselect by marker) and carry no docker SDK.
docker = pytest.importorskip("docker", reason="the docker SDK (the matrix extra) is not installed")

WHEEL = "flash_linear_attention_npu-26.10.0-py3-none-any.whl"
BASE_ID = "sha256:" + "b" * 64
INDEX_ENV = {
    "PIP_INDEX_URL": "https://user:token@mirror.example/simple",
    "PIP_EXTRA_INDEX_URL": "https://user:token@extra.example/simple",
    "PIP_TRUSTED_HOST": "mirror.example",
}
WHEEL_BYTES = b"wheel v1"


def lock_text(cell: str = "cpu-cell", wheel: bytes | None = WHEEL_BYTES) -> str:
    """A whole lock of make_cell()'s pins; the wheelhouse file's hash recorded unless `wheel` is None."""
    body = f"torch==2.13.0 \\\n    --hash=sha256:{'a' * 64}\n"
    fields = [("cell", cell), ("platform", "x86_64-manylinux_2_28"), ("python", "3.11"), ("uv", "0.13.9")]
    fields.append(("inputs", "sha256:" + "0" * 64))
    if wheel is None:
        fields.append(("wheelhouse", f"{WHEEL} {NOT_RECORDED}"))
    else:
        sha = hashlib.sha256(wheel).hexdigest()
        fields.append(("wheelhouse", f"{WHEEL} sha256:{sha}"))
        body += f"flash-linear-attention-npu==26.10.0 \\\n    --hash=sha256:{sha}\n"
    return render_header(fields, body, cell) + body


def make_cell(device: str = "cpu", **changes: Any) -> Cell:
    fields: dict[str, Any] = {
        "name": f"{device}-cell",
        "device": device,
        "runtime": "docker",
        "dockerfile": f"docker/{device}.Dockerfile",
        "base_image": "base:1",
        "versions": Versions(python="3.11", torch="2.13.0", fla_npu="26.10.0"),
        "wheels": (WHEEL,),
        "wheelhouse_pins": ("fla_npu",),
        "timeout_s": 60,
    }
    return Cell(**{**fields, **changes})


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """A Dockerfile, a lock and a wheel (the cell's files) and the other context files, all on disk."""
    (tmp_path / "wheelhouse").mkdir()
    files = {
        "dockerfile": tmp_path / "cpu.Dockerfile",
        "lock": tmp_path / "cpu-cell.txt",
        "wheels[0]": tmp_path / "wheelhouse" / WHEEL,
    }
    files["dockerfile"].write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\n")
    files["lock"].write_text(lock_text())
    files["wheels[0]"].write_bytes(WHEEL_BYTES)
    extras = {"ca-bundle.crt": tmp_path / "ca.crt"}
    extras["ca-bundle.crt"].write_text("-----BEGIN CERTIFICATE-----\n")
    return files, extras


@pytest.fixture(autouse=True)
def _no_index_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*INDEX_ENV, "ASCEND_RT_VISIBLE_DEVICES", devices.HOST_ROOT_ENV):
        monkeypatch.delenv(name, raising=False)


def tag_of(cell: Cell, files: dict[str, Path], extras: dict[str, Path], base_id: str = BASE_ID) -> str:
    return images.image_tag(cell, images.content_hash(cell, files, extras, base_id))


def test_tag_is_a_stable_content_hash(inputs, tmp_path: Path) -> None:
    files, extras = inputs
    tag = tag_of(make_cell(), files, extras)
    assert re.fullmatch(r"gdn-matrix/cpu-cell:[0-9a-f]{12}", tag)
    assert tag_of(make_cell(), files, extras) == tag
    # The same wheel from another wheelhouse: same content, same image.
    moved = tmp_path / "elsewhere" / WHEEL
    moved.parent.mkdir()
    shutil.copyfile(files["wheels[0]"], moved)
    assert tag_of(make_cell(), {**files, "wheels[0]": moved}, extras) == tag


@pytest.mark.parametrize(
    "change",
    ["dockerfile", "lock", "python", "base_image", "base_content", "wheel_content", "wheel_name", "ca_bundle"],
)
def test_tag_changes_with_what_goes_into_the_image(inputs, tmp_path: Path, change: str) -> None:
    files, extras = inputs
    cell = make_cell()
    base_id = BASE_ID
    before = tag_of(cell, files, extras)
    if change == "dockerfile":
        files["dockerfile"].write_text(files["dockerfile"].read_text() + "RUN true\n")
    elif change == "lock":
        files["lock"].write_text(files["lock"].read_text().replace("torch==2.13.0", "torch==2.12.0"))
    elif change == "python":
        cell = make_cell(versions=Versions(python="3.12", torch="2.13.0", fla_npu="26.10.0"))
    elif change == "base_image":
        cell = make_cell(base_image="base:2")
    elif change == "base_content":  # the same base tag, rebuilt or re-imported with other content
        base_id = "sha256:" + "c" * 64
    elif change == "wheel_content":
        files["wheels[0]"].write_bytes(b"wheel v2")
    elif change == "wheel_name":
        renamed = files["wheels[0]"].with_name("fla_npu-26.10.1-py3-none-any.whl")
        files["wheels[0]"].rename(renamed)
        files["wheels[0]"] = renamed
    elif change == "ca_bundle":
        extras["ca-bundle.crt"].write_text("another CA\n")
    assert tag_of(cell, files, extras, base_id) != before


def test_context_files_are_the_host_ca_bundle(tmp_path: Path, monkeypatch) -> None:
    bundle = tmp_path / "proxy-ca.crt"
    bundle.write_text("ca")
    monkeypatch.setenv(images.CA_BUNDLE_ENV, str(bundle))
    assert images.context_files(tmp_path) == {"ca-bundle.crt": bundle}


def fake_host(root: Path, cards: tuple[int, ...] = (0, 1), driver: bool = True) -> Path:
    """An Ascend host tree: card nodes, control nodes and driver files as plain files, plus decoys."""
    for card in cards:
        (root / "dev" / f"davinci{card}").parent.mkdir(parents=True, exist_ok=True)
        (root / "dev" / f"davinci{card}").touch()
    for name in ("davinci_manager", "devmm_svm", "hisi_hdc", "nvidia0", "davinci_extra", "sda"):
        (root / "dev" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "dev" / name).touch()
    if driver:
        for directory in ("usr/local/dcmi", "usr/local/Ascend/driver/lib64", "usr/local/bin", "etc"):
            (root / directory).mkdir(parents=True, exist_ok=True)
        for file in ("usr/local/bin/npu-smi", "usr/local/Ascend/driver/version.info", "etc/ascend_install.info"):
            (root / file).touch()
    return root


def test_npu_gets_exactly_its_devices_and_driver_mounts(tmp_path: Path) -> None:
    root = fake_host(tmp_path, cards=(0, 1))
    options = images.container_options(make_cell("npu"), host_root=root)
    assert options["devices"] == [
        f"{root}/dev/davinci0:/dev/davinci0:rwm",
        f"{root}/dev/davinci1:/dev/davinci1:rwm",
        f"{root}/dev/davinci_manager:/dev/davinci_manager:rwm",
        f"{root}/dev/devmm_svm:/dev/devmm_svm:rwm",
        f"{root}/dev/hisi_hdc:/dev/hisi_hdc:rwm",
    ]
    assert options["volumes"] == {
        f"{root}/{path}": {"bind": f"/{path}", "mode": "ro"}
        for path in (
            "usr/local/dcmi",
            "usr/local/bin/npu-smi",
            "usr/local/Ascend/driver/lib64",
            "usr/local/Ascend/driver/version.info",
            "etc/ascend_install.info",
        )
    }
    assert options["environment"] == {"ASCEND_RT_VISIBLE_DEVICES": "0,1"}
    assert options["device_requests"] == []
    assert options["privileged"] is False


def test_npu_cards_in_numeric_order_and_only_existing_driver_files(tmp_path: Path) -> None:
    root = fake_host(tmp_path, cards=(10, 2), driver=False)
    options = images.container_options(make_cell("npu"), host_root=root)
    assert [d.split(":")[1] for d in options["devices"]][:2] == ["/dev/davinci2", "/dev/davinci10"]
    assert options["volumes"] == {}
    assert options["environment"] == {"ASCEND_RT_VISIBLE_DEVICES": "2,10"}


def test_npu_visible_devices_from_the_host_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ASCEND_RT_VISIBLE_DEVICES", "1")
    monkeypatch.setenv(devices.HOST_ROOT_ENV, str(fake_host(tmp_path)))
    assert images.container_options(make_cell("npu"))["environment"] == {"ASCEND_RT_VISIBLE_DEVICES": "1"}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the fake devices another group")
def test_npu_container_user_joins_the_device_group(tmp_path: Path) -> None:
    root = fake_host(tmp_path)
    for name in ("davinci0", "davinci1", "davinci_manager"):
        os.chown(root / "dev" / name, -1, 1234)
    groups = images.container_options(make_cell("npu"), host_root=root)["group_add"]
    assert groups == ["1234", str(images.results_gid())]


def test_cuda_gets_a_gpu_request_and_no_devices(tmp_path: Path) -> None:
    options = images.container_options(make_cell("cuda"), host_root=fake_host(tmp_path))
    [request] = options["device_requests"]
    assert isinstance(request, docker.types.DeviceRequest)
    assert (request.count, request.capabilities) == (-1, [["gpu"]])
    assert (options["devices"], options["volumes"], options["environment"]) == ([], {}, {})
    assert options["privileged"] is False


def test_cpu_gets_nothing_and_privileged_only_on_request(tmp_path: Path) -> None:
    root = fake_host(tmp_path)
    assert images.container_options(make_cell("cpu"), host_root=root) == {
        "devices": [],
        "device_requests": [],
        "volumes": {},
        "environment": {},
        "group_add": [str(images.results_gid())],
        "privileged": False,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": 8192,
        "mem_limit": "64g",
    }
    privileged = images.container_options(make_cell("cpu", privileged=True), host_root=root)
    assert privileged["privileged"] is True and privileged["cap_drop"] == []


@pytest.mark.parametrize("device", ["cpu", "cuda", "npu"])
def test_every_container_is_hardened_with_the_cells_limits(tmp_path: Path, device: str) -> None:
    cell = make_cell(device, limits={"memory": "24g", "pids": 512})
    options = images.container_options(cell, host_root=fake_host(tmp_path))
    assert options["cap_drop"] == ["ALL"] and options["security_opt"] == ["no-new-privileges"]
    assert (options["mem_limit"], options["pids_limit"]) == ("24g", 512)
    assert str(images.results_gid()) in options["group_add"]


@pytest.mark.parametrize(
    ("limits", "key"), [({"memory": "lots"}, "memory"), ({"pids": 0}, "pids"), ({"cpus": 2}, "cpus")]
)
def test_bad_limits_are_refused(limits: dict, key: str) -> None:
    with pytest.raises(ValueError, match=rf"limits\.{key}"):
        make_cell(limits=limits)


def test_the_results_group_is_never_root() -> None:
    assert images.results_gid() == (os.getgid() or images.IMAGE_GID) and images.results_gid() != 0


def test_docker_client_says_why_when_no_engine_answers(tmp_path: Path, monkeypatch) -> None:
    socket = f"unix://{tmp_path}/dead.sock"
    monkeypatch.setenv("DOCKER_HOST", socket)
    client, reason = images.docker_client()
    assert client is None
    assert reason.startswith(f"no docker engine answers at {socket}: ")


class FakeAPI:
    """An engine holding `existing` ({reference: inspect answer}); the base image `base:1` is there
    unless `pullable` says it arrives on a pull."""

    def __init__(
        self,
        chunks: list[dict[str, Any]],
        existing: dict[str, dict] | None = None,
        *,
        base: bool = True,
        pullable: bool = False,
    ) -> None:
        self.chunks, self.builds, self.pulls, self.pullable = chunks, [], [], pullable
        self.existing = {"base:1": {"Id": BASE_ID}} if base else {}
        self.existing.update(existing or {})

    def inspect_image(self, tag: str) -> dict:
        if tag not in self.existing:
            raise docker.errors.ImageNotFound(tag)
        return self.existing[tag]

    def pull(self, repository: str, tag: str | None = None) -> str:
        self.pulls.append((repository, tag))
        if not self.pullable:
            raise docker.errors.APIError(f"pull access denied for {repository}")
        self.existing[f"{repository}:{tag}"] = {"Id": BASE_ID}
        return ""

    def build(self, **kwargs: Any):
        context = Path(kwargs["path"])
        lock = context / images.LOCK_IN_CONTEXT
        self.builds.append(
            {
                **kwargs,
                "context": sorted(str(p.relative_to(context)) for p in context.rglob("*")),
                "lock": lock.read_bytes() if lock.is_file() else None,
            }
        )
        yield from self.chunks


class FakeClient:
    def __init__(self, api: FakeAPI | None = None, container: Any = None) -> None:
        self.api, self.container, self.created = api, container, {}
        self.containers = self
        self.left_over: list[Any] = []

    def create(self, image: str, command: list[str], **kwargs: Any) -> Any:
        self.created = {"image": image, "command": command, **kwargs}
        return self.container

    def list(self, all: bool, filters: dict[str, str]) -> list[Any]:
        self.listed = filters
        return self.left_over


def test_build_streams_lines_from_a_context_of_only_the_cell_inputs(inputs, tmp_path: Path, monkeypatch) -> None:
    files, extras = inputs
    (tmp_path / "wheelhouse" / "other.whl").write_bytes(b"not this cell's")
    monkeypatch.setattr(images, "context_files", lambda root: extras)
    api = FakeAPI([{"stream": "Step 1/2 : ARG BASE_IMAGE\nStep 2/2 : FR"}, {"stream": "OM base\n"}, {"aux": {}}])
    lines: list[str] = []
    result = images.build_image(FakeClient(api), make_cell(), files, tmp_path, log=lines.append)
    assert result.built and result.tag == tag_of(make_cell(), files, extras)
    assert lines == ["Step 1/2 : ARG BASE_IMAGE", "Step 2/2 : FROM base"]
    [build] = api.builds
    context = ["Dockerfile", "ca-bundle.crt", images.LOCK_IN_CONTEXT, "wheelhouse", f"wheelhouse/{WHEEL}"]
    assert build["context"] == context
    assert build["lock"] == files["lock"].read_bytes()
    assert (build["network_mode"], build["decode"], build["tag"]) == ("host", True, result.tag)
    assert build["buildargs"] == make_cell().build_args
    assert build["labels"] == {images.CONTENT_LABEL: images.content_hash(make_cell(), files, extras, BASE_ID)}


def test_index_settings_and_their_credentials_never_reach_a_build(inputs, tmp_path: Path, monkeypatch) -> None:
    """Build args are kept in the image's history (`docker history`), for anyone who pulls it."""
    files, extras = inputs
    monkeypatch.setattr(images, "context_files", lambda root: extras)
    before = tag_of(make_cell(), files, extras)
    for name, value in INDEX_ENV.items():
        monkeypatch.setenv(name, value)
    api = FakeAPI([{"stream": "Step 1/1 : FROM base\n"}])
    result = images.build_image(FakeClient(api), make_cell(), files, tmp_path, log=lambda line: None)
    [build] = api.builds
    assert not set(INDEX_ENV) & set(build["buildargs"])
    assert not any("token" in value or "mirror" in value for value in build["buildargs"].values())
    assert result.tag == before == tag_of(make_cell(), files, extras)


def test_the_base_image_is_pulled_when_absent_and_its_absence_is_an_error(inputs, tmp_path: Path, monkeypatch) -> None:
    files, extras = inputs
    monkeypatch.setattr(images, "context_files", lambda root: extras)
    api = FakeAPI([{"stream": "Step 1/1 : FROM base\n"}], base=False, pullable=True)
    result = images.build_image(FakeClient(api), make_cell(), files, tmp_path, log=lambda line: None)
    assert api.pulls == [("base", "1")] and result.tag == tag_of(make_cell(), files, extras)
    api = FakeAPI([], base=False)
    with pytest.raises(images.ImageBuildError, match=r"cell cpu-cell: base_image base:1 .*could not be pulled"):
        images.build_image(FakeClient(api), make_cell(), files, tmp_path, log=lambda line: None)
    assert api.builds == []


def test_an_image_that_only_carries_the_tag_is_rebuilt(inputs, tmp_path: Path, monkeypatch) -> None:
    """Anyone who can tag an image on the engine could plant one under the cell's tag."""
    files, extras = inputs
    monkeypatch.setattr(images, "context_files", lambda root: extras)
    tag = tag_of(make_cell(), files, extras)
    content = images.content_hash(make_cell(), files, extras, BASE_ID)
    for labels in (None, {}, {images.CONTENT_LABEL: "0" * 64}, {images.CONTENT_LABEL: content[:12]}):
        api = FakeAPI(
            [{"stream": "Step 1/1 : FROM base\n"}], {tag: {"Id": "sha256:planted", "Config": {"Labels": labels}}}
        )
        lines: list[str] = []
        result = images.build_image(FakeClient(api), make_cell(), files, tmp_path, log=lines.append)
        assert result.built and len(api.builds) == 1, labels
        assert any("rebuilding" in line for line in lines)


def test_build_refuses_a_lock_without_a_wheelhouse_hash(inputs, tmp_path: Path, monkeypatch) -> None:
    files, extras = inputs
    files["lock"].write_text(lock_text(wheel=None))
    monkeypatch.setattr(images, "context_files", lambda root: extras)
    api = FakeAPI([{"stream": "Step 1/1 : FROM base\n"}])
    expected = rf"cell cpu-cell: .*records no hash for the wheelhouse file\(s\) {WHEEL}.*gdn-matrix lock cpu-cell"
    with pytest.raises(images.ImageBuildError, match=expected):
        images.build_image(FakeClient(api), make_cell(), files, tmp_path, log=lambda line: None)
    assert api.builds == []


class Untouchable:
    """A docker client any use of which fails the test."""

    def __getattr__(self, name: str) -> Any:
        pytest.fail(f"docker was asked for {name} before the lock was checked")


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda text: text.replace("torch==", "--index-url https://evil.example/simple\ntorch==", 1),
         r"line 9: '--index-url https://evil.example/simple' is a pip option; a lock holds none"),
        (lambda text: text.replace("a" * 64, "b" * 64, 1), r"line 8: the body \(lines 9-12\) is not what"),
        (lambda text: text.replace("\n", "\r\n"), r"line 1: a CRLF line ending"),
        (lambda text: text.replace("# cell: cpu-cell", "# cell: other"),
         r"was made for cell other, x86_64-manylinux_2_28, Python 3.11; refresh it with `gdn-matrix lock cpu-cell`"),
    ],
    ids=["option-line", "body-edited", "crlf", "another-cell"],
)  # fmt: skip
def test_build_refuses_a_lock_that_is_not_whole_before_docker_is_asked(inputs, tmp_path: Path, edit, said) -> None:
    files, _ = inputs
    files["lock"].write_text(edit(files["lock"].read_text()))
    with pytest.raises(images.ImageBuildError, match=rf"cell cpu-cell: .*{said}"):
        images.build_image(Untouchable(), make_cell(), files, tmp_path, log=lambda line: None)


def test_build_is_skipped_when_the_tag_exists(inputs, tmp_path: Path, monkeypatch) -> None:
    files, extras = inputs
    monkeypatch.setattr(images, "context_files", lambda root: extras)
    labels = {images.CONTENT_LABEL: images.content_hash(make_cell(), files, extras, BASE_ID)}
    api = FakeAPI([], {tag_of(make_cell(), files, extras): {"Id": "sha256:built", "Config": {"Labels": labels}}})
    result = images.build_image(FakeClient(api), make_cell(), files, tmp_path, log=print)
    assert (result.built, api.builds) == (False, [])


def test_build_failure_raises_with_the_log_tail(inputs, tmp_path: Path, monkeypatch) -> None:
    files, extras = inputs
    monkeypatch.setattr(images, "context_files", lambda root: extras)
    api = FakeAPI(
        [
            {"stream": "Step 5/9 : RUN pip install torch==9\n"},
            {"stream": "\x1b[91mERROR: no torch==9\n"},  # the builder colours stderr
            {"error": "The command 'pip install torch==9' returned a non-zero code: 1"},
        ]
    )
    expected = r"at Step 5/9 : RUN pip install torch==9: returned a non-zero code: 1$"
    with pytest.raises(images.ImageBuildError, match=expected) as failure:
        images.build_image(FakeClient(api), make_cell(), files, tmp_path, log=lambda line: None)
    assert failure.value.log_tail.splitlines() == ["Step 5/9 : RUN pip install torch==9", "ERROR: no torch==9"]


class FakeContainer:
    """Prints its lines, then exits with `code`, or hangs until killed when `code` is None."""

    def __init__(self, lines: list[bytes], code: int | None) -> None:
        self.lines, self.code = lines, code
        self.killed, self.removed = threading.Event(), False
        self.name, self.events = "fake", []

    def attach_socket(self, params: dict[str, int]) -> Any:
        self.events.append(("attach", params))
        container = self

        class Socket:
            def close(self) -> None:
                container.events.append(("detach", None))

        return Socket()

    def start(self) -> None:
        self.events.append(("start", None))

    def logs(self, stream: bool, follow: bool):
        yield from self.lines
        if self.code is None:
            self.killed.wait()

    def kill(self) -> None:
        self.killed.set()

    def wait(self, timeout: float) -> dict:
        return {"StatusCode": self.code}

    def remove(self, force: bool) -> None:
        self.removed = True


def test_run_mounts_source_read_only_and_results_writable(tmp_path: Path) -> None:
    container = FakeContainer([b"1.0\n", b"caf\xc3", b"\xa9\n"], code=0)
    client = FakeClient(container=container)
    lines: list[str] = []
    cell = make_cell(env={"GDN_STRICT": "1"})
    out = tmp_path / "out"
    result = images.run_container(client, cell, "t:1", root=tmp_path, out_dir=out, command=["python"], log=lines.append)
    assert (result.exit_code, result.timed_out, lines) == (0, False, ["1.0", "café"])
    assert client.created["volumes"] == {
        str(tmp_path): {"bind": "/src", "mode": "ro"},
        str(out): {"bind": "/results", "mode": "rw"},
    }
    environment = {"PYTHONPATH": "/src/src", "PYTHONDONTWRITEBYTECODE": "1", "GDN_STRICT": "1"}
    assert client.created["environment"] == environment
    assert client.created["network_mode"] == "none"
    # the container's user writes through the shared group; nobody else gets in
    assert (out.stat().st_mode & 0o7777, out.stat().st_gid) == (images.RESULTS_MODE, images.results_gid())
    assert client.created["cap_drop"] == ["ALL"] and client.created["security_opt"] == ["no-new-privileges"]
    assert container.removed


def test_a_container_ends_with_its_runner_and_the_next_run_removes_one_left(tmp_path: Path) -> None:
    """A container outlives the client that started it: its stdin is the runner's attachment, which the
    engine closes when the runner dies (the entry then ends its processes), and a container a dead
    runner left is removed by the next run of the cell."""
    left = FakeContainer([], code=0)
    container = FakeContainer([b"ok\n"], code=0)
    client = FakeClient(container=container)
    client.left_over = [left]
    out = tmp_path / "results" / ".staging" / "c" / "run-1"
    lines: list[str] = []
    images.run_container(client, make_cell(), "t:1", root=tmp_path, out_dir=out, command=["python"], log=lines.append)
    run_of = str(out.parent.resolve())
    assert client.listed == {"label": f"{images.RUN_LABEL}={run_of}"} and left.removed
    assert lines[0] == "[gdn-matrix: removing fake, left by a run of this cell whose runner died]"
    assert client.created["stdin_open"] is True and client.created["labels"] == {images.RUN_LABEL: run_of}
    assert [event for event, _ in container.events] == ["attach", "start", "detach"]
    assert container.events[0][1] == {"stdin": 1, "stream": 1}


def test_run_past_the_timeout_is_killed_and_keeps_its_log(tmp_path: Path) -> None:
    container = FakeContainer([b"started\n", b"half a li"], code=None)
    result = images.run_container(
        FakeClient(container=container),
        make_cell(timeout_s=1),
        "t:1",
        root=tmp_path,
        out_dir=tmp_path / "out",
        command=["sleep", "9"],
        log=lambda line: None,
    )
    assert (result.exit_code, result.timed_out) == (None, True)
    assert result.log_tail.startswith("started\nhalf a li\n")
    assert "timeout" in result.log_tail
    assert container.killed.is_set() and container.removed


def test_run_that_cannot_start_reports_why(tmp_path: Path) -> None:
    class Refusing(FakeClient):
        def create(self, image: str, command: list[str], **kwargs: Any) -> Any:
            raise docker.errors.APIError("error gathering device information for /dev/davinci0")

    result = images.run_container(
        Refusing(), make_cell(), "t:1", root=tmp_path, out_dir=tmp_path / "out", command=["x"], log=lambda line: None
    )
    assert (result.exit_code, result.timed_out) == (None, False)
    assert "/dev/davinci0" in result.log_tail
