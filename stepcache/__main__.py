# SPDX-License-Identifier: Apache-2.0
"""``python -m stepcache demo|profile ...``: glue, importing each only when asked."""

from __future__ import annotations

import importlib
import sys

USAGE = """usage: python -m stepcache {demo,profile} [options]
  demo     simulated DSv4 serving steps, uncached vs stepcache
  profile  find per-step computations worth caching (docs/profiler.md)"""
COMMANDS = {"demo": "stepcache.integrations.dsv4.sim", "profile": "stepcache.profiler"}


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        asked = args[:1] in (["-h"], ["--help"])
        if args and not asked:
            print(f"python -m stepcache: unknown command {args[0]!r}", file=sys.stderr)
        print(USAGE)
        return 0 if asked else 2
    return int(importlib.import_module(COMMANDS[args[0]]).main(args[1:]))


if __name__ == "__main__":
    raise SystemExit(main())
