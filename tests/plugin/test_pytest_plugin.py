# SPDX-License-Identifier: Apache-2.0
"""The pytest plugin, run on small test suites through pytest's own ``pytester``.

Most runs are in-process (fast: torch is imported once); one runs in a subprocess to
prove that the ``pytest11`` entry point registers the plugin by itself.
"""

from __future__ import annotations

import hypothesis  # noqa: F401
import pytest

import stepcache

# In-process runs put sys.modules back as it was after each run: a plugin module that a
# run imports (hypothesis's, entry point of this environment) would be imported and
# assertion-rewritten anew by every run (seconds each). Imported here once instead.

pytest_plugins = ["pytester"]

# A cache whose dependency is changed behind torch's version counter: production mode
# returns the stale value; debug mode raises StaleCacheError ('dependency-changed').
HELPERS = """
import dataclasses
import pytest
import torch
import stepcache


@dataclasses.dataclass
class Meta:
    qsl: torch.Tensor


@stepcache.step_cached(owner="m", depends_on=("qsl",))
def total(m):
    return int(m.qsl.sum())


SCALE = [1]


@stepcache.step_cached(key="kind", owner="m")  # BUG: nothing declares SCALE
def rows(m, kind):
    return SCALE[0]


def stale():
    m = Meta(torch.tensor([1, 2]))
    total(m)
    m.qsl.numpy()[0] = 5
    return total(m)


def swallowed():
    try:
        return stale()
    except stepcache.StaleCacheError:
        return None
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(helpers=HELPERS)
    pytester.syspathinsert()
    return pytester


def test_off_by_default_changes_nothing(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        """
        import stepcache
        from helpers import swallowed

        def test_swallows():
            assert stepcache.get_debug() == "off"
            assert swallowed() == 3  # the stale value: nothing checks it

        def test_clean():
            pass
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(passed=2)
    without = suite.runpytest("-p", "no:stepcache")
    without.assert_outcomes(passed=2)

    def lines(r: pytest.RunResult) -> list[str]:  # less the plugin list and timings
        return [
            x for x in r.outlines if not x.startswith("plugins:") and " in " not in x
        ]

    assert lines(result) == lines(without)
    assert "stepcache" not in "\n".join(lines(result))
    assert stepcache.get_debug() == "off"
    help_text = suite.runpytest("--help").stdout.str()
    assert "--stepcache-debug=[MODE]" in help_text and "--stepcache-stats" in help_text


SWALLOWING = """
import stepcache
from helpers import swallowed

def test_swallows():
    swallowed()  # the test catches the error: only the plugin notices

def test_clean():
    pass

def test_mode():
    assert stepcache.get_debug() == "checks"
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["--stepcache-debug"],
        ["--stepcache-debug", "test_swallowing.py"],  # before a path: not a mode
        ["test_swallowing.py", "--stepcache-debug=checks"],
    ],
)
def test_a_detection_fails_its_test(suite: pytest.Pytester, argv: list[str]) -> None:
    suite.makepyfile(test_swallowing=SWALLOWING)
    result = suite.runpytest(*argv)
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "*stepcache debug mode (checks) detected 1 problem(s) during this test's "
            "call, whether or not the test caught the error:",
            "1. [[]dependency-changed[]] step_cached function 'total': dependency 'qsl' "
            "changed without the cache noticing*",
            "*= stepcache debug =*",
            "stepcache debug (--stepcache-debug=checks): 1 detection(s) in 1 test(s)",
            "test_swallowing.py::test_swallows (call): [[]dependency-changed[]]*",
            "FAILED test_swallowing.py::test_swallows*",
        ]
    )
    assert stepcache.get_debug() == "off"


def test_verify_mode(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        """
        import torch, stepcache
        from helpers import SCALE, Meta, rows

        def test_mode():
            assert stepcache.get_debug() == "verify"

        def test_coarse_key():
            m = Meta(torch.zeros(1))
            assert rows(m, "a") == 1
            SCALE[0] = 2
            rows(m, "a")  # a hit: verify recomputes, gets 2, raises
        """
    )
    result = suite.runpytest("--stepcache-debug=verify")
    result.assert_outcomes(failed=1, passed=1)
    out = result.stdout.str()
    # The test failed by itself; the plugin adds what it saw to that failure.
    assert "stepcache detections (call)" in out
    assert "[key-too-coarse]" in out
    assert (
        "stepcache debug (--stepcache-debug=verify): 1 detection(s) in 1 test(s)" in out
    )


def test_a_bad_mode_is_a_usage_error(suite: pytest.Pytester) -> None:
    suite.makepyfile("def test_nothing(): pass")
    result = suite.runpytest("--stepcache-debug=loud")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "--stepcache-debug takes checks or verify (got 'loud')" in result.stderr.str()
    )


def test_off_before_a_path_is_a_usage_error_not_a_path(suite: pytest.Pytester) -> None:
    suite.makepyfile("def test_nothing(): pass")
    result = suite.runpytest("--stepcache-debug", "off", ".")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--stepcache-debug takes checks or verify (got 'off')" in result.stderr.str()


def test_the_marker(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        """
        import pytest, stepcache
        from helpers import swallowed

        @pytest.mark.stepcache_debug
        def test_marked():
            swallowed()

        def test_unmarked():
            assert stepcache.get_debug() == "off"
            swallowed()

        @pytest.mark.stepcache_debug("verify")
        def test_verify():
            assert stepcache.get_debug() == "verify"

        @pytest.mark.stepcache_debug(mode="loud")
        def test_bad_mode():
            pass
        """
    )
    result = suite.runpytest("--strict-markers")
    result.assert_outcomes(failed=1, passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.stepcache_debug(mode='loud'): mode must be one of off, "
            "checks, verify*",
            "stepcache debug (marked tests): 1 detection(s) in 1 test(s)",
            "*test_marked (call): [[]dependency-changed[]]*",
        ]
    )


def test_mode_off_exempts_a_test(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        """
        import pytest, stepcache
        from helpers import swallowed

        @pytest.mark.stepcache_debug(mode="off")
        def test_exempt():
            assert stepcache.get_debug() == "off"
            assert swallowed() == 3

        def test_after():
            assert stepcache.get_debug() == "checks"
        """
    )
    suite.runpytest("--stepcache-debug").assert_outcomes(passed=2)


def test_the_fixture_takes_expected_detections(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        """
        import pytest, stepcache
        from helpers import stale, swallowed

        def test_provokes_on_purpose(stepcache_debug):
            assert stepcache_debug.mode == "checks" == stepcache.get_debug()
            with pytest.raises(stepcache.StaleCacheError):
                stale()
            assert [d.kind for d in stepcache_debug.take()] == ["dependency-changed"]
            assert stepcache_debug.take() == ()
            assert len(stepcache_debug.detections) == 1

        def test_does_not_take(stepcache_debug):
            swallowed()

        def test_without():
            assert stepcache.get_debug() == "off"
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines(
        [
            "stepcache debug (marked tests): 1 detection(s) in 1 test(s) (1 more "
            "accepted with stepcache_debug.take())",
        ]
    )


def test_a_detection_in_a_fixture_errors_the_setup(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        """
        import pytest
        from helpers import swallowed

        @pytest.fixture
        def metadata():
            swallowed()

        def test_uses(metadata):
            pass
        """
    )
    result = suite.runpytest("--stepcache-debug")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*during this test's setup*", "*test_uses (setup)*"])


def test_a_conftest_that_resets_the_mode_does_not_turn_it_off(
    suite: pytest.Pytester,
) -> None:
    suite.makeconftest(
        """
        import pytest, stepcache

        @pytest.fixture(autouse=True)
        def clean():
            stepcache.set_debug("off")
            yield
            stepcache.set_debug("off")
        """
    )
    suite.makepyfile(test_swallowing=SWALLOWING)
    suite.runpytest("--stepcache-debug").assert_outcomes(failed=1, passed=2)


def test_stats_are_summed_over_tests(suite: pytest.Pytester) -> None:
    suite.makeconftest(
        """
        import pytest, stepcache

        @pytest.fixture(autouse=True)
        def zero():
            stepcache.reset_stats()  # like this repository's own conftest
        """
    )
    suite.makepyfile(
        """
        import pytest, torch
        from helpers import Meta, total

        @pytest.mark.parametrize("i", range(3))
        def test_three_calls(i):
            m = Meta(torch.tensor([i, 1]))
            assert total(m) == total(m) == total(m) == i + 1
        """
    )
    result = suite.runpytest("--stepcache-stats")
    result.assert_outcomes(passed=3)
    lines = result.stdout.lines
    start = lines.index(next(line for line in lines if "stepcache stats" in line))
    assert lines[start + 1].split() == [
        "function",
        "hits",
        "misses",
        "bypasses",
        "invalidations",
        "live",
        "bytes",
    ]
    row = next(line.split() for line in lines[start:] if line.startswith("total "))
    assert row[:5] == ["total", "6", "3", "0", "0"]
    assert "stepcache stats" not in suite.runpytest().stdout.str()


def test_stats_count_calls_on_both_sides_of_a_reset_in_one_phase(
    suite: pytest.Pytester,
) -> None:
    suite.makeconftest(
        """
        import pytest, stepcache, torch
        from helpers import Meta, total

        @pytest.fixture(autouse=True)
        def zero_then_build():
            m = Meta(torch.tensor([1, 1]))
            total(m), total(m)  # 1 miss, 1 hit before the reset
            stepcache.reset_stats()
            total(Meta(torch.tensor([2, 1])))  # 1 miss after it
        """
    )
    suite.makepyfile(
        """
        import torch
        from helpers import Meta, total

        def test_one(): assert total(Meta(torch.tensor([3, 1]))) == 4
        def test_two(): assert total(Meta(torch.tensor([4, 1]))) == 5
        """
    )
    result = suite.runpytest("--stepcache-stats")
    result.assert_outcomes(passed=2)
    lines = result.stdout.lines
    row = next(line.split() for line in lines if line.startswith("total "))
    assert row[:3] == ["total", "2", "6"]  # per test: 1 hit; 2 misses set up, 1 run


def test_the_fixture_asked_for_at_run_time_starts_checks_mode(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        """
        from helpers import swallowed

        def test_dynamic(request):
            handle = request.getfixturevalue("stepcache_debug")
            assert handle.mode == "checks"
            swallowed()  # a detection the code caught: it fails the test
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(failed=1)
    assert "[dependency-changed]" in result.stdout.str()


def test_a_full_report_does_not_hide_the_next_tests_detection(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        """
        import pytest, stepcache
        from helpers import swallowed

        def test_many_on_purpose(stepcache_debug):  # fills the core's 10,000
            stepcache.clear_debug_report()  # what earlier sessions left in it
            for _ in range(10_000):
                swallowed()
            assert len(stepcache_debug.take()) == 10_000

        @pytest.mark.stepcache_debug
        def test_real_bug():
            swallowed()
        """
    )
    result = suite.runpytest()
    result.assert_outcomes(passed=1, failed=1)
    failed = [r.nodeid for r in result.reprec.getreports() if r.failed]  # type: ignore[attr-defined]
    assert [n.rpartition("::")[2] for n in failed] == ["test_real_bug"]


def test_a_fixture_after_a_reset_and_a_skip_after_a_detection_are_caught(
    suite: pytest.Pytester,
) -> None:
    suite.makeconftest(
        """
        import pytest, stepcache

        @pytest.fixture(autouse=True)
        def reset_switches():
            stepcache.set_debug("off")
        """
    )
    suite.makepyfile(
        """
        import pytest
        from helpers import swallowed

        @pytest.fixture
        def built():  # set up after the reset
            swallowed()

        def test_uses_fixture(built):
            pass

        def test_skips_after_a_detection():
            swallowed()
            pytest.skip("not on this platform")
        """
    )
    result = suite.runpytest("--stepcache-debug")
    result.assert_outcomes(errors=1, failed=1)


def test_an_unexpected_pass_after_a_detection_fails_and_an_expected_failure_stays(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        """
        import pytest
        from helpers import swallowed

        @pytest.mark.xfail(reason="flaky elsewhere")
        def test_xpasses_after_a_detection():
            swallowed()

        @pytest.mark.xfail(reason="a known bug")
        def test_xfails_after_a_detection():
            swallowed()
            raise RuntimeError("the known bug")
        """
    )
    result = suite.runpytest("--stepcache-debug")
    result.assert_outcomes(failed=1, xfailed=1)
    failed = [r.nodeid for r in result.reprec.getreports() if r.failed]  # type: ignore[attr-defined]
    assert [n.rpartition("::")[2] for n in failed] == ["test_xpasses_after_a_detection"]


def test_the_entry_point_registers_the_plugin(suite: pytest.Pytester) -> None:
    suite.makepyfile(test_swallowing=SWALLOWING)
    result = suite.runpytest_subprocess("--stepcache-debug")
    result.assert_outcomes(failed=1, passed=2)
    disabled = suite.runpytest_subprocess("-p", "no:stepcache", "--stepcache-debug")
    assert disabled.ret == pytest.ExitCode.USAGE_ERROR
    assert "unrecognized arguments: --stepcache-debug" in disabled.stderr.str()


def test_a_session_that_does_not_use_it_imports_neither_stepcache_nor_torch(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import sys

        def test_nothing_loaded():
            assert "stepcache_pytest" in sys.modules  # the entry point is loaded
            assert "stepcache" not in sys.modules
            assert "torch" not in sys.modules
        """
    )
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


def test_a_marked_test_in_a_fresh_process_registers_the_plugin(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        """
        import pytest
        from helpers import swallowed

        @pytest.mark.stepcache_debug
        def test_marked():
            swallowed()

        def test_unmarked():
            swallowed()
        """
    )
    result = suite.runpytest_subprocess()
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*test_marked*dependency-changed*"])
