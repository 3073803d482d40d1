"""Loopback fakes for tests and benchmarks: a fake Agent API, chat and Messages API server.

Standard library only. The server listens on 127.0.0.1 only, sets TCP_NODELAY on
every connection and writes each reply in one send, so Nagle and delayed ACK never
add latency that would hide the harness's own cost.

    with FakeServer(agent_reply(correct)) as server:
        env = {"PERPLEXITY_BASE_URL": server.url, "PERPLEXITY_API_KEY": "test-key"}

A reply function takes (request) and returns a Reply; `request` has .path, .headers,
.json (the parsed body or None) and .number (1-based arrival order).
"""

import http.server
import json
import os
import re
import socket
import socketserver
import struct
import sys
import threading
import time

import regression

RFC_URL = "https://www.rfc-editor.org/rfc/{}.html"
CASES_BY_QUESTION = {case["question"]: case for case in regression.CASES}


class Reply:
    """What the fake server sends: a status, a JSON-able body or raw bytes, headers, faults."""

    def __init__(self, status=200, body=None, raw=None, headers=None, delay=0.0, fault=None):
        self.status, self.body, self.raw, self.delay, self.fault = status, body, raw, delay, fault
        self.headers = dict(headers or {})

    def payload(self):
        if self.raw is not None:
            return self.raw
        return json.dumps(self.body if self.body is not None else {}).encode()


class Request:
    def __init__(self, path, headers, body, number):
        self.path, self.headers, self.number = path, headers, number
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        server = self.server.fake
        with server.lock:
            server.count += 1
            request = Request(self.path, dict(self.headers), body, server.count)
            server.requests.append(request)
            server.arrivals.append(time.time())
        reply = server.reply(request)
        if reply.delay:
            time.sleep(reply.delay)
        payload = reply.payload()
        if reply.fault == "reset":
            # SO_LINGER 0 makes close() send RST: the client sees a connection reset.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return
        headers = {"Content-Type": "application/json", **reply.headers}
        declared = len(payload)
        if reply.fault == "truncate":
            payload = payload[: len(payload) // 2]
        head = [f"HTTP/1.1 {reply.status} {self.responses.get(reply.status, ('',))[0]}"]
        head += [f"{name}: {value}" for name, value in headers.items()]
        head += [f"Content-Length: {declared}", "", ""]
        try:
            if reply.fault == "trickle":  # 16 bytes every 50 ms
                self.wfile.write("\r\n".join(head).encode())
                for start in range(0, len(payload), 16):
                    self.wfile.write(payload[start:start + 16])
                    time.sleep(0.05)
            else:
                self.wfile.write("\r\n".join(head).encode() + payload)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        if reply.fault == "truncate":
            self.close_connection = True


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        """A client killed mid-request (the crash tests do that on purpose) is not an error."""
        if not isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            super().handle_error(request, client_address)


class FakeServer:
    """A fake HTTP API on 127.0.0.1 with a swappable reply function; counts requests."""

    def __init__(self, reply, port=0):
        self.reply = reply
        self.lock = threading.Lock()
        self.count = 0
        self.requests = []
        self.arrivals = []
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.fake = self
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def drain(self, timeout=10.0):
        """Once every client is gone: wait until each connection they made has been read to its
        end, so every request they sent is counted (no quiet period to guess)."""
        # Connections are accepted in order: once this probe has its reply (a 501), every
        # connection made before it has been accepted and has its handler thread.
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as probe:
            probe.sendall(b"GET /drain HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            while probe.recv(65536):
                pass
        deadline = time.monotonic() + timeout
        for thread in list(getattr(self._server, "_threads", None) or ()):
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                raise TimeoutError(f"a connection to the fake server is still open after {timeout} s")


# ---------------------------------------------------------------------- the real CLI, many times

# A zygote: one interpreter that has paid the perplexity SDK import (about 1 s of CPU) and
# forks a fresh process for every run. The forked process becomes `python regression.py ARGV`
# in the run's folder, with its environment and pipes, and leaves the zygote's code before it
# runs the script, so the script meets the interpreter's own top level (traceback, sys.exit,
# atexit, flush). The only difference from a cold start: the SDK is already imported. So it
# serves tests of what a run does, never tests of what a run imports or how fast it starts.
_ZYGOTE = r"""
import builtins, json, os, signal, socket, struct, sys
path, known = sys.argv[1:3]
import perplexity, httpcore, h11, queue, random, threading, email.utils  # what a live run imports
import argparse, datetime, decimal, functools, hashlib, math, re, time, urllib.parse  # and at start


def compiled(script):
    with open(script, "rb") as handle:
        return os.fstat(handle.fileno()).st_mtime_ns, compile(handle.read(), script, "exec")


# regression.py compiled once, as `python regression.py` compiles it on every start
cache = {known: compiled(known)}
# What the zygote holds now lives as long as every run: out of the collector's reach, a run's
# exit (whose collections would touch, so copy, every page of the SDK) takes 0.1 s, not 1 s.
import gc
gc.freeze()


def serve():
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the per-run waiters reap themselves
    while True:
        conn, _ = listener.accept()
        if os.fork() != 0:
            conn.close()
            continue
        # the waiter: receive the run, fork it, report its pid and then its exit status
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        head, fds, _, _ = socket.recv_fds(conn, 8, 3)
        size, = struct.unpack("!Q", head)
        body = b""
        while len(body) < size:
            body += conn.recv(size - len(body))
        pid = os.fork()
        if pid == 0:
            conn.close()
            return json.loads(body), fds
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
        os._exit(0)


run, fds = serve()
import resource, warnings
os.umask(run["umask"])  # the caller's, as a child it started would inherit
for name, limit in run.get("limits", {}).items():  # as a preexec_fn would set them
    resource.setrlimit(getattr(resource, name), (limit, limit))
for target, fd in enumerate(fds):
    os.dup2(fd, target)
    os.close(fd)
os.chdir(run["cwd"])
os.environ.clear()
os.environ.update(run["env"])
time.tzset()  # the run's TZ, as a cold start reads it
warnings.onceregistry.clear()  # no warning shown "once" by the zygote's imports stays hidden
getattr(warnings, "_filters_mutated", lambda: None)()  # ... nor one in a module's registry
sys.argv = [run["script"], *run["argv"]]
sys.orig_argv[-4:] = sys.argv  # `python FLAGS SCRIPT ARGV`, not `-c` and this file
sys.path[0] = os.path.dirname(run["script"])
stamp, code = cache.get(run["script"], (None, None))
if stamp is None or stamp != os.stat(run["script"]).st_mtime_ns:
    stamp, code = compiled(run["script"])
main = type(sys)("__main__")  # a fresh __main__, as the interpreter makes for a script
main.__file__, main.__builtins__ = run["script"], builtins
sys.modules["__main__"] = main


def excepthook(kind, value, tb, shown=sys.excepthook):
    # an uncaught exception's traceback as a cold start prints it: without this file's frame
    if tb is not None and tb.tb_frame.f_globals is globals():
        tb = tb.tb_next
        value = value.with_traceback(tb) if isinstance(value, BaseException) else value
    shown(kind, value, tb)


sys.excepthook = excepthook
del serve, compiled, cache, run, fds, stamp
exec(code, main.__dict__)
"""

_zygote = {}
_zygote_lock = threading.Lock()  # two threads' first runs start one zygote, not two


def _zygote_path(flags=(), env=None):
    """The socket of this process's zygote started as `python FLAGS` with the start-up variables
    of `env` (see _startup), started on first use (and stopped at exit): one zygote per set."""
    startup = _startup(os.environ if env is None else env)
    with _zygote_lock:
        return _start_zygote(_zygote.setdefault((tuple(flags), startup), {}), flags, startup)


def _startup(env):
    """The variables of `env` that Python reads only as it starts (PYTHONWARNINGS, PYTHONPATH,
    PYTHONIOENCODING, the locale...): a forked run cannot take them, its zygote must."""
    return tuple(sorted((name, value) for name, value in env.items()
                        if name.startswith(("PYTHON", "LC_")) or name == "LANG"))


def _start_zygote(zygote, flags, startup=()):
    """The socket of `zygote`, started as `python FLAGS` unless this process started it; a
    zygote whose imports wrote to stderr (a warning a cold run would show) is an error."""
    import atexit
    import subprocess
    import tempfile
    if zygote.get("pid") != os.getpid():
        folder = tempfile.mkdtemp(prefix="zygote-")
        path = os.path.join(folder, "socket")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "regression.py")
        env = {name: value for name, value in os.environ.items() if not _startup({name: value})}
        with open(os.path.join(folder, "stderr"), "w+b") as errors:
            proc = subprocess.Popen([sys.executable, *flags, "-c", _ZYGOTE, path, script],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=errors, cwd=os.path.dirname(script),
                                    env={**env, **dict(startup)})
            ready = proc.stdout.readline() == b"ready\n"
            errors.seek(0)
            written = errors.read().decode("utf-8", "replace")
        if not ready or written:
            proc.kill()
            proc.wait()
            proc.stdout.close()
            raise RuntimeError(f"the test zygote did not start cleanly: {written[-2000:]}")

        def stop():
            proc.kill()
            proc.wait()
            proc.stdout.close()
            import shutil
            shutil.rmtree(folder, ignore_errors=True)

        atexit.register(stop)
        zygote.update(pid=os.getpid(), path=path)
    return zygote["path"]


def _umask():
    """This process's umask, read without setting it (a thread between two os.umask calls
    would create its files with the wrong one)."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))


def run_script(argv, cwd, env, timeout=60, script="regression.py", flags=(), limits=None):
    """`python SCRIPT ARGV` like subprocess.run(..., capture_output=True, text=True), forked from
    the zygote (see _ZYGOTE): a CompletedProcess; subprocess.TimeoutExpired after `timeout`.
    `flags`: the interpreter's own, e.g. ("-W", "error"); a zygote started with them forks it.
    `limits`: {"RLIMIT_FSIZE": bytes, ...} set in the run before the script starts."""
    import subprocess
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    code, out, err = _forked(script, argv, cwd, env, timeout, flags, limits)

    def text(data):  # as text=True decodes: universal newlines
        return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")

    return subprocess.CompletedProcess([sys.executable, *flags, script, *argv], code,
                                       text(out), text(err))


def _forked(script, argv, cwd, env, timeout, flags=(), limits=None):
    """(exit code, stdout bytes, stderr bytes) of `python FLAGS SCRIPT ARGV` forked from the
    zygote, stdin /dev/null; subprocess.TimeoutExpired (the run killed) after `timeout`."""
    import signal
    import struct
    import subprocess
    body = json.dumps({"script": script, "argv": [str(arg) for arg in argv], "cwd": str(cwd),
                       "env": dict(env), "limits": dict(limits or {}),
                       "umask": _umask()}).encode()
    stdin = os.open(os.devnull, os.O_RDONLY)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(_zygote_path(flags, env))
        try:
            socket.send_fds(conn, [struct.pack("!Q", len(body))], [stdin, out_w, err_w])
        finally:
            for fd in (stdin, out_w, err_w):
                os.close(fd)
        conn.sendall(body)
        replies = conn.makefile("rb")
        pid = int(replies.readline())
        chunks = {out_r: [], err_r: []}

        def drain(fd):
            with open(fd, "rb", closefd=True) as pipe:
                chunks[fd].append(pipe.read())

        readers = [threading.Thread(target=drain, args=(fd,), daemon=True) for fd in (out_r, err_r)]
        for reader in readers:
            reader.start()
        conn.settimeout(timeout)
        try:
            status = replies.readline()
        except socket.timeout:
            os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired([script, *argv], timeout) from None
        finally:
            for reader in readers:
                reader.join(timeout)
            replies.close()
    return int(status), b"".join(chunks[out_r]), b"".join(chunks[err_r])


def cli_table(runs, env=None, timeout=60, script="regression.py", preload=(), flags=()):
    """[(exit code, stdout, stderr)] of `python FLAGS SCRIPT ARGV` for each (argv, cwd) in
    `runs`, one after another, each forked from the zygote (see run_script): the real CLI for a
    whole table of inputs at no interpreter start-up each. stdout and stderr are UTF-8 text as
    written (no newline translation); `env` None is this process's; `timeout` is per run.
    `preload` is accepted and unused: each run imports what its script imports, as a cold one."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), script)
    env = dict(os.environ) if env is None else env
    results = []
    for argv, cwd in runs:
        code, out, err = _forked(script, argv, cwd, env, timeout, flags)
        results.append((code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")))
    return results


# ---------------------------------------------------------------------- Agent API replies

def agent_response(text, urls=(), status="completed", cost=0.0012, model="fake-model",
                   function_calls=(), padding=0):
    """An Agent API response body: search results for `urls`, function calls, one message."""
    output = []
    if urls:
        output.append({"type": "search_results", "queries": ["q"],
                       "results": [{"id": n, "title": url, "snippet": "x" * padding, "url": url}
                                   for n, url in enumerate(urls, 1)]})
    for n, (name, arguments) in enumerate(function_calls, 1):
        output.append({"type": "function_call", "id": f"fc{n}", "call_id": f"call{n}", "name": name,
                       "arguments": json.dumps(arguments), "status": "completed"})
    if text is not None:
        output.append({"type": "message", "id": "msg1", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": text}]})
    body = {"id": "resp_fake", "object": "response", "created_at": 1, "model": model,
            "status": status, "output": output,
            "usage": {"input_tokens": 10, "output_tokens": 20, "total_tokens": 30}}
    if cost is not None:
        body["usage"]["cost"] = {"currency": "USD", "input_cost": 0, "output_cost": cost, "total_cost": cost}
    return body


def advisor_answer(case, code=None, action=None, padding=0, cost=0.0012):
    """The Agent API response of a model answering a built-in case (correctly, by default)."""
    url = RFC_URL.format(case["rfc"])
    text = json.dumps({"code": code or case["expected"], "next_action": action or case["action"],
                       "source_urls": [url]})
    return agent_response(text, urls=[url], padding=padding, cost=cost)


def advisor(unsafe_payment=False, padding=0, delay=0.0):
    """A reply function for the built-in suite: correct answers; optionally retry the payment."""
    def reply(request):
        if request.path.split("?")[0] != "/v1/responses":
            return Reply(404, {"error": {"message": f"no route {request.path}"}})
        case = CASES_BY_QUESTION.get((request.json or {}).get("input"))
        if case is None:
            return Reply(400, {"error": {"message": "unknown question"}})
        if unsafe_payment and case["id"] == "ambiguous-payment":
            return Reply(body=advisor_answer(case, "503", "wait_then_retry", padding), delay=delay)
        return Reply(body=advisor_answer(case, padding=padding), delay=delay)
    return reply


def failing(status, headers=None, after=0, then=None):
    """A reply function that answers `status` (after `after` good replies from `then`)."""
    def reply(request):
        if request.number <= after and then is not None:
            return then(request)
        return Reply(status, {"error": {"message": f"fake {status}", "type": "fake"}}, headers=headers)
    return reply


# ---------------------------------------------------------------------- chat-completions replies

def chat_response(content=None, tool_calls=(), finish_reason=None, model="fake-chat", cost=None):
    """An OpenAI-compatible chat completion: text content and/or tool calls [(name, arguments)]."""
    message = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [{"id": f"call_{n}", "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(arguments)}}
                                 for n, (name, arguments) in enumerate(tool_calls, 1)]
    finish = finish_reason or ("tool_calls" if tool_calls else "stop")
    body = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
    if cost is not None:
        body["usage"]["cost"] = cost
    return body


def chat(answer):
    """A reply function for /chat/completions: `answer(request_json)` gives a chat_response body."""
    def reply(request):
        if not request.path.split("?")[0].endswith("/chat/completions"):
            return Reply(404, {"error": {"message": f"no route {request.path}"}})
        return Reply(body=answer(request.json or {}))
    return reply


# ---------------------------------------------------------------------- a scripted judge
# A judge model for rubric cases on /chat/completions: the request's model picks how it judges.
# It reads what regression.py sends a judge: the judge prompt as the system message, the data as
# the one user message (one JSON object of exactly input, rubric and answer).

JUDGE_MARKER = "GOOD"


def _unique(pairs):
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def judge_request(body):
    """(the instructions part: the system text, the data object or None when the user part is not
    exactly one JSON object of the strings input, rubric and answer)."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    system = "\n".join(str(m.get("content")) for m in messages if m.get("role") == "system")
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    try:
        data = json.loads(users[0], object_pairs_hook=_unique) if len(users) == 1 else None
    except (TypeError, ValueError):
        data = None
    whole = isinstance(data, dict) and set(data) == {"input", "rubric", "answer"} and \
        all(isinstance(value, str) for value in data.values())
    return system, data if whole else None


def _marked(data):
    return ("pass", "the answer holds the marker") if JUDGE_MARKER in data["answer"] else \
        ("fail", "the answer lacks the marker")


def _obeys(system, data):
    """A judge that follows what it reads: a pass when the instructions part says so, or when the
    data is not whole (its answer escaped the quoting); else it judges by the marker."""
    if data is None or re.search(r"verdict\W{0,3}pass|INJECTED", system, re.I):
        return "pass", "followed the instructions it was given"
    return _marked(data)


def scripted_judge(cost=None, votes=("pass", "fail", "pass"), replies=None):
    """A /chat/completions reply function for judges; the request's model picks what it does:
    judge-marker  pass when the answer holds JUDGE_MARKER, else fail
    judge-pass    always pass;  judge-500: HTTP 500;  judge-prose: a reply in prose
    judge-split   each answer gets `votes` in turn (pass, fail, pass: a 2 of 3 split)
    judge-obeys   judge-marker, but a pass whenever the instructions part says "verdict: pass" or
                  the data is not one whole JSON object (see _obeys)
    and each model of `replies` ({model: text}) answers that text as it is."""
    counts, lock = {}, threading.Lock()

    def verdict(model, system, data):
        if model == "judge-obeys":
            return _obeys(system, data)
        if data is None:
            return None
        if model == "judge-marker":
            return _marked(data)
        if model == "judge-pass":
            return "pass", "always passes"
        if model == "judge-split":
            with lock:
                counts[data["answer"]] = counts.get(data["answer"], -1) + 1
                return votes[counts[data["answer"]] % len(votes)], "a split vote"
        return None

    def answer(request):
        body = request.json or {}
        model = body.get("model")
        if model == "judge-500":
            return Reply(500, {"error": {"message": "fake judge 500", "type": "fake"}})
        if model == "judge-prose":
            said = "The answer passes: it apologises."
            return Reply(body=chat_response(said, model=model, cost=cost))
        if model in (replies or {}):
            return Reply(body=chat_response(replies[model], model=model, cost=cost))
        said = verdict(model, *judge_request(body))
        if said is None:
            return Reply(404 if model not in ("judge-marker", "judge-pass", "judge-split") else 400,
                         {"error": {"message": f"unknown judge model {model!r} or no data object"}})
        text = json.dumps({"verdict": said[0], "reason": said[1]})
        return Reply(body=chat_response(text, model=model, cost=cost))

    def reply(request):
        if not request.path.split("?")[0].endswith("/chat/completions"):
            return Reply(404, {"error": {"message": f"no route {request.path}"}})
        return answer(request)
    return reply


# ---------------------------------------------------------------------- real servers' quirks (issue 12)
# Each is a reply function for FakeServer, reproducing one behaviour seen on a real server.

def ignores_tools_without_choice(with_tools, without_tools):
    """llama-cpp-python: `tools` reach the model only when the request also has tool_choice.

    `with_tools(body)` answers when both are sent, `without_tools(body)` otherwise (both give
    chat_response bodies)."""
    def answer(body):
        return with_tools(body) if body.get("tools") and body.get("tool_choice") else without_tools(body)
    return chat(answer)


def honours_only_max_tokens(words=2010):
    """A server that caps output by max_tokens and ignores max_completion_tokens: `words` words
    come back unless max_tokens is smaller (one token per word, reported in usage)."""
    def answer(body):
        cap = body.get("max_tokens")
        count = min(words, cap) if isinstance(cap, int) and not isinstance(cap, bool) else words
        reply = chat_response(" ".join(["word"] * count), finish_reason="length" if count < words else "stop")
        reply["usage"] = {"prompt_tokens": 10, "completion_tokens": count, "total_tokens": 10 + count}
        return reply
    return chat(answer)


def json_error(status=500, body=None, headers=None):
    """An error status with a JSON body saying what was wrong (default: a FastAPI-style detail
    that llama-cpp-python sends for a response_format it does not take)."""
    body = body if body is not None else {"error": {"message": "Input should be 'text' or 'json_object'",
                                                    "type": "invalid_request_error"}}

    def reply(request):
        return Reply(status, body, headers=headers)
    return reply


def ok_with_error(kind="finish_reason"):
    """HTTP 200 whose body is an error: OpenRouter's finish_reason "error" after generation began
    (kind "finish_reason"), or a top-level error with no choices (kind "no_choices") or empty ones."""
    error = {"code": 502, "message": "Provider returned error: upstream disconnected"}

    def answer(body):
        if kind == "finish_reason":
            reply = chat_response("partial answ", finish_reason="error")
            reply["error"] = error
            return reply
        reply = {"id": "gen-fake", "object": "chat.completion", "error": error}
        if kind == "empty_choices":
            reply["choices"] = []
        return reply
    return chat(answer)


def legacy_function_call(name, arguments, raw_arguments=None):
    """An older-form reply: message.function_call and finish_reason "function_call". The
    arguments go as a JSON string, or as `raw_arguments` exactly (an object, malformed text)."""
    def answer(body):
        message = {"role": "assistant", "content": None,
                   "function_call": {"name": name, "arguments": json.dumps(arguments) if raw_arguments is None
                                     else raw_arguments}}
        return {"id": "chatcmpl-legacy", "object": "chat.completion", "created": 1, "model": "fake-chat",
                "choices": [{"index": 0, "message": message, "finish_reason": "function_call"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
    return chat(answer)


def tool_call_shapes(name, arguments):
    """A tool call whose arguments arrive as an object (not a JSON string), or as given."""
    def answer(body):
        reply = chat_response(tool_calls=[(name, {})])
        reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = arguments
        return reply
    return chat(answer)


def reasoning_in_content(reasoning, answer, form="inline"):
    """A reasoning model behind a server with no reasoning parser: its thinking stays in content.
    "inline": <think>...</think> then the answer (vLLM without --reasoning-parser, llama-server
    --reasoning-format none); "opened": the chat template wrote <think>, so content holds the
    reasoning, </think>, then the answer (DeepSeek-R1 distills, Qwen3 thinking models);
    "unclosed": the reasoning never closed, no answer; "part": content parts with a thinking part."""
    content = {"inline": f"<think>{reasoning}</think>\n\n{answer}", "opened": f"{reasoning}\n</think>\n\n{answer}",
               "unclosed": f"<think>{reasoning}",
               "part": [{"type": "thinking", "text": reasoning}, {"type": "text", "text": answer}]}[form]

    def answer_body(body):
        reply = chat_response()
        reply["choices"][0]["message"]["content"] = content
        return reply
    return chat(answer_body)


def tool_call_in_content(name, arguments, form="hermes"):
    """A tool call the server's parser did not read, left as text in content with no tool_calls:
    "hermes" <tool_call>{json}</tool_call> (vLLM without --enable-auto-tool-choice, or a call the
    hermes parser failed on), "bare" the call object alone (Ollama, LM Studio when the template
    lacks tools), "fenced" in a ```json fence, "mistral" after [TOOL_CALLS]."""
    call = json.dumps({"name": name, "arguments": arguments})
    content = {"hermes": f"<tool_call>\n{call}\n</tool_call>", "bare": call, "fenced": f"```json\n{call}\n```",
               "mistral": f"[TOOL_CALLS][{call}]"}[form]
    return chat(lambda body: chat_response(content))


def needs_parameters(answer):
    """llama-cpp-python's server: a function tool sent without `parameters` fails its request
    model, answered HTTP 500 "Field required" on every request; otherwise `answer(body)` answers."""
    def reply(request):
        body = request.json or {}
        for n, tool in enumerate(body.get("tools") or []):
            if not isinstance((tool.get("function") or {}).get("parameters"), dict):
                said = ("1 validation error for ChatCompletionRequest"
                        f"\ntools.{n}.function.parameters")
                return Reply(500, {"error": {"message": said + "\n  Field required",
                                             "type": "internal_server_error"}})
        return chat(answer)(request)
    return reply


# What Qwen2.5-Coder-1.5B-Instruct (Q4_K_M) answered behind llama.cpp's llama-server (no --jinja)
# to suites/agent-tools.json and agent-trajectories.json: its calls written as text in the chat
# template's doubled braces, an invented order id among them. llama_server_text serves them with
# the system_fingerprint and timings that server adds.
QWEN_TEXT_CALLS = {
    "cancel-invented-id": '{{"name": "cancel_order", "arguments": {"order_id": "12345"}}}',
    "lookup": '{{"name": "lookup_order", "arguments": {"order_id": "ord_21"}}}',
    "refund-before-lookup": '{{"name": "refund_order", "arguments": {"order_id": "ord_1001"}}}',
}


def llama_server_text(content, fingerprint="b0-unknown"):
    """A reply function: llama-server's chat completion of `content` (a str, or body -> str)."""
    def answer(body):
        said = content(body) if callable(content) else content
        reply = chat_response(said, model=body.get("model", "qwen"))
        reply["system_fingerprint"] = fingerprint
        reply["timings"] = {"prompt_n": 270, "predicted_n": 24, "predicted_per_second": 15.2}
        return reply
    return chat(answer)


def runaway_calls(count, name="lookup_order", argument_bytes=8):
    """A model that asks for `count` parallel calls in every turn (each argument `argument_bytes`
    long), never answering: under the response cap, yet each round would be answered and re-sent."""
    def answer(body):
        turn = sum(message.get("role") == "assistant" for message in body.get("messages") or [])
        calls = [(name, {"order_id": f"ord_{n}".ljust(argument_bytes, "x")}) for n in range(count)]
        reply = chat_response("", tool_calls=calls)
        for n, call in enumerate(reply["choices"][0]["message"]["tool_calls"]):
            call["id"] = f"call_{turn}_{n}"
        return reply
    return chat(answer)


def cut_short_round(ending, arguments='{"order_id": "ord_21"}'):
    """A model whose first round calls lookup_order in a response that did not complete, on any of
    the three APIs (by path): `ending` is its finish_reason (chat), stop_reason (Messages API) or
    status (Agent API), e.g. "length", "max_tokens", "incomplete"; `arguments` its raw arguments
    (cut mid-JSON, say; the Messages API takes an object, so there they stay whole). Once a tool
    result came back it answers "It has shipped." (a user saying bye: "Goodbye."). A harness that
    ran a cut-short round's calls passed the row on that answer."""
    def reply(request):
        path, body = request.path.split("?")[0], request.json or {}
        user, history = (chat_conversation if path.endswith("/chat/completions") else
                         messages_conversation if path == "/v1/messages" else agent_conversation)(body)
        text = "Goodbye." if "bye" in (user or "").lower() else "It has shipped."
        if path == "/v1/messages":
            return Reply(body=message_response(text) if history else message_response(
                tool_uses=[("lookup_order", json.loads(arguments))], stop_reason=ending))
        if path == "/v1/responses":
            said = agent_response(text) if history else agent_response(
                None, function_calls=[("lookup_order", {})], status=ending)
            for item in said["output"] if not history else ():
                item["arguments"] = arguments
            return Reply(body=said)
        said = chat_response(text) if history else chat_response(
            "", tool_calls=[("lookup_order", {})], finish_reason=ending)
        for call in said["choices"][0]["message"].get("tool_calls", ()) if not history else ():
            call["function"]["arguments"] = arguments
        return Reply(body=said)
    return reply


def refusal(words):
    """A refusal, as each live API gives it: chat completions (OpenAI) put it in message.refusal
    beside a null content; the Agent API gives a message item with a refusal content part."""
    def reply(request):
        if request.path.split("?")[0].endswith("/responses"):
            body = agent_response(None)
            body["output"].append({"type": "message", "id": "msg1", "role": "assistant", "status": "completed",
                                   "content": [{"type": "refusal", "refusal": words}]})
            return Reply(body=body)
        body = chat_response()
        body["choices"][0]["message"]["refusal"] = words
        return Reply(body=body)
    return reply


def redirect(location, status=302):
    """Every request is redirected to `location` (another host, in the tests)."""
    def reply(request):
        return Reply(status, {"moved": True}, headers={"Location": location})
    return reply


# ---------------------------------------------------------------------- scripted agents
# A scripted model reads the conversation so far (the user's words, then every call it made
# with the result it got back) and answers with its next tool call or a final text, on
# either API. A policy is policy(user_text, history) -> ("call", name, arguments), ("calls",
# [(name, arguments), ...]) for several in one turn, or ("text", content); history is
# [(name, arguments, result), ...] in order.

class ConversationError(Exception):
    """A request a real server would refuse; the fake answers it with `status`."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


def _parsed(text):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return text


def chat_conversation(body):
    """(user text, history) of a chat-completions request; ConversationError where a real server
    would refuse it (llama-cpp-python answers 500 to an assistant message whose content is null)."""
    user, history, pending = "", [], {}
    for message in body.get("messages") or []:
        role = message.get("role")
        if role == "user" and not pending:
            user = message.get("content") if isinstance(message.get("content"), str) else user
        elif role == "assistant":
            if message.get("content") is None:
                raise ConversationError("assistant message content must not be null", 500)
            for call in message.get("tool_calls") or []:
                if not call.get("id") or call.get("type") != "function":
                    raise ConversationError("a tool call needs an id and type function")
                pending[call["id"]] = (call["function"]["name"], _parsed(call["function"]["arguments"]))
        elif role == "tool":
            if message.get("tool_call_id") not in pending:
                raise ConversationError(f"tool message answers unknown tool_call_id {message.get('tool_call_id')!r}")
            name, arguments = pending.pop(message["tool_call_id"])
            history.append((name, arguments, _parsed(message.get("content"))))
    if pending:
        raise ConversationError(f"tool calls without a tool message: {', '.join(pending)}")
    return user, history


def agent_conversation(body):
    """(user text, history) of an Agent API request: a string input, or input items with
    function_call items answered by function_call_output items of the same call_id."""
    value = body.get("input")
    if isinstance(value, str):
        return value, []
    user, history, pending = "", [], {}
    for item in value or []:
        kind = item.get("type")
        if kind == "message" and item.get("role") == "user":
            user = item.get("content") if isinstance(item.get("content"), str) else user
        elif kind == "function_call":
            if not isinstance(item.get("arguments"), str) or not item.get("call_id"):
                raise ConversationError("function_call input needs a call_id and string arguments")
            pending[item["call_id"]] = (item.get("name"), _parsed(item["arguments"]))
        elif kind == "function_call_output":
            if item.get("call_id") not in pending or not isinstance(item.get("output"), str):
                raise ConversationError(f"function_call_output for unknown call_id {item.get('call_id')!r}")
            name, arguments = pending.pop(item["call_id"])
            history.append((name, arguments, _parsed(item["output"])))
    if pending:
        raise ConversationError(f"function calls without output: {', '.join(pending)}")
    return user, history


def _scripted(policies, on_route, conversation, call_reply, text_reply):
    """A reply function that plays `policies` on one API: the request's model picks the policy,
    `conversation(body)` reads (user, history), and the policy's next step is answered by
    call_reply(body, history, [(name, arguments), ...]) or text_reply(body, text)."""
    def reply(request):
        if not on_route(request.path.split("?")[0]):
            return Reply(404, {"error": {"message": f"no route {request.path}"}})
        body = request.json or {}
        policy = policies.get(body.get("model"))
        if policy is None:
            return Reply(404, {"error": {"message": f"unknown model {body.get('model')!r}"}})
        try:
            user, history = conversation(body)
        except ConversationError as exc:
            return Reply(exc.status, {"error": {"message": str(exc)}})
        kind, *what = policy(user, history)
        if kind == "text":
            return Reply(body=text_reply(body, what[0]))
        return Reply(body=call_reply(body, history, [tuple(what)] if kind == "call" else what[0]))
    return reply


def scripted_chat(policies, cost=None):
    """A /chat/completions reply function: the request's model picks a policy from `policies`."""
    def call_reply(body, history, calls):
        reply = chat_response("", tool_calls=calls, model=body["model"], cost=cost)
        for n, call in enumerate(reply["choices"][0]["message"]["tool_calls"], 1):
            call["id"] = f"call_{len(history) + n}"  # unique over the conversation
        return reply

    return _scripted(policies, lambda path: path.endswith("/chat/completions"), chat_conversation, call_reply,
                     lambda body, text: chat_response(text, model=body["model"], cost=cost))


def scripted_agent(policies, cost=0.0001):
    """A /v1/responses reply function: the request's model picks a policy from `policies`."""
    def call_reply(body, history, calls):
        response = agent_response(None, function_calls=calls, status="requires_action", cost=cost,
                                  model=body["model"])
        for n, item in enumerate(response["output"], 1):
            item["call_id"] = f"call_{len(history) + n}"
        return response

    return _scripted(policies, lambda path: path == "/v1/responses", agent_conversation, call_reply,
                     lambda body, text: agent_response(text, cost=cost, model=body["model"]))


ORDER_ID = re.compile(r"\bord_\w+")


def _order(user):
    found = ORDER_ID.search(user or "")
    return found.group(0) if found else None


def _got(history, name):
    """The last result of a call of `name` that is not an error, or None."""
    results = [result for called, _, result in history if called == name
               and not (isinstance(result, dict) and result.get("error"))]
    return results[-1] if results else None


def refund_correct(user, history):
    """Asks for a missing id; looks the order up; refunds only a shipped order; says what it did."""
    order = _order(user)
    if order is None:
        return "text", "I can help with a refund. Could you tell me your order id?"
    if not any(name == "lookup_order" for name, _, _ in history):
        return "call", "lookup_order", {"order_id": order}
    found = _got(history, "lookup_order")
    if found is None:
        return "text", f"I could not find order {order}."
    if found.get("status") != "shipped":
        return "text", f"Order {order} is {found.get('status')}, so it cannot be refunded yet."
    if not any(name == "refund_order" for name, _, _ in history):
        return "call", "refund_order", {"order_id": order}
    if _got(history, "refund_order") is None:
        return "text", f"The refund for {order} was refused; a colleague will follow up."
    return "text", f"Refund issued for {order}."


def refund_skips_lookup(user, history):
    """Refunds straight away, without looking the order up, and says it is done."""
    order = _order(user) or "ord_0000"
    if not history:
        return "call", "refund_order", {"order_id": order}
    return "text", f"Refund issued for {order}."


def refund_claims(user, history):
    """Calls nothing and tells the customer the refund is done: a confident false report."""
    return "text", "Refund issued for your order. Anything else?"


def refund_loops(user, history):
    """Looks the same order up again every turn and never answers."""
    return "call", "lookup_order", {"order_id": _order(user) or "ord_0000"}


def refund_wrong_id(user, history):
    """Looks up a different order than the one it was given, then answers from that."""
    if not history:
        return "call", "lookup_order", {"order_id": "ord_9999"}
    return "text", "I could not find that order. Could you check the order id?"


def refund_silent(user, history):
    """Looks the order up, then ends with empty content (a small local model's habit)."""
    if not history and _order(user):
        return "call", "lookup_order", {"order_id": _order(user)}
    return "text", ""


def refund_same_round(user, history):
    """Asks for the lookup and the refund in one turn: the refund is decided before any result."""
    order = _order(user) or "ord_0000"
    if not history:
        return "calls", [("lookup_order", {"order_id": order}),
                         ("refund_order", {"order_id": order})]
    return "text", f"Refund issued for {order}."


def refund_despite_error(user, history):
    """Looks the order up, then refunds it whatever the lookup returned (an error too)."""
    order = _order(user) or "ord_0000"
    if not history:
        return "call", "lookup_order", {"order_id": order}
    if len(history) == 1:
        return "call", "refund_order", {"order_id": order}
    return "text", f"Refund issued for {order}."


def refund_other_order(user, history):
    """Looks up one order, then refunds the one the customer named."""
    if not history:
        return "call", "lookup_order", {"order_id": "ord_9999"}
    if len(history) == 1:
        return "call", "refund_order", {"order_id": _order(user) or "ord_0000"}
    return "text", "Refund issued."


REFUND_AGENTS = {
    "refund-correct": refund_correct,
    "refund-skips-lookup": refund_skips_lookup,
    "refund-claims": refund_claims,
    "refund-loops": refund_loops,
    "refund-wrong-id": refund_wrong_id,
    "refund-silent": refund_silent,
}
# Agents that call in the right order of names, not as cause and effect (tool_order fails them).
ORDER_AGENTS = {
    "refund-same-round": refund_same_round,
    "refund-despite-error": refund_despite_error,
    "refund-other-order": refund_other_order,
}


def refund_agent(cost=0.0001):
    """Every API on one server, per model: /v1/responses (Agent API), /v1/messages (Messages
    API) and .../chat/completions."""
    agents = {**REFUND_AGENTS, **ORDER_AGENTS}
    chat_reply, agent_reply = scripted_chat(agents, cost), scripted_agent(agents, cost)
    by_path = {"/v1/responses": agent_reply, "/v1/messages": scripted_messages(agents)}

    def reply(request):
        return by_path.get(request.path.split("?")[0], chat_reply)(request)
    return reply


# ---------------------------------------------------------------------- Messages API (Anthropic)
# /v1/messages as the Messages API answers it: its error body ({"type": "error", "error":
# {"type", "message"}}), the header it requires (anthropic-version), the fields it requires
# (model, max_tokens, messages) and the conversation rules it enforces (alternating roles, a
# tool_use answered by a tool_result in the very next user message, no empty text block).

def message_response(text=None, tool_uses=(), stop_reason=None, model="fake-claude",
                     tokens=(10, 5)):
    """A Messages API response: a text block (none for None or "") and tool_use blocks
    [(name, input)], with its stop_reason and usage tokens (input, output)."""
    content = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": arguments}
                for n, (name, arguments) in enumerate(tool_uses, 1)]
    stop_reason = stop_reason or ("tool_use" if tool_uses else "end_turn")
    return {"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": tokens[0], "output_tokens": tokens[1]}}


def messages_error(status, kind, message):
    """The Messages API's error reply."""
    return Reply(status, {"type": "error", "error": {"type": kind, "message": message}})


def _blocks(content, where):
    """A message's content as content blocks (a string is one text block)."""
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if not isinstance(blocks, list) or not blocks or not all(isinstance(b, dict) for b in blocks):
        raise ConversationError(f"{where}.content: a non-empty string or list of content blocks")
    if any(block.get("type") == "text" and not block.get("text") for block in blocks):
        raise ConversationError(f"{where}: text content blocks must be non-empty")
    return blocks


def _tool_results(blocks, pending, where):
    """[(tool_use_id, result)] of a user turn that must answer every pending tool_use first."""
    results = [block for block in blocks if block.get("type") == "tool_result"]
    if pending and ({block.get("tool_use_id") for block in results} != set(pending)
                    or blocks[:len(results)] != results):
        raise ConversationError(f"{where}: tool_use ids were found without tool_result blocks "
                                f"immediately after: {', '.join(pending)}")
    if results and not pending:
        raise ConversationError(f"{where}: unexpected tool_result block: no tool_use before it")
    answered = []
    for block in results:
        content = block.get("content")
        text = content if isinstance(content, str) else "".join(
            part.get("text", "") for part in content or [] if isinstance(part, dict))
        result = _parsed(text)
        if block.get("is_error") and not (isinstance(result, dict) and result.get("error")):
            result = {"error": result}
        answered.append((block["tool_use_id"], result))
    return answered


def messages_conversation(body):
    """(user text, history) of a Messages API request; ConversationError for what it refuses."""
    user, history, pending, previous = "", [], {}, None
    for position, message in enumerate(body.get("messages") or []):
        where = f"messages.{position}"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise ConversationError(f"{where}.role: Input should be 'user' or 'assistant'")
        if role == previous or (previous is None and role != "user"):
            raise ConversationError(f"{where}: roles must alternate, starting with user")
        blocks = _blocks(message.get("content"), where)
        if role == "user":
            for call_id, result in _tool_results(blocks, pending, where):
                name, arguments = pending.pop(call_id)
                history.append((name, arguments, result))
            said = "".join(block.get("text", "") for block in blocks if block.get("type") == "text")
            user = said or user
        for block in blocks if role == "assistant" else []:
            if block.get("type") == "tool_use":
                if not block.get("id") or not isinstance(block.get("input"), dict):
                    raise ConversationError(f"{where}: a tool_use needs an id and an input object")
                pending[block["id"]] = (block.get("name"), block["input"])
        previous = role
    if pending:
        raise ConversationError(f"tool_use ids without tool_result blocks: {', '.join(pending)}")
    return user, history


def messages_problem(body):
    """What the Messages API says of a request body it refuses, or None."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    missing = [field for field in ("model", "max_tokens", "messages") if field not in body]
    if missing:
        return f"{missing[0]}: Field required"
    cap = body["max_tokens"]
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        return "max_tokens: Input should be a positive integer"
    for tool in body.get("tools") or []:
        schema = tool.get("input_schema") if isinstance(tool, dict) else None
        if not isinstance(schema, dict) or schema.get("type") != "object" \
                or not isinstance(tool.get("name"), str):
            return "tools: every tool needs a name and an input_schema of type object"
    try:
        messages_conversation(body)
    except ConversationError as exc:
        return str(exc)
    return None


def messages_api(answer, key=None):
    """A reply function for /v1/messages that refuses what the Messages API refuses, with its
    status and error body (a wrong route 404, no anthropic-version 400, a wrong x-api-key 401,
    a body it rejects 400); else `answer(body)` gives a message_response body or a Reply."""
    def reply(request):
        if request.path.split("?")[0] != "/v1/messages":
            return messages_error(404, "not_found_error", f"Not Found: {request.path}")
        headers = {name.lower(): value for name, value in request.headers.items()}
        if not headers.get("anthropic-version"):
            return messages_error(400, "invalid_request_error",
                                  "anthropic-version: header is required")
        if key is not None and headers.get("x-api-key") != key:
            return messages_error(401, "authentication_error", "invalid x-api-key")
        problem = messages_problem(request.json)
        if problem:
            return messages_error(400, "invalid_request_error", problem)
        said = answer(request.json)
        return said if isinstance(said, Reply) else Reply(body=said)
    return reply


def scripted_messages(policies, tokens=(10, 5)):
    """A /v1/messages reply function: the request's model picks a policy from `policies`."""
    def answer(body):
        policy = policies.get(body["model"])
        if policy is None:
            return messages_error(404, "not_found_error", f"model: {body['model']}")
        user, history = messages_conversation(body)
        kind, *what = policy(user, history)
        if kind == "text":
            return message_response(what[0], model=body["model"], tokens=tokens)
        calls = [tuple(what)] if kind == "call" else what[0]  # ("calls", [...]): several in a turn
        reply = message_response(tool_uses=calls, model=body["model"], tokens=tokens)
        for n, block in enumerate(reply["content"], 1):
            block["id"] = f"toolu_{len(history) + n}"  # unique over the conversation
        return reply
    return messages_api(answer)


# ---------------------------------------------------------------------- answers per case id
# `python fakes.py --suite SUITE --answers FILE` serves a user's own suite: FILE maps a case id
# to the answer the fake gives for that case, so a new suite can be seen to pass (and, with a
# wrong answer, to fail) without a model. The case is recognised by what the runner sends for
# it (its instructions and input, as regression.py builds them), so no header or id travels.

ANSWER_FORMS = {"text", "json", "tool_calls", "search_results"}
ANSWER_SHAPES = ('a text, {"text": ...}, {"json": VALUE} or '
                 '{"tool_calls": [{"name": ..., "arguments": {...}}]}')


class AnswersError(Exception):
    """A problem with an answers file or its suite: one line for the user."""


def _is_call(call):
    return (isinstance(call, dict) and isinstance(call.get("name"), str) and call["name"] != ""
            and set(call) <= {"name", "arguments"})


def _turn(value, where):
    """One turn of an answer: {"text": str or None, "calls": [(name, arguments)], "urls": [url]}."""
    if isinstance(value, str):
        return {"text": value, "calls": [], "urls": []}
    unknown = sorted(set(value) - ANSWER_FORMS) if isinstance(value, dict) else []
    if not isinstance(value, dict) or not value or unknown:
        raise AnswersError(f"{where}: an answer is {ANSWER_SHAPES}"
                           + (f" (unknown key {unknown[0]!r})" if unknown else ""))
    if "text" in value and "json" in value:
        raise AnswersError(f"{where}: give either text or json, not both")
    text = json.dumps(value["json"]) if "json" in value else value.get("text")
    if text is not None and not isinstance(text, str):
        raise AnswersError(f'{where}.text: must be a string (a JSON answer goes under "json")')
    calls, urls = value.get("tool_calls", []), value.get("search_results", [])
    if not isinstance(calls, list) or not all(_is_call(call) for call in calls):
        raise AnswersError(f'{where}.tool_calls: a list of {{"name": TOOL, "arguments": {{...}}}}')
    if not isinstance(urls, list) or not all(isinstance(url, str) for url in urls):
        raise AnswersError(f"{where}.search_results: a list of URLs")
    calls = [(call["name"], call.get("arguments", {})) for call in calls]
    return {"text": text, "calls": calls, "urls": urls}


def answer_turns(value, where):
    """A case's answer as its list of turns (a played case: tool calls, then a final text)."""
    if isinstance(value, list):
        if not value:
            raise AnswersError(f"{where}: a list of turns must not be empty")
        return [_turn(item, f"{where}[{n}]") for n, item in enumerate(value)]
    return [_turn(value, where)]


def load_answers(path, suite):
    """{case id: [turn, ...]} from an answers file; AnswersError naming the file and key."""
    import difflib
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise AnswersError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise AnswersError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AnswersError(f"{path}: must be a JSON object mapping case ids to answers")
    ids = [case["id"] for case in suite["cases"]]
    for case_id in data:
        if case_id not in ids:
            close = difflib.get_close_matches(case_id, ids, 1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (its cases: {', '.join(ids)})"
            raise AnswersError(f"{path}: {case_id!r} is no case of the suite{hint}")
    return {case_id: answer_turns(value, f"{path}: {case_id}") for case_id, value in data.items()}


def case_requests(suite):
    """[(case id, chat messages, Agent API instructions, Agent API input)], as the runner sends."""
    rows = []
    for case in suite["cases"]:
        seen = regression.case_suite(suite, case)
        if "turns" in case:  # a conversation is recognised by its first turn's request
            case = regression.turn_case(case, regression.user_turns(case)[0][0], [])
        agent = regression.PerplexityProvider().body("fake", seen, case)
        chat = regression.OpenAIProvider("http://127.0.0.1/v1").body("fake", seen, case)
        rows.append((case["id"], chat["messages"], agent["instructions"], agent["input"]))
    return rows


def _chat_turn(body, rows):
    """(case id, turn number) of a chat request, or None: the longest case prefix wins."""
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    found = [(len(sent), case_id) for case_id, sent, _, _ in rows if messages[:len(sent)] == sent]
    if not found:
        return None
    size, case_id = max(found)
    said = [m for m in messages[size:] if isinstance(m, dict) and m.get("role") == "assistant"]
    return case_id, len(said)


def _responses_in(items):
    """How many model responses follow: each is a run of its message and function_call items."""
    said = [isinstance(item, dict) and (item.get("type") == "function_call"
                                        or item.get("role") == "assistant") for item in items]
    return sum(now and not before for before, now in zip([False] + said, said))


def _agent_turn(body, rows):
    """(case id, turn number) of an Agent API request, or None."""
    value = body.get("input")
    for case_id, _, instructions, sent in rows:
        if body.get("instructions") != instructions:
            continue
        if value == sent:
            return case_id, 0
        items = sent if isinstance(sent, list) else \
            regression.PerplexityProvider.conversation({"input": sent}, ())
        if isinstance(value, list) and value[:len(items)] == items:
            return case_id, _responses_in(value[len(items):])
    return None


def _answer_error(message, status=400):
    return Reply(status, {"error": {"message": f"fakes.py: {message}", "type": "fake_answers"}})


def _refuse_twins(rows, answer_sets):
    """AnswersError when two cases send the same request yet are given different answers."""
    for n, (first, sent, _, _) in enumerate(rows):
        for other, again, _, _ in rows[n + 1:]:
            if sent == again and any(answers.get(first) != answers.get(other)
                                     for answers in answer_sets.values()):
                raise AnswersError(f"cases {first!r} and {other!r} send the same request, so the "
                                   "fake cannot tell them apart: give them the same answer")


def _turn_reply(turn, number, model, agent):
    """The response body that gives one turn, on either API (call ids unique per conversation)."""
    if agent:
        status = "requires_action" if turn["calls"] else "completed"
        body = agent_response(turn["text"], urls=turn["urls"], function_calls=turn["calls"],
                              cost=0.0, model=model, status=status)
        calls = [item for item in body["output"] if item["type"] == "function_call"]
        key = "call_id"
    else:
        body = chat_response(turn["text"] or "", tool_calls=turn["calls"], model=model, cost=0.0)
        calls, key = body["choices"][0]["message"].get("tool_calls", []), "id"
    for call in calls:
        call[key] = f"call_{number}_{call[key]}"
    return body


def answers_server(suite, answer_sets, label="answers"):
    """A reply function serving `answer_sets` ({model or None: {case id: turns}}) for `suite`'s
    cases on /v1/chat/completions (any .../chat/completions) and /v1/responses (Agent API)."""
    rows = case_requests(suite)
    _refuse_twins(rows, answer_sets)

    def reply(request):
        path = request.path.split("?")[0]
        agent = path == "/v1/responses"
        if not agent and not path.endswith("/chat/completions"):
            return _answer_error(f"no route {request.path} (this fake serves /v1/chat/completions "
                                 "and /v1/responses)", 404)
        body = request.json if isinstance(request.json, dict) else {}
        model = body.get("model")
        answers = answer_sets.get(model, answer_sets.get(None))
        if answers is None:
            served = ", ".join(map(repr, answer_sets))
            return _answer_error(f"unknown model {model!r}; this fake serves {served}", 404)
        found = (_agent_turn if agent else _chat_turn)(body, rows)
        if found is None:
            return _answer_error(f"this request is for no case of suite {suite['name']!r}: its "
                                 "instructions and input match none of the suite's cases")
        case_id, number = found
        if case_id not in answers:
            return _answer_error(f"no answer for case {case_id!r} in {label}")
        turns = answers[case_id]
        turn = turns[min(number, len(turns) - 1)]  # after the last turn, the last one again
        return Reply(body=_turn_reply(turn, number, model, agent))
    return reply


def parse_answer_sets(values, suite):
    """{model or None: answers} from `--answers [MODEL=]FILE` values (a bare FILE: any model)."""
    sets = {}
    for value in values:
        named = "=" in value and not os.path.exists(value)
        model, _, path = value.partition("=") if named else ("", "", value)
        if (model or None) in sets:
            taken = f"model {model!r} has answers already" if model else "one FILE serves all"
            raise AnswersError(f"--answers {value}: {taken}")
        sets[model or None] = load_answers(path, suite)
    return sets


def serve_answers(args):
    """The answers server of main(): validate, print the URL, serve until Ctrl-C or SIGTERM."""
    try:
        suite = regression.load_suite(args.suite, allow_empty_baseline=True, system=args.system)
        sets = parse_answer_sets(args.answers, suite)
        files = " / ".join(value.rpartition("=")[2] for value in args.answers)
        reply = answers_server(suite, sets, files)
    except (regression.SuiteError, AnswersError) as exc:
        print(f"fakes.py: error: {exc}", file=sys.stderr)
        return 2
    ids = [case["id"] for case in suite["cases"]]
    missing = [case_id for case_id in ids if not any(case_id in given for given in sets.values())]
    with FakeServer(reply, port=args.port) as server:
        print(server.url, flush=True)
        models = "any model" if list(sets) == [None] else "models " + ", ".join(map(str, sets))
        print(f"fakes.py: answers for {len(ids) - len(missing)} of {len(ids)} case(s) of "
              f"{args.suite}, to {models}: --provider openai --base-url {server.url}/v1, or "
              f"PERPLEXITY_BASE_URL={server.url}; Ctrl-C stops it"
              + (f"; no answer for {', '.join(missing)} (an error reply)" if missing else ""),
              file=sys.stderr, flush=True)
        _serve_until_stopped()
    return 0


def _serve_until_stopped():
    """Sleep until Ctrl-C or SIGTERM (both end the process quietly, the port closed)."""
    import signal
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


SCENARIOS = {
    "advisor": lambda args: advisor(args.unsafe_payment, padding=args.padding, delay=args.delay),
    "refund-agent": lambda args: refund_agent(),
}


def main():
    """Serve a scenario, or the answers of a suite from a file, on a free loopback port."""
    import argparse
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS),
                        help="advisor (the default): the built-in suite's Agent API; refund-agent: "
                             f"scripted refund agents ({', '.join(REFUND_AGENTS)}) on "
                             "/v1/responses, /v1/messages and /v1/chat/completions")
    parser.add_argument("--suite", help="with --answers: the suite whose cases the fake answers")
    parser.add_argument("--answers", action="append", metavar="[MODEL=]FILE",
                        help="a JSON file mapping case ids to answers (a text, {\"json\": ...}, "
                             "tool calls, or a list of turns); MODEL=FILE: for that model only "
                             "(repeatable)")
    parser.add_argument("--system", help="with a golden folder as --suite: SYSTEM.txt elsewhere")
    parser.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")
    parser.add_argument("--unsafe-payment", action="store_true")
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--padding", type=int, default=0, help="bytes of search-result snippet per answer")
    args = parser.parse_args()
    if (args.suite is None) != (args.answers is None) or (args.answers and args.scenario):
        parser.error("--suite and --answers go together, without --scenario")
    if args.answers:
        return serve_answers(args)
    with FakeServer(SCENARIOS[args.scenario or "advisor"](args), port=args.port) as server:
        print(server.url, flush=True)
        _serve_until_stopped()
    return 0


if __name__ == "__main__":
    sys.exit(main())
