# SPDX-License-Identifier: Apache-2.0
"""No folder of this repository can stand in for vLLM, Triton or torch.

pytest puts folders of the repository on ``sys.path`` (in its default ``prepend``
import mode, the first folder above each test module or conftest that has no
``__init__.py``), and ``python path/to/script.py`` puts the script's folder there. A
folder named ``vllm`` in one of them imports as an empty namespace package where vLLM
is not installed: ``pytest.importorskip("vllm")`` then passes and the test fails on
``vllm.v1`` instead of skipping. ``tests/vllm`` did that (now ``tests/vllm_plugin``).

The tests find those folders as pytest does, assert none holds a ``vllm``, ``triton``
or ``torch`` entry, and ask a Python started with only those folders on ``sys.path``
(no site-packages) whether any of the three can be found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: top-level modules that a folder of the repository must never provide
SHADOWED = ("vllm", "triton", "torch")
#: folders that are not the project's source (virtual environments, builds, caches)
NOT_SOURCE = {"site", "build", "dist", "node_modules", "__pycache__"}


def sys_path_folders(root: Path) -> list[Path]:
    """Every folder of ``root`` that pytest or ``python script.py`` may put on
    ``sys.path``: ``root`` itself (``python -m pytest`` adds the working folder), and
    for each folder holding a ``.py`` file, the first folder upwards (itself included)
    without an ``__init__.py``."""
    found = {root}
    for here, dirs, files in os.walk(root):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".") and d not in NOT_SOURCE
            if not d.endswith(".egg-info")
        ]
        if not any(f.endswith(".py") for f in files):
            continue
        folder = Path(here)
        while (folder / "__init__.py").is_file() and folder != root:
            folder = folder.parent
        found.add(folder)
    return sorted(found)


def shadows(folder: Path) -> list[str]:
    """The entries of ``folder`` that ``import vllm`` (triton, torch) would find:
    a folder (a package, or a namespace package when empty) or a module file."""
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if entry.name in SHADOWED or entry.name.split(".")[0] in SHADOWED
    )


def find_specs(folders: list[Path], extra: str = "") -> dict[str, str | None]:
    """Where a Python with only ``folders`` (and the standard library) on
    ``sys.path`` finds each of :data:`SHADOWED`: its origin or search folders, or None.
    ``extra`` is run first (to import a helper from one of the folders)."""
    code = (
        "import importlib.util, json, sys\n"
        "sys.path += sys.argv[1:]\n"
        f"{extra}\n"
        "found = {}\n"
        f"for name in {SHADOWED!r}:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    found[name] = None if spec is None else str(\n"
        "        spec.origin or list(spec.submodule_search_locations or ()))\n"
        "print(json.dumps(found))\n"
    )
    # -I: no PYTHONPATH, no user site, no working folder; -S: no site-packages
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, *map(str, folders)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    last: dict[str, str | None] = json.loads(done.stdout.splitlines()[-1])
    return last


def test_the_folders_include_those_pytest_puts_on_sys_path() -> None:
    folders = sys_path_folders(ROOT)
    for expected in ("", "tests", "tests/vllm_plugin", "tests/cuda", "scripts"):
        assert ROOT / expected in folders, expected
    # a package's folder is never put there: its first parent without __init__ is
    assert ROOT / "stepcache" not in folders
    assert ROOT / "tests" / "core" not in folders


def test_no_folder_on_sys_path_holds_vllm_triton_or_torch() -> None:
    found = {
        str(folder.relative_to(ROOT)) or ".": shadows(folder)
        for folder in sys_path_folders(ROOT)
    }
    assert {k: v for k, v in found.items() if v} == {}, (
        "these would import in place of the real package where it is not installed "
        "(rename them)"
    )


def test_python_with_only_the_projects_folders_finds_none_of_them() -> None:
    assert find_specs(sys_path_folders(ROOT)) == dict.fromkeys(SHADOWED)


def test_a_planted_vllm_folder_is_found(tmp_path: Path) -> None:
    """The checks above can fail: an empty ``tests/vllm`` beside a conftest."""
    (tmp_path / "tests" / "vllm").mkdir(parents=True)
    (tmp_path / "tests" / "conftest.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "torch.py").write_text("")  # inside a package: harmless
    folders = sys_path_folders(tmp_path)
    assert folders == [tmp_path, tmp_path / "tests"]
    assert [shadows(f) for f in folders] == [[], ["vllm"]]
    found = find_specs(folders)
    assert found["vllm"] == str([str(tmp_path / "tests" / "vllm")])
    assert found["torch"] is None and found["triton"] is None


@pytest.mark.parametrize("planted", [False, True], ids=["absent", "namespace"])
def test_the_skip_helper_never_takes_a_namespace_package_for_vllm(
    tmp_path: Path, planted: bool
) -> None:
    """``tests/require_vllm.py`` says why it skips, whether vLLM is absent or a
    folder named vllm (even one with a ``v1`` inside) shadows it."""
    if planted:
        (tmp_path / "vllm" / "v1").mkdir(parents=True)
    code = (
        "import json, sys, types\n"
        "sys.path += sys.argv[1:]\n"
        # no site-packages here; require_vllm needs pytest only when a test calls it
        "sys.modules['pytest'] = types.ModuleType('pytest')\n"
        "import require_vllm\n"
        "print(json.dumps(require_vllm.vllm_problem()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(ROOT / "tests"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    problem = json.loads(done.stdout.splitlines()[-1])
    if planted:
        assert problem.startswith("'vllm' resolves to a namespace package"), problem
        assert str(tmp_path / "vllm") in problem
    else:
        assert problem == "vLLM is not installed"
