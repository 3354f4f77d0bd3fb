#!/usr/bin/env bash
# The test command: installs everything into .venv, then lint, types, docs and tests.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh --full
PY=.venv/bin/python
echo "== ruff"
$PY -m ruff check stepcache stepcache_pytest.py integrations tests benchmarks scripts docs
$PY -m ruff format --check stepcache stepcache_pytest.py integrations tests benchmarks scripts docs
echo "== mypy --strict"
$PY -m mypy stepcache stepcache_pytest.py integrations benchmarks tests/typing_example.py
if [ -f mkdocs.yml ]; then
  echo "== mkdocs build --strict"
  NO_MKDOCS_2_WARNING=1 $PY -m mkdocs build --strict --quiet --site-dir .venv/site
fi
echo "== pytest"
$PY -m pytest -q "$@"
