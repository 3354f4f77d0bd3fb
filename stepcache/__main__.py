# SPDX-License-Identifier: Apache-2.0
"""Command line: ``python -m stepcache demo|profile ...``.

The CLI is glue, not core: it imports the demo and the profiler lazily.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "demo": ("stepcache.integrations.demo", "main"),
        "profile": ("stepcache.profiler", "main"),
    }
    if not args or args[0] in ("-h", "--help") or args[0] not in commands:
        print("usage: python -m stepcache {" + ",".join(commands) + "} [options]")
        print("  demo     simulated DSv4 serving steps, uncached vs stepcache")
        print("  profile  find per-step computations worth caching (docs/profiler.md)")
        return 0 if args and args[0] in ("-h", "--help") else 2
    module_name, attr = commands[args[0]]
    import importlib

    module = importlib.import_module(module_name)
    result: int = getattr(module, attr)(args[1:])
    return result


if __name__ == "__main__":
    raise SystemExit(main())
