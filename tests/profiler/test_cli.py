# SPDX-License-Identifier: Apache-2.0
"""``python -m stepcache profile MODULE:CALLABLE``."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from stepcache.__main__ import main as stepcache_main

from . import sample

MOD = sample.__name__
ROOT = pathlib.Path(__file__).resolve().parents[2]


def workload() -> None:
    """The sample's steps (a zero-argument workload for the command line)."""
    sample.run([[1, 2], [3], [2, 2]])


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = stepcache_main(
        [
            "profile",
            f"{__name__}:workload",
            "-t",
            MOD,
            "--step-by",
            "step",
            "--top",
            "3",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("stepcache profile: 4 step(s)")
    assert f"{MOD}:Builder.build" in out
    assert '@stepcache.step_cached(owner="step"' in out
    assert "more (report.table() shows all)" in out


def test_json(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    assert (
        stepcache_main(["profile", f"{__name__}:workload", "-t", MOD, "--json", "-"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["steps"] == 1  # no step marks: one step
    assert f"{MOD}:Builder.build" in [f["name"] for f in data["functions"]]
    path = tmp_path / "report.json"
    assert (
        stepcache_main(
            ["profile", f"{__name__}:workload", "-t", MOD, "--json", str(path)]
        )
        == 0
    )
    assert capsys.readouterr().out.rstrip().endswith(f"JSON written to {path}")
    assert json.loads(path.read_text())["calls"] == data["calls"]


def helper() -> int:
    return 1


def calls_helper() -> None:
    helper()
    helper()


def test_default_target_is_the_workload_module(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert stepcache_main(["profile", f"{__name__}:calls_helper", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["functions"]
    # The workload itself is the driver; what it calls in its module is profiled.
    assert [(f["name"], f["calls"], f["identical"]) for f in rows] == [
        (f"{__name__}:helper", 2, 1)
    ]


def failing() -> None:
    sample.total(None)  # type: ignore[arg-type]


def test_a_failing_workload_raises_and_restores() -> None:
    before = sample.total
    with pytest.raises(AttributeError):
        stepcache_main(["profile", f"{__name__}:failing", "-t", MOD])
    assert sample.total is before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["profile", "no_such_mod_xyz:f"], "no module named 'no_such_mod_xyz'"),
        (["profile", f"{MOD}:nothing"], "has no attribute 'nothing'"),
        (["profile", f"{MOD}:CONSTANT"], "is a int, not callable"),
        (["profile", f"{MOD}"], "expected MODULE:CALLABLE"),
        (["profile", "json.dumps"], "expected MODULE:CALLABLE (such as 'json:dumps')"),
        (["profile", f"{__name__}:workload", "-t", f"{MOD}:nope"], "has no attribute"),
        (["profile", f"{__name__}:workload", "-t", MOD, "--json", "."], "--json ."),
    ],
)
def test_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stepcache_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m stepcache profile: error: ")
    assert message in err


def test_a_workload_whose_own_import_fails_raises_its_error(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the module it cannot find is a prefix of the workload's name
    (tmp_path / "broken_xyz_ext.py").write_text("import broken_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="'broken_xyz'"):
        stepcache_main(["profile", "broken_xyz_ext:run"])


@pytest.mark.parametrize(
    ("top", "message"),
    [("-1", "must be at least 0 (got -1)"), ("x", "--top: not a number: 'x'")],
)
def test_a_bad_top_is_a_usage_error(
    top: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        stepcache_main(["profile", f"{__name__}:workload", "--top", top])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "_rows" not in err


def test_python_dash_m() -> None:
    """The real command, from a clone's root, on the DSv4 simulation."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepcache",
            "profile",
            "tests.profiler.workloads:dsv4_uncached",
            "-t",
            "stepcache.integrations.dsv4.sim",
            "--step",
            "stepcache.integrations.dsv4.sim:run_step",
            "--top",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("stepcache profile: 8 step(s)")
    ranked = {line.split()[1] for line in lines[4:6]}
    assert ranked == {
        "stepcache.integrations.dsv4.sim:Builders.layer_sparse_index",
        "stepcache.integrations.dsv4.sim:Builders.request_index",
    }


def exits_3() -> None:
    helper()
    helper()
    sys.exit(3)


def exits_quietly() -> None:
    helper()
    sys.exit()


def exits_with_a_message() -> None:
    helper()
    sys.exit("bye")


def interrupted() -> None:
    helper()
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("workload", "status", "calls", "err"),
    [
        ("exits_3", 3, 2, ""),
        ("exits_quietly", 0, 1, ""),
        ("exits_with_a_message", 1, 1, "bye\n"),
        ("interrupted", 130, 1, "python -m stepcache profile: interrupted\n"),
    ],
)
def test_a_workload_that_exits_still_gets_its_report(
    workload: str, status: int, calls: int, err: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stepcache_main(["profile", f"{__name__}:{workload}"]) == status
    out, got_err = capsys.readouterr()
    assert out.startswith(f"stepcache profile: 1 step(s), {calls} call(s)")
    assert got_err == err
    assert (
        stepcache_main(["profile", f"{__name__}:{workload}", "--json", "-"]) == status
    )
    assert json.loads(capsys.readouterr().out)["calls"] == calls
