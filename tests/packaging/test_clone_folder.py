# SPDX-License-Identifier: Apache-2.0
"""A clone in a folder named ``stepcache``, and a script in the folder above it, run
with the venv's Python (issue 58): the script must import the installed package.

``python script.py`` puts the script's folder first on ``sys.path``, and there the
clone's folder ``stepcache`` (no ``__init__.py`` at its top) is a namespace package.
setuptools' default editable install finds the package with a finder that comes after
the path search, so the script got the empty namespace package and
``AttributeError: module 'stepcache' has no attribute 'step_cached'``.
scripts/setup_env.sh installs stepcache with ``editable_mode=compat``: a ``.pth`` line
puts the checkout on ``sys.path``, where the path search finds the real package, which
wins over a namespace package found earlier.

The tests link a temporary folder named ``stepcache`` to this checkout, write a script
beside it and run it with each venv's Python (the one running the tests, and
``.venv-engine``'s where it exists), as the user did."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SETUP = REPO / "scripts" / "setup_env.sh"
SCRIPT = """\
import json, stepcache
print(json.dumps({
    "file": getattr(stepcache, "__file__", None),
    "path": [str(p) for p in getattr(stepcache, "__path__", [])],
    "step_cached": callable(getattr(stepcache, "step_cached", None)),
}))
"""
INSTALLED = """\
import sys
from importlib import metadata
try:
    metadata.distribution("stepcache")
except metadata.PackageNotFoundError:
    sys.exit(3)
"""


def _pythons() -> list[Any]:
    engine = REPO / ".venv-engine" / "bin" / "python"
    return [
        pytest.param(Path(sys.executable), id="tests-venv"),
        pytest.param(
            engine,
            id=".venv-engine",
            marks=pytest.mark.skipif(
                not engine.exists(), reason="no .venv-engine (setup_env.sh --engine)"
            ),
        ),
    ]


def _env() -> dict[str, str]:
    """The user's environment: no PYTHONPATH, no venv switches of the test run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    for var in ("VIRTUAL_ENV", "STEPCACHE_VLLM", "STEPCACHE_DEBUG"):
        env.pop(var, None)
    return env


@pytest.mark.parametrize("python", _pythons())
@pytest.mark.parametrize("how", ["script", "-c"])
def test_a_script_beside_a_clone_named_stepcache_imports_the_installed_package(
    python: Path, how: str, tmp_path: Path
) -> None:
    if python == Path(sys.executable):
        try:
            metadata.distribution("stepcache")
        except metadata.PackageNotFoundError:
            pytest.skip(f"stepcache is not installed in {sys.prefix}")
    elif subprocess.run([str(python), "-c", INSTALLED], timeout=60).returncode == 3:
        pytest.skip(f"stepcache is not installed for {python}")
    (tmp_path / "stepcache").symlink_to(REPO, target_is_directory=True)
    assert not (tmp_path / "stepcache" / "__init__.py").exists()
    script = tmp_path / "use_stepcache.py"
    script.write_text(SCRIPT)
    args = [script.name] if how == "script" else ["-c", SCRIPT]
    done = subprocess.run(
        [str(python), *args],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["file"] is not None, (
        f"{python} imported the folder {got['path']} as an empty namespace package "
        "(stepcache's editable install is not on sys.path: scripts/setup_env.sh "
        "installs it with editable_mode=compat)"
    )
    assert Path(got["file"]).name == "__init__.py" and got["step_cached"], got


def test_every_editable_install_of_the_setup_script_puts_the_checkout_on_sys_path() -> (
    None
):
    """Each ``pip install -e`` in scripts/setup_env.sh (both venvs) asks for the
    ``.pth`` kind of editable install: the default one breaks the test above."""
    editable = [
        line
        for line in SETUP.read_text().splitlines()
        if not line.lstrip().startswith("#")
        if re.search(r"(^|\s)(-e|--editable)(\s|=|$)", line)
    ]
    assert len(editable) >= 3, editable  # .venv: --full and the default; .venv-engine
    for line in editable:
        assert "editable_mode=compat" in line, line
