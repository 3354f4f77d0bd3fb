#!/usr/bin/env bash
# The demo command: installs stepcache into .venv and runs the repository's demo
# (demo/, not installed; `python -m stepcache demo` is the installed package's short one).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m demo "$@"
