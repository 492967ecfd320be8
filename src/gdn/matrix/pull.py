"""`gdn-matrix pull`: fetch the matrix report of the latest successful GitHub Actions run, so a user can
diff their own stack against it before upgrading wheels. It drives the GitHub CLI (`gh`), which
brings its own login, so no token handling lives here.

Exit status: 0 pulled; 1 nothing to pull (no successful run, gh could not list or download it, no
report.json in the artifact); 2 gh is missing or not logged in.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gdn.matrix.program import Program

GH_MISSING = (
    "gdn-matrix pull needs the GitHub CLI (gh), and there is no `gh` on PATH. Install it (Debian and "
    "Ubuntu: apt-get install gh), log in with `gh auth login`, and run this again; or download the "
    "report artifact from the workflow run's page on GitHub."
)
GH_UNAUTHENTICATED = "gdn-matrix pull: gh is not logged in to GitHub. Run `gh auth login` (or set GH_TOKEN)."
RUN_FIELDS = "databaseId,url,createdAt,headSha"


class PullError(RuntimeError):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _detail(result: subprocess.CompletedProcess) -> str:
    return (result.stderr or result.stdout).strip()


@dataclass
class Gh:
    """The gh executable, and the repository that every repository-scoped call names (without one,
    gh takes it from the git checkout it runs in)."""

    executable: str
    repo: str | None

    def _call(self, args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([self.executable, *args], capture_output=True, text=True, check=False)

    def run(self, *args: str) -> str:
        result = self._call([*args, *(["--repo", self.repo] if self.repo else [])])
        if result.returncode != 0:
            raise PullError(f"gdn-matrix pull: `gh {' '.join(args)}` failed: {_detail(result)}", 1)
        return result.stdout

    def check_auth(self) -> None:
        result = self._call(["auth", "status"])
        if result.returncode != 0:
            detail = _detail(result)
            raise PullError(GH_UNAUTHENTICATED + (f"\ngh says: {detail}" if detail else ""), 2)


def find_gh(repo: str | None) -> Gh:
    executable = shutil.which("gh")
    if executable is None:
        raise PullError(GH_MISSING, 2)
    return Gh(executable, repo)


def latest_successful_run(gh: Gh, workflow: str, branch: str) -> dict[str, Any]:
    args = ("run", "list", "--workflow", workflow, "--branch", branch, "--status", "success", "--limit", "1")
    out = gh.run(*args, "--json", RUN_FIELDS)
    try:
        runs = json.loads(out)
    except ValueError as exc:
        raise PullError(f"gdn-matrix pull: `gh run list` printed something that is not JSON: {exc}", 1) from None
    if not runs:
        raise PullError(f"gdn-matrix pull: no successful run of workflow {workflow} on branch {branch}", 1)
    return runs[0]


def _replace_into(source: Path, dest: Path) -> None:
    """Move what source holds into dest, replacing entries of the same name and keeping the rest."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir():
        target = dest / entry.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
        entry.replace(target)


def download(gh: Gh, run_id: int, artifact: str, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    # gh refuses to overwrite files, and a failed download must not leave half a report in dest
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=f".{dest.name}.pull-") as staging:
        gh.run("run", "download", str(run_id), "-n", artifact, "-D", staging)
        if not (Path(staging) / "report.json").is_file():
            raise PullError(f"gdn-matrix pull: artifact {artifact} of run {run_id} has no report.json", 1)
        _replace_into(Path(staging), dest)


def pull(repo: str | None, branch: str, workflow: str, artifact: str, dest: Path) -> dict[str, Any]:
    gh = find_gh(repo)
    gh.check_auth()
    run = latest_successful_run(gh, workflow, branch)
    download(gh, run["databaseId"], artifact, dest)
    return run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", metavar="OWNER/NAME", help="GitHub repository (default: the current checkout's)")
    parser.add_argument("--branch", default="main", help="branch whose runs to look at (default: main)")
    parser.add_argument("--workflow", default="matrix.yml", help="workflow file or name (default: matrix.yml)")
    parser.add_argument("--artifact", default="matrix-report", help="artifact name (default: matrix-report)")
    parser.add_argument(
        "--dest",
        type=Path,
        default=Path("matrix-report"),
        metavar="DIR",
        help="where to put it (default: matrix-report)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        found = pull(args.repo, args.branch, args.workflow, args.artifact, args.dest)
    except PullError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    where = found.get("url") or f"run {found['databaseId']}"
    print(f"pulled {args.artifact} from {where} ({found.get('createdAt')}, {found.get('headSha')})")
    print(args.dest / "report.json")
    return 0


PROGRAM = Program(
    "gdn-matrix pull", "Fetch the matrix report of the latest successful GitHub Actions run.", add_arguments, run
)
main = PROGRAM.main


if __name__ == "__main__":
    sys.exit(main())
