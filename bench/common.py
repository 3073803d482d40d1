"""Helpers shared by the benchmarks in bench/ (standard library only).

    child_env     the environment of a child run: bytecode cache on, no proxies, loopback
                  only, and either a fake server's URL with a test key or no key at all
    positive_int  an argparse type: an int of at least 1
    disk_floor    the time of one fsync'd write in a folder: the floor per-row figures
                  are set against
    Child         a child in a session of its own, its stdout read line by line, under a
                  watchdog that kills its process group after a timeout
    row_line      whether a line of the runner's console is a row line, and its words

The scripts import this module as a sibling: each puts its own folder, bench/, on
sys.path next to the repository root.
"""

import argparse
import os
import signal
import subprocess
import threading
import time

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
CLOSED_URL = "http://127.0.0.1:9"  # the discard port: closed, loopback only
TEST_KEY = "test-key"


def child_env(url=None):
    """The environment of a child run.

    PYTHONDONTWRITEBYTECODE is unset, so the child uses the bytecode cache as a user's
    second run would, and the proxy variables are removed (NO_PROXY names the loopback),
    so the client talks to 127.0.0.1 directly. With `url` (a fake server's), the child
    gets it as PERPLEXITY_BASE_URL with a test key; without, it gets no key at all and
    the closed discard port, so nothing can leave the machine.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    for name in PROXY_VARIABLES:
        env.pop(name, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    if url is None:
        env.pop("PERPLEXITY_API_KEY", None)
        env["PERPLEXITY_BASE_URL"] = CLOSED_URL
    else:
        env["PERPLEXITY_BASE_URL"] = url
        env["PERPLEXITY_API_KEY"] = TEST_KEY
    return env


def positive_int(text):
    """argparse type: an int of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def disk_floor(folder, block_bytes, count, statistic, step=None, truncate=False):
    """`statistic` (e.g. statistics.median or .mean) of `count` timed writes in `folder`.

    Each write is a pwrite of block_bytes at the current end, then (with `truncate`) an
    ftruncate to end + block_bytes, then an fsync; the end then advances by `step` bytes
    (default block_bytes: plain appends). With a step smaller than the block, each write
    rewrites the previous one's tail, like the runner's checkpoint (a row plus the summary).
    """
    step = block_bytes if step is None else step
    path = os.path.join(folder, "fsync-floor")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    block = b"x" * block_bytes
    timings, end = [], 0
    try:
        for _ in range(count):
            started = time.perf_counter()
            os.pwrite(fd, block, end)
            if truncate:
                os.ftruncate(fd, end + block_bytes)
            os.fsync(fd)
            timings.append(time.perf_counter() - started)
            end += step
    finally:
        os.close(fd)
        os.unlink(path)
    return statistic(timings)


class Child:
    """A child process whose stdout is a pipe read line by line, under a watchdog.

    The child runs in a session of its own, so the watchdog's SIGKILL after `timeout`
    seconds reaches its whole process group (a runner under GNU time too); `timed_out`
    tells whether it fired. close(), or leaving a `with` block, cancels the watchdog,
    kills and reaps the child if it still runs, and closes its stdout.
    """

    def __init__(self, argv, env, cwd, timeout, stderr):
        self.timed_out = threading.Event()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                     env=env, cwd=cwd, start_new_session=True)
        self.watchdog = threading.Timer(timeout, self._expire)
        self.watchdog.start()

    def _expire(self):
        self.timed_out.set()
        self.kill()

    def kill(self):
        """SIGKILL the child's process group (if it is still there)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass

    def close(self):
        self.watchdog.cancel()
        if self.proc.poll() is None:
            self.kill()
            self.proc.wait()
        self.proc.stdout.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def row_line(line, models, case_ids):
    """(text, words) of one line of the runner's console if it is a row line, else None.

    `line` is the raw bytes read from the pipe. A row line's first word is a model of the
    run and its second a case id; anything else (the summary JSON, notes) is not a row.
    """
    text = line.decode("utf-8", "replace").rstrip("\n")
    words = text.split()
    if len(words) >= 2 and words[0] in models and words[1] in case_ids:
        return text, words
    return None
