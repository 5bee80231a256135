"""vLLM's engine processes in a process group of their own, tied to the server's life.

A terminal's Ctrl-C and systemd's or a shell's group-wide SIGTERM reach every process of the
server's group at once. vLLM's engine core and workers exit on that signal at once, so in-flight
requests died with an engine error instead of the server's drain. Spawned through this launcher,
they start in a new process group (group signals reach only the server, which drains and then
shuts the engine down itself), and the kernel sends them SIGTERM if the server process dies
(PR_SET_PDEATHSIG), so a killed server never leaves a 3 GB worker behind.

`multiprocessing` spawns children as `<executable> [flags] -c <bootstrap> --multiprocessing-fork`;
with `use_launcher()` the executable is the `llmserve-engine-process` console script, whose
`main` detaches and then execs the real interpreter with the same arguments.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

LAUNCHER_NAME = "llmserve-engine-process"
PR_SET_PDEATHSIG = 1


def launcher_path() -> Path | None:
    """The console script, installed beside the interpreter that runs the server."""
    path = Path(sys.executable).parent / LAUNCHER_NAME
    return path if os.access(path, os.X_OK) else None


def use_launcher() -> bool:
    """Spawn this process's multiprocessing children through the launcher; False if not installed."""
    path = launcher_path()
    if path is None or not sys.platform.startswith("linux"):
        logger.warning(
            "%s not found beside %s: engine processes share the server's process group",
            LAUNCHER_NAME,
            sys.executable,
        )
        return False
    multiprocessing.set_executable(str(path))
    return True


def main() -> None:
    """Detach from the server's process group, die with the server, become the interpreter."""
    server = os.getppid()
    os.setpgrp()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != server:  # the server died before prctl took effect
        sys.exit(1)
    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
