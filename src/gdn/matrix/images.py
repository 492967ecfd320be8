"""Container images of the docker cells: a tag that is a content hash of everything a build sees (the
base image's content included), a build that is skipped when an image carries that tag and records
the same hash in its label, and a hardened run with only the devices the cell's kind needs
(gdn.matrix.devices says which).

The docker SDK is imported only where an engine is used: it belongs to the `matrix` extra, and the
host runtime (the `local` cell) must work without it."""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import os
import re
import shutil
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gdn.matrix import devices
from gdn.matrix.config import Cell
from gdn.matrix.lock import LockError, platform_of, read_lock
from gdn.matrix.lockfile import LockFileError, file_sha256

TAG_REPOSITORY = "gdn-matrix"
# The image's whole content hash; the tag holds only its first 12 digits, and any image may be tagged
# with anything, so an image is reused only when its label says it is this content.
CONTENT_LABEL = "org.gdn-matrix.content-hash"
# Each cell container is labelled with the cell's staging directory: one left by a runner that died
# (a container outlives its client) is removed by the next run of that cell.
RUN_LABEL = "org.gdn-matrix.run"
CA_BUNDLE_ENV = "GDN_CA_BUNDLE"
SYSTEM_CA_BUNDLES = (Path("/etc/ssl/certs/ca-certificates.crt"), Path("/etc/pki/tls/certs/ca-bundle.crt"))
# The cell's lock (config.cell_files' "lock") under this name in the build context.
LOCK_IN_CONTEXT = "lock.txt"

SRC_MOUNT = "/src"
RESULTS_MOUNT = "/results"
RUN_ENV = {"PYTHONPATH": f"{SRC_MOUNT}/src", "PYTHONDONTWRITEBYTECODE": "1"}
# The results directory belongs to the runner's user and a group the container's user joins: the
# runner's own group, or on a root runner the images' gid (the group root's would hand the container
# every root-group file). setgid, so what the container writes keeps that group and the runner can
# read it; no one else gets in.
IMAGE_GID = 10001
RESULTS_MODE = 0o2770

TAIL_LINES = 200
# The classic builder colours pip's stderr; colour codes only clutter log files and tails.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BUILD_STEP = re.compile(r"Step (\d+)/(\d+) : (.*)")
# How long a container that was killed, or whose log stream ended, gets to report its exit.
EXIT_WAIT_S = 30


class ImageBuildError(RuntimeError):
    def __init__(self, message: str, log_tail: str) -> None:
        super().__init__(message)
        self.log_tail = log_tail


@dataclass
class BuildResult:
    tag: str
    built: bool
    log_tail: str


@dataclass
class RunResult:
    exit_code: int | None
    timed_out: bool
    log_tail: str


def docker_client() -> tuple[Any | None, str | None]:
    """(client, None) when an engine answers, else (None, why not) for the cell's not-run record."""
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        import docker
        import requests
    except ImportError as exc:
        return None, f"the docker SDK is not installed ({exc}); pip install 'gdn-matrix[matrix]'"
    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        return None, f"no docker engine answers at {where}: {exc}"
    return client, None


def host_ca_bundle() -> Path:
    """The CA bundle the host trusts: pip in the image needs it where TLS is intercepted by a proxy
    whose CA only the host knows. certifi (a dependency of the docker SDK) is the last resort."""
    override = os.environ.get(CA_BUNDLE_ENV)
    if override:
        return Path(override)
    for bundle in SYSTEM_CA_BUNDLES:
        if bundle.is_file():
            return bundle
    import certifi

    return Path(certifi.where())


def context_files(root: Path) -> dict[str, Path]:
    """The build-context files beside the Dockerfile, the lock and the wheels, keyed by their name in
    the context."""
    return {"ca-bundle.crt": host_ca_bundle()}


def _wheels(files: dict[str, Path]) -> list[Path]:
    return sorted((path for key, path in files.items() if key.startswith("wheels[")), key=lambda path: path.name)


def content_hash(cell: Cell, files: dict[str, Path], context_files: dict[str, Path], base_id: str) -> str:
    """A sha256 over the base image's id, the Dockerfile, the lock (every package and its hashes), the
    build args, each wheel's name and content and the other context files: equal exactly when the
    image would be. Wheels count by name, not by where the wheelhouse lies."""
    digest = hashlib.sha256()

    def add(*fields: str) -> None:
        digest.update("\0".join(fields).encode() + b"\n")

    add("base", base_id)
    add("dockerfile", file_sha256(files["dockerfile"]))
    if "lock" in files:
        add("lock", file_sha256(files["lock"]))
    for name, value in sorted(cell.build_args.items()):
        add("arg", name, value)
    for wheel in _wheels(files):
        add("wheel", wheel.name, file_sha256(wheel))
    for name, path in sorted(context_files.items()):
        add("context", name, file_sha256(path))
    return digest.hexdigest()


def image_tag(cell: Cell, content: str) -> str:
    """`gdn-matrix/<cell>:<12 hex>` for a content hash."""
    return f"{TAG_REPOSITORY}/{cell.name}:{content[:12]}"


class _LineTail:
    """Turns streamed text into whole lines for the log callback and keeps the last ones for a report.
    Locked because a run that gives up on a container adds its note while the log reader may still feed."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._lines: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = ""
        self._lock = threading.Lock()

    def feed(self, text: str) -> None:
        with self._lock:
            *complete, self._partial = (self._partial + text).split("\n")
            for line in complete:
                self._emit(line)

    def close(self) -> None:
        with self._lock:
            if self._partial:
                self._emit(self._partial)
                self._partial = ""

    def _emit(self, line: str) -> None:
        line = ANSI_ESCAPE.sub("", line).rstrip("\r")
        self._lines.append(line)
        self._log(line)

    @property
    def text(self) -> str:
        with self._lock:
            return "\n".join(self._lines)


@contextlib.contextmanager
def _progress(title: str) -> Iterator[Callable[[str], None]]:
    """A progress bar over the Dockerfile's steps on a terminal; nothing in a CI log, where the
    streamed lines already say it. Yields a callback taking each `Step n/m : ...` line."""
    if not sys.stdout.isatty():
        yield lambda _line: None
        return
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task(title, total=None)

        def step(line: str) -> None:
            match = BUILD_STEP.match(line)
            if match:
                done, total, instruction = match.groups()
                description = escape(f"{title}: {instruction[:60]}")  # instructions hold [brackets]
                bar.update(task, completed=int(done) - 1, total=int(total), description=description)

        yield step


def _assemble_context(directory: Path, files: dict[str, Path], extras: dict[str, Path]) -> None:
    """Dockerfile, lock, context files and a wheelhouse/ holding only this cell's wheels (it may be empty)."""
    shutil.copyfile(files["dockerfile"], directory / "Dockerfile")
    if "lock" in files:
        shutil.copyfile(files["lock"], directory / LOCK_IN_CONTEXT)
    for name, path in extras.items():
        shutil.copyfile(path, directory / name)
    house = directory / "wheelhouse"
    house.mkdir()
    for wheel in _wheels(files):
        try:
            os.link(wheel, house / wheel.name)
        except OSError:  # another filesystem, or links not allowed: wheels are worth copying
            shutil.copyfile(wheel, house / wheel.name)


def _inspect(client: Any, reference: str) -> dict[str, Any] | None:
    import docker

    try:
        return client.api.inspect_image(reference)
    except docker.errors.ImageNotFound:
        return None


def base_image_id(client: Any, cell: Cell, log: Callable[[str], None]) -> str:
    """The id (the digest of its content) of the image the cell's FROM names, pulled when this engine
    lacks it: a tag like `bookworm-python:local` or `cuda:13.0.1-...` names different content over time
    and across machines, so the image hash covers the id, not the tag."""
    import docker
    import requests
    from docker.utils import parse_repository_tag

    reference = cell.base_image or ""
    found = _inspect(client, reference)
    if found is None:
        log(f"[gdn-matrix: pulling the base image {reference}]")
        repository, tag = parse_repository_tag(reference)
        try:
            client.api.pull(repository, tag=tag)
        except (docker.errors.DockerException, requests.RequestException) as exc:
            message = f"cell {cell.name}: base_image {reference} is not on this engine and could not be pulled: {exc}"
            raise ImageBuildError(message, "") from exc
        found = _inspect(client, reference)
        if found is None:
            raise ImageBuildError(f"cell {cell.name}: base_image {reference} is still absent after its pull", "")
    return str(found["Id"])


def _reusable(client: Any, tag: str, content: str, log: Callable[[str], None]) -> bool:
    """Whether an image carrying `tag` was built from `content`, as its label records: anything that
    can tag an image on the engine could otherwise stand in for the cell's."""
    found = _inspect(client, tag)
    if found is None:
        return False
    label = ((found.get("Config") or {}).get("Labels") or {}).get(CONTENT_LABEL)
    if label == content:
        return True
    log(f"[gdn-matrix: {tag} exists but its {CONTENT_LABEL} label is {label!r}, not {content}: rebuilding]")
    return False


def _build_text(chunk: dict[str, Any]) -> str:
    """What a build chunk has to say: builder output, or one line per pull status (progress ticks are dropped)."""
    if "stream" in chunk:
        return chunk["stream"]
    if "status" in chunk and "progress" not in chunk:
        return f"{chunk.get('id', '')} {chunk['status']}".strip() + "\n"
    return ""


def _summary(error: str) -> str:
    """The builder's error repeats the whole RUN command; its outcome is enough beside the log tail."""
    match = re.search(r"returned a non-zero code: \d+", error)
    return match.group(0) if match else error.strip()


def _lock_refusal(cell: Cell, files: dict[str, Path]) -> str | None:
    """Why the image cannot be built from its lock: a lock that is not whole and untouched (any line
    that is not the format's: a pip option line could send pip to another index), one made for
    another cell, platform or Python, or one that records no hash for a wheelhouse file (an image
    installs nothing it cannot verify). Checked before docker is asked anything."""
    if "lock" not in files:
        return None
    try:
        lock = read_lock(files["lock"])
    except LockError as exc:
        return f"cell {cell.name}: {exc}"
    except LockFileError as exc:
        return f"cell {cell.name}: {files['lock']} is not a whole gdn-matrix lock: {exc}"
    made_for = (lock.cell, lock.platform, lock.python)
    if made_for != (cell.name, platform_of(cell), cell.versions.python):
        return (
            f"cell {cell.name}: {files['lock']} was made for cell {lock.cell}, {lock.platform}, Python {lock.python}; "
            f"refresh it with `gdn-matrix lock {cell.name}`"
        )
    unrecorded = lock.unrecorded
    if not unrecorded:
        return None
    names = ", ".join(f.file for f in unrecorded)
    return (
        f"cell {cell.name}: {files['lock']} records no hash for the wheelhouse file(s) {names} (absent when "
        f"locked); put them in the wheelhouse and run `gdn-matrix lock {cell.name}`"
    )


def build_image(
    client: Any, cell: Cell, files: dict[str, Path], root: Path, *, log: Callable[[str], None]
) -> BuildResult:
    """Build the cell's image unless its tag exists; the build output goes to `log` line by line."""
    import docker
    import requests

    refusal = _lock_refusal(cell, files)
    if refusal:
        raise ImageBuildError(refusal, "")
    extras = context_files(root)
    content = content_hash(cell, files, extras, base_image_id(client, cell, log))
    tag = image_tag(cell, content)
    if _reusable(client, tag, content, log):
        return BuildResult(tag=tag, built=False, log_tail="")
    with tempfile.TemporaryDirectory(prefix=f"gdn-build-{cell.name}-") as context, _progress(f"build {tag}") as show:
        steps = ["the start"]

        def on_line(line: str) -> None:
            if BUILD_STEP.match(line):
                steps.append(" ".join(line.split())[:100])  # continuation lines leave runs of blanks
                show(line)
            log(line)

        tail = _LineTail(on_line)
        _assemble_context(Path(context), files, extras)
        try:
            chunks = client.api.build(
                path=context,
                dockerfile="Dockerfile",
                tag=tag,
                # Versions only: index settings may carry credentials, and every build arg is in the
                # image's history (docs/matrix.md, "Package indexes").
                buildargs=cell.build_args,
                labels={CONTENT_LABEL: content},
                network_mode="host",  # the bridge has no NAT here (dockerd --iptables=false)
                rm=True,
                forcerm=True,
                decode=True,
            )
            for chunk in chunks:
                if "error" in chunk:
                    tail.close()
                    message = f"building {tag} failed at {steps[-1]}: {_summary(chunk['error'])}"
                    raise ImageBuildError(message, tail.text)
                tail.feed(_build_text(chunk))
        except (docker.errors.DockerException, requests.RequestException) as exc:
            tail.close()
            raise ImageBuildError(f"building {tag} failed at {steps[-1]}: {exc}", tail.text) from exc
    tail.close()
    return BuildResult(tag=tag, built=True, log_tail=tail.text)


def results_gid() -> int:
    """The group the results directory and the container's user share (see IMAGE_GID)."""
    return os.getgid() or IMAGE_GID


def container_options(cell: Cell, host_root: Path | None = None) -> dict[str, Any]:
    """Keyword arguments for containers.create() that give the cell its device kind and nothing more:
    no capabilities (a cell needs none: its devices come as device nodes and a group), no privilege
    gained through setuid files, its limits on memory and processes, the results directory's group.
    `host_root` (default $GDN_HOST_ROOT, else /) is where the host's device nodes and driver files lie."""
    from docker.types import DeviceRequest

    access = devices.kind(cell.device).container(devices.host_root_of(host_root))
    gpu = access.gpu_request
    requests = [DeviceRequest(count=gpu.count, capabilities=[list(c) for c in gpu.capabilities])] if gpu else []
    groups = list(dict.fromkeys([*access.group_add, str(results_gid())]))
    return {
        "devices": list(access.devices),
        "device_requests": requests,
        "volumes": {host: {"bind": inside, "mode": "ro"} for host, inside in access.mounts.items()},
        "environment": dict(access.environment),
        "group_add": groups,
        "privileged": cell.privileged,
        # a privileged cell asked for every capability; dropping them would undo what it asked for
        "cap_drop": [] if cell.privileged else ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": cell.limits.pids,
        "mem_limit": cell.limits.memory,
    }


def prepare_results_dir(out_dir: Path) -> None:
    """The container's user writes here through the shared group; nobody else may (see IMAGE_GID)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    os.chown(out_dir, -1, results_gid())
    out_dir.chmod(RESULTS_MODE)


def _pump_logs(container: Any, tail: _LineTail) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        for chunk in container.logs(stream=True, follow=True):
            tail.feed(decoder.decode(chunk))
    except Exception as exc:  # a broken stream belongs in the tail: raising in this thread would lose it
        tail.close()
        tail.feed(f"[gdn-matrix: the log stream broke: {exc}]\n")
    tail.close()


def _follow(container: Any, timeout_s: float, tail: _LineTail) -> RunResult:
    """Stream the logs until the container ends or the cell's time is up; then it is killed."""
    reader = threading.Thread(target=_pump_logs, args=(container, tail), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if reader.is_alive():
        with contextlib.suppress(Exception):  # it may have ended in the meantime
            container.kill()
        reader.join(EXIT_WAIT_S)
        tail.close()
        tail.feed(f"[gdn-matrix: killed after the cell's timeout of {timeout_s:g} s]\n")
        return RunResult(exit_code=None, timed_out=True, log_tail=tail.text)
    status = container.wait(timeout=EXIT_WAIT_S)
    return RunResult(exit_code=int(status["StatusCode"]), timed_out=False, log_tail=tail.text)


def _remove_left_over(client: Any, run_of: str, tail: _LineTail) -> None:
    """Containers of earlier runs of the cell (its guard is held, so their runners are dead)."""
    for container in client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_of}"}):
        tail.feed(f"[gdn-matrix: removing {container.name}, left by a run of this cell whose runner died]\n")
        container.remove(force=True)


def run_container(
    client: Any,
    cell: Cell,
    tag: str,
    *,
    root: Path,
    out_dir: Path,
    command: list[str],
    log: Callable[[str], None],
) -> RunResult:
    """Run `command` in the cell's image: source read-only at /src, `out_dir` at /results, no network
    (a test that reaches out should fail, not hang), the cell's devices, its timeout. `log` gets each
    line as it comes, from a reader thread. A container that cannot start gives exit_code None.

    The container's stdin is attached to this process and closed by the engine when this process's
    attachment ends: if the runner dies outright, the cell entry sees its stdin end and ends its
    processes (entry --end-with-stdin), and the next run of the cell removes the container."""
    import docker
    import requests

    options = container_options(cell)
    prepare_results_dir(out_dir)
    run_of = str(out_dir.resolve().parent)
    volumes = {
        **options.pop("volumes"),
        str(root.resolve()): {"bind": SRC_MOUNT, "mode": "ro"},
        str(out_dir.resolve()): {"bind": RESULTS_MOUNT, "mode": "rw"},
    }
    environment = {**options.pop("environment"), **RUN_ENV, **cell.env}
    tail = _LineTail(log)
    container = stdin = None
    try:
        _remove_left_over(client, run_of, tail)
        container = client.containers.create(
            tag,
            command,
            volumes=volumes,
            environment=environment,
            network_mode="none",
            stdin_open=True,  # and, as the SDK sets it with this, StdinOnce: closed when we detach
            labels={RUN_LABEL: run_of},
            **options,
        )
        stdin = container.attach_socket(params={"stdin": 1, "stream": 1})
        container.start()
        return _follow(container, cell.timeout_s, tail)
    except (docker.errors.DockerException, requests.RequestException) as exc:
        tail.close()
        tail.feed(f"[gdn-matrix: the container failed: {exc}]\n")
        return RunResult(exit_code=None, timed_out=False, log_tail=tail.text)
    finally:
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()
        if container is not None:
            with contextlib.suppress(docker.errors.DockerException, requests.RequestException):
                container.remove(force=True)
