#!/usr/bin/env bash
# The demo command: installs stepcache into .venv and runs the DSv4 step simulation.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
exec .venv/bin/python -m stepcache demo "$@"
