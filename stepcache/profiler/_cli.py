# SPDX-License-Identifier: Apache-2.0
"""``python -m stepcache profile MODULE:CALLABLE``: run a workload under the profiler."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from stepcache.profiler._errors import (
    ProfilerError,
    TargetNotCallableError,
    TargetNotFoundError,
)
from stepcache.profiler._profile import profile

__all__ = ["main"]

_DESCRIPTION = """\
Run WORKLOAD (a MODULE:CALLABLE called with no arguments) with the targets wrapped,
then print the functions ranked by time spent on calls that repeat an earlier call of
the same step, each with a suggested @stepcache.step_cached line.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m stepcache profile", description=_DESCRIPTION
    )
    p.add_argument("workload", help="MODULE:CALLABLE to run (no arguments)")
    p.add_argument(
        "-t",
        "--target",
        action="append",
        default=[],
        help="what to wrap: MODULE, MODULE:Class, MODULE:func, MODULE:*.build "
        "(repeatable; default: the workload's module)",
    )
    p.add_argument(
        "--step", help="MODULE:CALLABLE whose each outermost call is one step"
    )
    p.add_argument(
        "--step-by",
        action="append",
        default=[],
        metavar="PARAM",
        help="parameter name of the step's metadata object (repeatable)",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="also write the report as JSON to PATH ('-': print JSON instead of the table)",
    )
    p.add_argument(
        "--top", type=_rows, default=15, help="rows of the table (default 15)"
    )
    p.add_argument(
        "--no-results",
        action="store_true",
        help="compare arguments only, not result contents (cheaper)",
    )
    p.add_argument(
        "--fields",
        action="store_true",
        help="also compare object arguments by the attributes each function read "
        "(copies of the step's metadata count as one input)",
    )
    return p


def _rows(text: str) -> int:
    try:
        rows = int(text)
    except ValueError:  # argparse would name the function: "invalid _rows value"
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if rows < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0 (got {rows})")
    return rows


def _writable(path: str) -> None:
    """Raise ProfilerError before the run for a --json path that cannot be written."""
    if path != "-" and (
        os.path.isdir(path) or not os.access(os.path.dirname(path) or ".", os.W_OK)
    ):
        raise ProfilerError(f"--json {path}: not a file that can be written")


def _workload(spec: str) -> Callable[[], Any]:
    module_name, _, path = spec.partition(":")
    if not module_name or not path:
        head, _, tail = spec.rpartition(".")
        hint = (
            f" (such as '{head}:{tail}')" if head and tail and ":" not in spec else ""
        )
        raise TargetNotFoundError(f"workload {spec!r}: expected MODULE:CALLABLE{hint}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name  # another module, missing inside this one
        if missing != module_name and not module_name.startswith(missing + "."):
            raise
        raise TargetNotFoundError(
            f"workload {spec!r}: no module named {module_name!r}"
        ) from exc
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetNotFoundError(
                f"workload {spec!r}: {module_name} has no attribute {path!r}"
            ) from None
    if not callable(obj):
        raise TargetNotCallableError(
            f"workload {spec!r} is a {type(obj).__name__}, not callable"
        )
    return obj  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m stepcache profile``; returns the exit status."""
    args = _parser().parse_args(argv)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        if args.json:
            _writable(args.json)
        workload = _workload(args.workload)
        targets = args.target or [args.workload.partition(":")[0]]
        with profile(
            targets,
            step=args.step,
            step_by=args.step_by,
            results=not args.no_results,
            fields=args.fields,
        ) as report:
            # A workload that exits (sys.exit() ends many entry points) or is
            # interrupted still gets its report: the calls made so far.
            status = 0
            try:
                workload()
            except SystemExit as exc:
                status = _exit_status(exc)
            except KeyboardInterrupt:
                print("python -m stepcache profile: interrupted", file=sys.stderr)
                status = 130
    except ProfilerError as exc:
        print(f"python -m stepcache profile: error: {exc}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(report.to_json())
        return status
    print(report.table(top=args.top))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(report.to_json())
            f.write("\n")
        print(f"\nJSON written to {args.json}")
    return status


def _exit_status(exc: SystemExit) -> int:
    """The status ``sys.exit(code)`` exits with (a message is printed, and is 1)."""
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)
    return 1
