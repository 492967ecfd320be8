"""`gdn-matrix history`: the matrix over time. `history add REPORT_DIR` keeps a report (its report.json
and its cells' small files, never their logs) in a history directory, one entry per report, within its
bounds (--keep entries, --max-mb megabytes; the oldest reports pruned first); `history render --out
SITE_DIR` renders the kept reports as a static site. gdn.matrix.history_store keeps the entries,
gdn.matrix.history_site renders them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gdn.matrix.history_store import HISTORY_DIR, KEEP_ENTRIES, MAX_MB, HistoryError, add_report

EXIT_CODES = """exit status:
  0  the report was kept (or was already), or the site was written
  2  unusable input: a report.json that does not validate, a generated time that is not one, a report
     larger than --max-mb alone, a history directory that does not exist (render)"""


# ---------------------------------------------------------------- gdn-matrix history


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    add = verbs.add_parser(
        "add",
        help="keep a report in the history",
        description="Keep REPORT_DIR's report.json and its cells' small files (not their logs) as one "
        "history entry, then prune the oldest entries past the bounds. Adding a kept report again changes "
        "nothing.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add.add_argument("report_dir", type=Path, help="the directory holding report.json (results/report)")
    add.add_argument(
        "--results",
        type=Path,
        metavar="DIR",
        help="where the cells' directories are (default: REPORT_DIR's parent, the results root)",
    )
    add.add_argument(
        "--history", type=Path, default=HISTORY_DIR, metavar="DIR", help=f"history directory (default: {HISTORY_DIR})"
    )
    add.add_argument(
        "--keep",
        type=_positive,
        default=KEEP_ENTRIES,
        metavar="N",
        help=f"entries kept, newest first (default: {KEEP_ENTRIES})",
    )
    add.add_argument(
        "--max-mb",
        type=_positive,
        default=MAX_MB,
        metavar="MB",
        help=f"megabytes the history may hold (default: {MAX_MB})",
    )
    add.set_defaults(verb_handler=_add)
    render = verbs.add_parser(
        "render",
        help="render the history as a static site",
        description="Render every entry of the history as one self-contained page, SITE_DIR/index.html: per "
        "cell, its status over time, the backend resolved per op, peer kernels, speed and accuracy rows, "
        "lock and version changes, and the last known good stack.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    render.add_argument(
        "--history", type=Path, default=HISTORY_DIR, metavar="DIR", help=f"history directory (default: {HISTORY_DIR})"
    )
    render.add_argument("--out", type=Path, required=True, metavar="SITE_DIR", help="where to write index.html")
    render.set_defaults(verb_handler=_render)


def _add(args: argparse.Namespace) -> int:
    try:
        added = add_report(
            args.report_dir, args.history, results_root=args.results, keep=args.keep, max_bytes=args.max_mb << 20
        )
    except HistoryError as exc:
        print(f"gdn-matrix history add: error: {exc}", file=sys.stderr)
        return 2
    print(f"{'kept as' if added.new else 'already kept as'} {args.history / added.key}")
    for key in added.pruned:
        print(f"pruned {args.history / key} (past the bounds: --keep {args.keep}, --max-mb {args.max_mb})")
    return 0


def _render(args: argparse.Namespace) -> int:
    from gdn.matrix.history_site import write_site  # jinja2 and the report's parts: only to render

    if not args.history.is_dir():
        print(f"gdn-matrix history render: error: no history directory {args.history}", file=sys.stderr)
        return 2
    print(write_site(args.history, args.out))
    return 0


def run(args: argparse.Namespace) -> int:
    return args.verb_handler(args)
