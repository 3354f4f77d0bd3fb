# SPDX-License-Identifier: Apache-2.0
"""Import vLLM once, then fork one child per engine run (tests/engine/engine_run.py).

Importing vLLM costs about 12 s of CPU; the engine runs of tests/engine take 6-15 s
each after it. A child forked after the import is still a fresh engine for the
plugin: vLLM loads plugins in ``LLM()``, which the child calls, under the
environment the run was given (``STEPCACHE_VLLM`` included), the way vLLM itself
forks workers from a process that has imported it. Nothing of stepcache is imported
here.

``--triton`` sets Triton's interpreter up before the import
(:func:`engine_run.triton_interpreted`): the runs on vLLM's V2 model runner, and
DeepSeek V4's, need it, and the others must not have it (vLLM decides whether
Triton runs when it is imported).

Protocol: one JSON object per line on stdin, ``{"argv": [...], "env": {...},
"log": PATH, "rc": PATH, "timeout": SECONDS}``. Each starts a child that runs
``engine_run.main(argv)`` with exactly ``env`` as its environment and its stdout
and stderr in ``log``; when the child ends (or is killed after ``timeout``) the
server writes its exit status to ``rc`` (``-N`` for signal N). At the end of
stdin it waits for its children and exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import engine_run


def _child(job: dict[str, Any]) -> int:
    """In the forked child: the run, with the job's environment and log."""
    os.environ.clear()
    os.environ.update(job["env"])
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # not the server's job stream
    log = os.open(job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    try:
        return engine_run.main(list(job["argv"]))
    except SystemExit as exc:
        code = exc.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve() -> None:
    if "--triton" in sys.argv[1:]:
        engine_run.triton_interpreted()
    import vllm  # noqa: F401  (the import the children share)
    from vllm import LLM, SamplingParams  # noqa: F401

    running: dict[int, tuple[Path, float]] = {}  # pid -> rc path, deadline
    stdin = sys.stdin.buffer
    open_input = True
    while open_input or running:
        if open_input and select.select([stdin], [], [], 0.2)[0]:
            line = stdin.readline()
            if not line:
                open_input = False
            elif line.strip():
                job = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    os._exit(_child(job))
                running[pid] = (Path(job["rc"]), time.monotonic() + job["timeout"])
        elif not open_input:
            time.sleep(0.2)
        for pid, (rc_path, deadline) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == 0:
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)  # reaped on the next round
                continue
            del running[pid]
            tmp = rc_path.with_suffix(".tmp")
            tmp.write_text(str(os.waitstatus_to_exitcode(status)))
            tmp.rename(rc_path)  # whole, for the reader that polls for it


if __name__ == "__main__":
    serve()
