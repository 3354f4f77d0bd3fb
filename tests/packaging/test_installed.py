# SPDX-License-Identifier: Apache-2.0
"""stepcache as users install it: the wheel and the sdist, each installed into a fresh
venv with no source tree on the path, then used from a temporary directory.

Both are built from a clean copy of the checkout (its files that git does not ignore):
an in-place build would ship what an earlier one left in ``build/`` or in the
``SOURCES.txt`` of ``stepcache.egg-info``, which setuptools reads back. The wheel is
built with ``pip wheel``; the sdist with setuptools, then turned into a wheel by pip,
which is what ``pip install stepcache-*.tar.gz`` does. The
fresh venvs get torch, numpy and attrs from the test's own environment through a
``.pth`` line (nothing is downloaded): only site directories have their ``.pth`` files
run, so the editable install's ``.pth`` line in that environment, which puts the
checkout on ``sys.path`` (scripts/setup_env.sh), stays inactive. The wheel's
venv sees that environment without vLLM, the sdist's with it (where it is installed):
``stepcache.integrations.vllm`` must import either way.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
#: what the installed package must not bring (the repository's own folders)
NOT_SHIPPED = ("demo/", "benchmarks/", "tests/", "docs/", "scripts/")
CHECK = r"""
import importlib, importlib.util, json, pkgutil, sys, sysconfig
from importlib.metadata import distribution, entry_points
import stepcache
def fail(name): raise ImportError(name)
names = ["stepcache", "stepcache_pytest"]
names += [m.name for m in pkgutil.walk_packages(stepcache.__path__, "stepcache.", fail)]
for name in names:
    importlib.import_module(name)
plugin = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "stepcache"]
print(json.dumps({
    "file": stepcache.__file__,
    "site": sysconfig.get_paths()["purelib"],
    "modules": names,
    "finders": [repr(f) for f in sys.meta_path],
    "path": sys.path,
    "vllm": importlib.util.find_spec("vllm") is not None,
    "files": [str(f) for f in distribution("stepcache").files],
    "plugin": [ep.value for ep in plugin],
    "register": callable(plugin[0].load()),
}))
"""


@dataclass(frozen=True)
class Install:
    kind: str
    python: Path
    wheel: Path
    cwd: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.pop("STEPCACHE_VLLM", None)
        done = subprocess.run(
            [str(self.python), *args],
            cwd=self.cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if check:
            assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
        return done


def run(*args: str | Path, cwd: Path = REPO) -> str:
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def pip_wheel(source: Path, out: Path) -> Path:
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        out,
        source,
    )
    (wheel,) = out.glob("stepcache-*.whl")
    return wheel


def clean_copy(out: Path) -> Path:
    """The checkout's files that git does not ignore, copied to ``out``."""
    if shutil.which("git") and (REPO / ".git").exists():
        listed = run(
            "git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"
        )
        for name in filter(None, listed.split("\0")):
            if (REPO / name).is_file():
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, out / name)
        return out
    skip = shutil.ignore_patterns(
        ".*", "build", "dist", "site", "*.egg-info", "__pycache__"
    )
    shutil.copytree(REPO, out, ignore=skip)
    return out


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dist")
    source = clean_copy(root / "source")
    build = "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))"
    out = run(sys.executable, "-c", build, root / "sdist", cwd=source)
    sdist = root / "sdist" / out.strip().splitlines()[-1]
    return {
        "sdist": sdist,
        "wheel": pip_wheel(source, root / "wheel"),
        "sdist-wheel": pip_wheel(sdist, root / "from-sdist"),
    }


def deps_without_vllm(root: Path) -> Path:
    """The test environment's site-packages as links, minus vLLM and stepcache."""
    out = root / "deps"
    out.mkdir()
    skip = re.compile(r"^(vllm|stepcache|__editable__|_?stepcache)", re.I)
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not skip.match(entry.name):
            (out / entry.name).symlink_to(entry)
    return out


@pytest.fixture(scope="module", params=["wheel", "sdist"])
def installed(
    request: pytest.FixtureRequest,
    artifacts: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Install]:
    kind: str = request.param
    root = tmp_path_factory.mktemp(kind)
    venv = root / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    wheel = artifacts["wheel" if kind == "wheel" else "sdist-wheel"]
    run(python, "-m", "pip", "install", "-q", "--no-deps", wheel, cwd=root)
    site = run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    )
    deps = (
        deps_without_vllm(root) if kind == "wheel" else sysconfig.get_paths()["purelib"]
    )
    (Path(site.strip()) / "_test_deps.pth").write_text(f"{deps}\n")
    cwd = root / "cwd"
    cwd.mkdir()
    yield Install(kind, python, wheel, cwd)


def test_the_wheels_ship_the_package_and_nothing_else(
    artifacts: dict[str, Path],
) -> None:
    names = {}
    for kind in ("wheel", "sdist-wheel"):
        with zipfile.ZipFile(artifacts[kind]) as zf:
            names[kind] = sorted(n for n in zf.namelist() if ".dist-info/" not in n)
    assert names["wheel"] == names["sdist-wheel"]  # the sdist lacks nothing
    files = names["wheel"]
    assert "stepcache/py.typed" in files and "stepcache_pytest.py" in files
    for module in ("profiler/_cli.py", "integrations/dsv4/sim.py", "__main__.py"):
        assert f"stepcache/{module}" in files
    assert not [n for n in files if n.startswith(NOT_SHIPPED)]


def test_the_sdist_has_what_the_wheel_is_built_from(artifacts: dict[str, Path]) -> None:
    with tarfile.open(artifacts["sdist"]) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert {"pyproject.toml", "README.md", "stepcache/py.typed"} <= names


def test_every_public_module_imports_from_the_install(installed: Install) -> None:
    got = json.loads(installed.run("-c", CHECK).stdout)
    site = Path(got["site"]).resolve()
    assert Path(got["file"]).resolve().is_relative_to(site)
    # '' is the working directory, a temporary one
    assert [p for p in got["path"] if Path(p or installed.cwd).resolve() == REPO] == []
    assert not [f for f in got["finders"] if "editable" in f.lower()]
    for name in (
        "stepcache.profiler",
        "stepcache.integrations.vllm",
        "stepcache.integrations.dsv4.sim",
        "stepcache.__main__",
    ):
        assert name in got["modules"]
    assert "stepcache/py.typed" in got["files"]
    assert not [f for f in got["files"] if f.startswith(NOT_SHIPPED)]
    assert got["plugin"] == ["stepcache.integrations.vllm:register"] and got["register"]
    if installed.kind == "wheel":
        assert got["vllm"] is False  # the wheel's venv has no vLLM


def test_the_command_line(installed: Install) -> None:
    assert (
        "usage: python -m stepcache"
        in installed.run("-m", "stepcache", "--help").stdout
    )
    out = installed.run("-m", "stepcache", "profile", "--help").stdout
    assert out.startswith("usage: python -m stepcache profile")
    out = installed.run("-m", "stepcache", "demo", "--steps", "5").stdout
    assert "Every variant gave the uncached results in every step." in out
    assert "bash scripts/demo.sh" in out


def test_the_readme_example(installed: Install) -> None:
    readme = (REPO / "README.md").read_text()
    match = re.search(r"^```python\n(.*?)^```", readme, re.S | re.M)
    assert match is not None, "README.md has no ```python block"
    script = installed.cwd / "readme_example.py"
    script.write_text(match.group(1))
    out = installed.run(str(script)).stdout
    assert "token_to_req" in out  # the stats table it prints
