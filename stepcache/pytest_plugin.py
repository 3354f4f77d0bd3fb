# SPDX-License-Identifier: Apache-2.0
"""pytest plugin: run any test suite in stepcache debug mode, and print cache stats.

Its ``pytest11`` entry point, the module ``stepcache_pytest``, is loaded wherever
stepcache is installed; it declares the options, the marker and the fixture, and
registers this module only when a session uses one of them (so a session that does not
imports neither stepcache nor torch). Nothing happens unless asked:

* ``pytest --stepcache-debug`` (``checks``) or ``--stepcache-debug=verify`` runs every
  test in debug mode. A detection fails the test during which it happened, even when
  the test's code caught the exception; every detection is listed at the end.
* ``@pytest.mark.stepcache_debug(mode="checks")`` does the same for one test
  (``mode="off"`` exempts a test from ``--stepcache-debug``).
* The ``stepcache_debug`` fixture switches debug mode on for its test and gives a
  handle: ``stepcache_debug.take()`` returns the test's detections so far and accepts
  them (they no longer fail the test), for tests that provoke a detection on purpose.
* ``pytest --stepcache-stats`` prints the per-function hit/miss table at the end,
  summed over every test (counters reset by a test are accounted before the reset).

``-p no:stepcache`` disables the plugin. The plugin follows the process-wide debug
report (:func:`stepcache.debug_report`): a test that clears it itself hides the
detections made before the clear. The report keeps at most 10,000 detections; the
plugin keeps its own copy and clears the process report when it grows past half of that.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Final

import attrs
import pytest

import stepcache
from stepcache import Detection, _stats
from stepcache_pytest import MARKER, MODES, _register

__all__ = ["DebugHandle"]

_CLEAR_AT: Final = 5_000
_STAT_FIELDS: Final = ("hits", "misses", "bypasses", "invalidations")


@attrs.define
class _Found:
    """A detection, where it happened."""

    nodeid: str
    when: str
    detection: Detection
    accepted: bool = False


@attrs.define
class _Session:
    mode: str | None
    stats: bool
    mode_before: str = "off"
    #: the process report as it was at the last checkpoint
    seen: tuple[Detection, ...] = ()
    found: list[_Found] = attrs.Factory(list)
    #: function name -> summed counters
    totals: dict[str, list[int]] = attrs.Factory(dict)


@attrs.define
class _Test:
    mode: str
    mode_before: str
    handle: DebugHandle | None = None
    #: ids of detections accepted through the fixture
    accepted: set[int] = attrs.Factory(set)
    found: list[Detection] = attrs.Factory(list)
    #: how many of ``found`` the reports have dealt with
    reported: int = 0


_SESSION = pytest.StashKey[_Session]()
_TEST = pytest.StashKey[_Test]()


class DebugHandle:
    """What the ``stepcache_debug`` fixture gives a test."""

    def __init__(self, session: _Session, test: _Test) -> None:
        self._session = session
        self._test = test

    @property
    def mode(self) -> str:
        """The debug mode of this test."""
        return self._test.mode

    @property
    def detections(self) -> tuple[Detection, ...]:
        """This test's detections so far (accepted ones included)."""
        _checkpoint(self._session, self._test)
        return tuple(self._test.found)

    def take(self) -> tuple[Detection, ...]:
        """This test's detections not taken yet; they no longer fail the test."""
        _checkpoint(self._session, self._test)
        taken = tuple(d for d in self._test.found if id(d) not in self._test.accepted)
        self._test.accepted.update(id(d) for d in taken)
        return taken


# -- set-up ------------------------------------------------------------------------------
# (The options, the marker and the fixture are declared by the entry-point module,
# stepcache_pytest, which registers this module when a session needs it.)
def pytest_configure(config: pytest.Config) -> None:
    state = _Session(
        mode=config.getoption("stepcache_debug", None),
        stats=bool(config.getoption("stepcache_stats", False)),
    )
    # registered after the session started (for a marked test), this module gets no
    # pytest_sessionstart: the report's state now is where it starts following it
    state.seen = stepcache.debug_report().detections
    config.stash[_SESSION] = state


def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash.get(_SESSION, None)
    if state is None:
        return
    state.seen = stepcache.debug_report().detections
    if state.mode is not None:
        state.mode_before = stepcache.get_debug()
        stepcache.set_debug(state.mode)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_SESSION, None)
    if state is not None and state.mode is not None:
        stepcache.set_debug(state.mode_before)


# -- the fixture and the per-test mode ----------------------------------------------------
def debug_handle(request: pytest.FixtureRequest) -> DebugHandle:
    """The ``stepcache_debug`` fixture's value (the fixture is declared by
    ``stepcache_pytest``): this test's handle on its debug mode and detections."""
    state = request.config.stash.get(_SESSION, None)
    test: _Test | None = request.node.stash.get(_TEST, None)
    if test is None and isinstance(request.node, pytest.Item):
        # asked for at run time (request.getfixturevalue): this test starts now
        if state is None:
            _register(request.config)
            state = request.config.stash[_SESSION]
        test = request.node.stash[_TEST] = _Test("checks", stepcache.get_debug())
        _checkpoint(state, None)
        stepcache.set_debug(test.mode)
    if state is None or test is None or test.mode == "off":
        pytest.fail(
            "the stepcache_debug fixture is for tests (not for a mark with mode='off')",
            pytrace=False,
        )
    handle = test.handle
    if handle is None:
        handle = test.handle = DebugHandle(state, test)
    return handle


def _mode_of(item: pytest.Item, state: _Session) -> str | None:
    marker = item.get_closest_marker(MARKER)
    if marker is not None:
        mode = marker.kwargs.get("mode", marker.args[0] if marker.args else "checks")
        if mode not in MODES:
            raise ValueError(
                f"@pytest.mark.stepcache_debug(mode={mode!r}): mode must be one of "
                f"{', '.join(MODES)}"
            )
        return str(mode)
    if state.mode is not None:
        return state.mode
    if MARKER in getattr(item, "fixturenames", ()):
        return "checks"
    return None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    state = item.config.stash.get(_SESSION, None)
    if state is None:
        return (yield)
    try:
        mode = _mode_of(item, state)
    except ValueError as exc:
        # Fail after the other set-up hooks ran, so that their teardowns find their
        # state.
        yield
        pytest.fail(str(exc), pytrace=False)
    if mode is not None:
        test = _Test(mode=mode, mode_before=stepcache.get_debug())
        item.stash[_TEST] = test
        _checkpoint(state, None)
        stepcache.set_debug(mode)
    with _counting(state):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    test = request.node.stash.get(_TEST, None)
    if test is not None and stepcache.get_debug() != test.mode:
        stepcache.set_debug(test.mode)  # an earlier fixture switched it (a reset)
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    state = item.config.stash.get(_SESSION, None)
    if state is None:
        return (yield)
    test = item.stash.get(_TEST, None)
    if test is not None and stepcache.get_debug() != test.mode:
        stepcache.set_debug(test.mode)  # a fixture switched it (a conftest's reset)
    with _counting(state):
        return (yield)


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    state = item.config.stash.get(_SESSION, None)
    if state is None:
        return (yield)
    try:
        with _counting(state):
            return (yield)
    finally:
        test = item.stash.get(_TEST, None)
        if test is not None:
            _checkpoint(state, test)
            stepcache.set_debug(
                state.mode if state.mode is not None else test.mode_before
            )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    state = item.config.stash.get(_SESSION, None)
    test = item.stash.get(_TEST, None)
    if state is None or test is None or test.mode == "off":
        return report
    _checkpoint(state, test)
    new, test.reported = test.found[test.reported :], len(test.found)
    fresh = [d for d in new if id(d) not in test.accepted]
    for d in new:
        state.found.append(_Found(item.nodeid, call.when, d, id(d) in test.accepted))
    if not fresh:
        return report
    text = _failure_text(test.mode, call.when, fresh)
    # a skip or an unexpected pass (xpass) would hide it: it fails, as a pass does; an
    # expected failure stays one
    if report.passed or (report.skipped and not hasattr(report, "wasxfail")):
        report.outcome = "failed"
        report.longrepr = text
        if hasattr(report, "wasxfail"):
            del report.wasxfail
    else:
        report.sections.append((f"stepcache detections ({call.when})", text))
    return report


def _failure_text(mode: str, when: str, found: list[Detection]) -> str:
    lines = [
        f"stepcache debug mode ({mode}) detected {len(found)} problem(s) during this "
        f"test's {when}, whether or not the test caught the error:"
    ]
    lines += [f"{i}. [{d.kind}] {d.message}" for i, d in enumerate(found, 1)]
    lines.append(
        "Fix the cache as the message says; a test that provokes a detection on "
        "purpose accepts it with the stepcache_debug fixture: stepcache_debug.take()."
    )
    return "\n".join(lines)


# -- following the process report ------------------------------------------------------------
def _checkpoint(state: _Session, test: _Test | None) -> None:
    """Attribute the detections since the last checkpoint to ``test`` (or to no test)."""
    now = stepcache.debug_report().detections
    before = state.seen
    if len(now) >= len(before) and (not before or now[len(before) - 1] is before[-1]):
        fresh = list(now[len(before) :])
    else:  # the report was cleared since
        ids = {id(d) for d in before}
        fresh = [d for d in now if id(d) not in ids]
    if test is not None:
        test.found.extend(fresh)
    elif fresh and state.mode is not None:
        # Outside tests (collection, between tests) only --stepcache-debug reports.
        state.found.extend(_Found("(outside tests)", "-", d) for d in fresh)
    if len(now) >= _CLEAR_AT:  # the core keeps 10,000: later ones would go unseen
        stepcache.clear_debug_report()
        now = ()
    state.seen = now


# -- stats over the session ----------------------------------------------------------------------
class _counting:
    """Adds the stats counters' growth over one test phase to the session's totals."""

    def __init__(self, state: _Session) -> None:
        self.state = state
        self.before: dict[str, tuple[int, ...]] = {}

    def __enter__(self) -> None:
        if self.state.stats:
            self.before = _counters()
            _stats.before_reset.append(self.reset)

    def __exit__(self, *exc: object) -> None:
        if self.state.stats:
            _stats.before_reset.remove(self.reset)
            self.add()

    def reset(self) -> None:
        """``reset_stats()`` is about to zero every counter: add them first."""
        self.add()
        self.before = {}

    def add(self) -> None:
        """Add the counters' growth since the phase began (or was last added)."""
        now = _counters()
        for name, after in now.items():
            before = self.before.get(name, (0,) * len(after))
            total = self.state.totals.setdefault(name, [0] * len(after))
            for i, (a, b) in enumerate(zip(after, before, strict=True)):
                total[i] += a - b
        self.before = now


def _counters() -> dict[str, tuple[int, ...]]:
    return {
        row.name: tuple(getattr(row, f) for f in _STAT_FIELDS)
        for row in stepcache.stats().rows
    }


def _stats_table(state: _Session) -> stepcache.StatsTable:
    live = {row.name: row for row in stepcache.stats(include_idle=True).rows}
    rows = []
    for name, (hits, misses, bypasses, invalidations) in state.totals.items():
        if not (hits or misses or bypasses or invalidations):
            continue
        now = live.get(name)
        rows.append(
            stepcache.FunctionStats(
                name,
                hits,
                misses,
                bypasses,
                invalidations,
                now.live_entries if now else 0,
                now.live_bytes if now else 0,
            )
        )
    return stepcache.StatsTable(tuple(rows))


# -- the end of the session -----------------------------------------------------------------
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    state = config.stash.get(_SESSION, None)
    if state is None:
        return
    if state.mode is not None or any(not f.accepted for f in state.found):
        _checkpoint(state, None)
        _print_detections(terminalreporter, state)
    if state.stats:
        terminalreporter.write_sep("=", "stepcache stats")
        terminalreporter.write_line(str(_stats_table(state)))


def _print_detections(tr: pytest.TerminalReporter, state: _Session) -> None:
    mode = f"--stepcache-debug={state.mode}" if state.mode else "marked tests"
    found = [f for f in state.found if not f.accepted]
    accepted = len(state.found) - len(found)
    tests = {f.nodeid for f in found if f.when != "-"}
    tr.write_sep("=", "stepcache debug")
    tail = (
        f" ({accepted} more accepted with stepcache_debug.take())" if accepted else ""
    )
    if not found:
        tr.write_line(f"stepcache debug ({mode}): no detections{tail}")
        return
    tr.write_line(
        f"stepcache debug ({mode}): {len(found)} detection(s) in {len(tests)} "
        f"test(s){tail}"
    )
    for f in found:
        where = f.nodeid if f.when == "-" else f"{f.nodeid} ({f.when})"
        tr.write_line(f"{where}: [{f.detection.kind}] {f.detection.message}")
