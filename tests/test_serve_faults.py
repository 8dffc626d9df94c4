"""`stepgap serve` against a hostile client and a failing machine (docs/reference/robustness.md,
round 3): every bad request is an HTTP 4xx with OpenAI's error object naming the field, checked
before the body is parsed or the prompt tokenized where its size alone says so, and the server
answers a normal request after each; a stuck engine core is reported by /health and ends the
requests waiting on it; a front end killed with SIGKILL leaves no process and no traceback; a
recorded run that cannot be written is kept (/stop_profile) or written elsewhere and named
(shutdown). Every server is a real `python -m stepgap serve` on 127.0.0.1, with fixtures of this
module."""

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from stepgap.cli import main
from stepgap.common.errors import UserError
from stepgap.common.limits import MAX_BODY_BYTES, MAX_URL_BYTES
from stepgap.engine.api_server import ENGINE_STUCK_S
from stepgap.engine.tokenizer import ServedTokenizer
from tests.test_serve import HANG_S, PAIR, Server, alive, get, post

# A chat template that fails, on cue, in each way a template can: its own raise_exception, an
# error of Python (1/0), a range the sandbox refuses, recursion.
TRAPS = ("{% for m in messages %}"
         "{% if m['content'] == 'divide' %}{{ 1 / 0 }}{% endif %}"
         "{% if m['content'] == 'range' %}{% for i in range(10 ** 9) %}{% endfor %}{% endif %}"
         "{% if m['content'] == 'recurse' %}{% macro r(n) %}{{ r(n) }}{% endmacro %}"
         "{{ r(1) }}{% endif %}"
         "{% if m['content'] == 'raise' %}{{ raise_exception('refused') }}{% endif %}"
         "# {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}# assistant:{% endif %}")


def pair_copy(tmp: Path, template: str | None = TRAPS) -> Path:
    target = tmp / "target"
    shutil.copytree(PAIR / "target", target)
    if template is not None:
        cfg = json.loads((target / "tokenizer_config.json").read_text())
        (target / "tokenizer_config.json").write_text(json.dumps({**cfg,
                                                                  "chat_template": template}))
    return target


@pytest.fixture(scope="module")
def trap_server():
    """The trained target with the TRAPS template, recording its traffic."""
    tmp = Path(tempfile.mkdtemp(prefix="stepgap-serve-faults-"))
    target = pair_copy(tmp)
    server = Server("--model", str(target), "--max-model-len", "256", "--executor", "process",
                    "--num-gpu-blocks-override", "64", "--timeline", str(tmp / "run.jsonl"),
                    "--result-json", str(tmp / "run.json"))
    server.tmp = tmp
    yield server
    server.stop()
    shutil.rmtree(tmp, ignore_errors=True)


def serves_on(server) -> None:
    r = post(server.url + "/v1/completions", json={"prompt": "def f(", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def chat(content) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 2}


LONGEST = ServedTokenizer.load(PAIR / "target").longest_token
HOSTILE = [   # (endpoint, body, HTTP status, the field named)
    ("chat", chat([{"type": "text", "text": 5}]), 400, "messages.0.content.0.text"),
    ("chat", chat([{"type": "text", "text": None}]), 400, "messages.0.content.0.text"),
    ("chat", chat(["a", {"type": "text", "text": {"a": 1}}]), 400, "messages.0.content.1.text"),
    ("chat", chat([{"type": "text"}]), 400, "messages.0.content.0.text"),
    ("chat", chat([{"type": "image_url", "image_url": {"url": "x"}}]), 400,
     "messages.0.content.0.type"),
    ("chat", chat("divide"), 400, "messages"),
    ("chat", chat("range"), 400, "messages"),
    ("chat", chat("recurse"), 400, "messages"),
    ("chat", chat("raise"), 400, "messages"),
    ("chat", chat("x" * (256 * LONGEST + 1)), 400, "messages"),
    ("completions", {"prompt": "x" * (256 * LONGEST + 1)}, 400, "prompt"),
    ("completions", b'{"prompt": [1, 2], "top_k": ' + b"9" * 401 + b"}", 400, "top_k"),
    ("completions", {"prompt": [1, 2], "logprobs": 0}, 400, "logprobs"),
    ("completions", {"prompt": [1, 2], "best_of": 3}, 400, "best_of"),
    ("completions", {"prompt": [1, 2], "logit_bias": {"5": 100}}, 400, "logit_bias"),
    ("chat", {**chat("hi"), "tools": [{"type": "function"}]}, 400, "tools"),
    ("completions", b'{"prompt": "' + b"x" * MAX_BODY_BYTES + b'"}', 413, None),
]


@pytest.mark.parametrize("endpoint, body, status, param", HOSTILE,
                         ids=[f"{i}-{h[3]}" for i, h in enumerate(HOSTILE)])
def test_a_hostile_request_is_a_4xx_naming_the_field_and_the_server_serves_on(
        trap_server, endpoint, body, status, param):
    url = trap_server.url + ("/v1/chat/completions" if endpoint == "chat" else "/v1/completions")
    kw = {"content": body, "headers": {"Content-Type": "application/json"}} \
        if isinstance(body, bytes) else {"json": body}
    r = post(url, **kw)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["param"] == param
    assert param is None or err["message"].startswith(param)
    serves_on(trap_server)


def test_a_body_too_large_is_refused_before_it_is_read_whole(trap_server):
    def chunks():   # no Content-Length: the server counts what comes
        yield b'{"prompt": "'
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 4):
            yield b"x" * (1 << 20)
        yield b'"}'
    r = post(trap_server.url + "/v1/completions", content=chunks(),
             headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "RequestEntityTooLarge"
    serves_on(trap_server)


def test_a_200_kb_url_is_a_414_not_a_reset(trap_server):
    with socket.create_connection(("127.0.0.1", trap_server.port), timeout=HANG_S) as s:
        s.sendall(b"GET /health?x=" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"}"):
            more = s.recv(65536)
            assert more, data   # the answer whole, then the connection kept (no reset)
            data += more
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.split()[1] == b"414"
    err = json.loads(body)["error"]
    assert err["code"] == 414 and str(MAX_URL_BYTES) in err["message"]
    serves_on(trap_server)


def test_stop_profile_on_a_failing_disk_keeps_the_window_for_the_next_try(trap_server):
    """A write that fails (here: a folder in the result's place, which every user can make;
    a full disk fails the same write) is a 507 naming the file; the window is kept, and the next
    /stop_profile writes it whole."""
    result = trap_server.tmp / "run.json"
    assert post(trap_server.url + "/start_profile").status_code == 200
    serves_on(trap_server)
    result.unlink(missing_ok=True)
    result.mkdir()
    r = post(trap_server.url + "/stop_profile")
    assert r.status_code == 507 and r.json()["error"]["message"].startswith(f"{result}: ")
    result.rmdir()
    assert post(trap_server.url + "/stop_profile").status_code == 200
    doc = json.loads(result.read_text())
    assert doc["completed"] == 1 and doc["total_output_tokens"] == 2
    serves_on(trap_server)


# ---------------------------------------------------------------------------------------------
# Servers of their own: what ends them


TINY = ("--model", "tiny", "--max-model-len", "512", "--num-gpu-blocks-override", "64",
        "--executor", "process")


def test_a_stopped_engine_core_fails_health_at_once_and_its_requests_in_time():
    server = Server(*TINY)
    try:
        engine = server.pids[1]
        os.kill(engine, signal.SIGSTOP)
        try:
            assert get(server.url + "/health").status_code == 503
        finally:
            os.kill(engine, signal.SIGCONT)
        assert get(server.url + "/health").status_code == 200   # stopped is not dead
        os.kill(engine, signal.SIGSTOP)
        t0 = time.monotonic()
        r = post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 4})
        waited = time.monotonic() - t0
        assert r.status_code == 500 and "stopped" in r.json()["error"]["message"], r.text
        assert ENGINE_STUCK_S <= waited < HANG_S
        assert get(server.url + "/health").status_code == 503
        assert post(server.url + "/v1/completions",
                    json={"prompt": [1], "max_tokens": 2}).status_code == 503
        deadline = time.monotonic() + HANG_S   # killed, and its worker followed it
        while any(alive(p) for p in server.pids[1:]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in server.pids[1:])
    finally:
        server.stop()


def test_a_front_end_killed_with_sigkill_leaves_no_process_and_no_traceback():
    server = Server(*TINY)
    out: list = []

    def go():
        try:
            post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 480,
                                                      "ignore_eos": True})
        except httpx.TransportError as e:
            out.append(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    time.sleep(1.0)   # the request runs (or is about to): the engine core is stepping
    server.proc.kill()
    deadline = time.monotonic() + HANG_S
    while any(alive(p) for p in server.pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in server.pids)
    server.proc.wait(5)
    t.join(HANG_S)
    assert "Traceback" not in server.text(), server.text()


def test_shutdown_on_a_failing_disk_writes_the_run_elsewhere_and_says_where(tmp_path):
    result = tmp_path / "run.json"
    server = Server(*TINY, "--result-json", str(result))
    post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3})
    result.mkdir()   # the result's place is taken after start (as a disk fills up)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(HANG_S) == 2
    lines = server.text().strip().splitlines()
    moved = Path(tempfile.gettempdir()) / f"stepgap-serve-{server.proc.pid}"
    assert lines[-1] == (f"stepgap serve: error: {result}: cannot write (a folder); the served "
                         f"run is in {moved}/ instead")
    try:
        assert json.loads((moved / "run.json").read_text())["completed"] == 1
    finally:
        shutil.rmtree(moved, ignore_errors=True)
    assert not any(alive(p) for p in server.pids)


# ---------------------------------------------------------------------------------------------
# Refused at start, before any process


@pytest.mark.parametrize("argv, words", [
    (["--port", "99999"], "argument --port: a port is 1 to 65535, got 99999"),
    (["--max-model-len", "1"], "--max-model-len 1: a request is at least one prompt token"),
    (["--kv-cache-gib", "1e-12"], "but the cache holds 1 (--num-gpu-blocks-override, "
                                  "--kv-cache-gib"),
    (["--max-model-len", "512", "--num-gpu-blocks-override", "8"],
     "the cache serves at most --max-model-len 128"),
])
def test_a_server_that_could_serve_nothing_is_refused_at_start(argv, words, capsys):
    with pytest.raises(SystemExit) if argv[0] == "--port" else contextlib.nullcontext():
        assert main(["serve", "--model", "tiny", *argv]) == 2   # (argparse exits itself)
    assert words in capsys.readouterr().err


def test_a_result_json_naming_the_models_config_is_refused(tmp_path, capsys):
    target = pair_copy(tmp_path, None)
    before = (target / "config.json").read_bytes()
    assert main(["serve", "--model", str(target), "--result-json",
                 str(target / "config.json")]) == 2
    assert f"--result-json {target / 'config.json'}: a file in the input --model" in \
        capsys.readouterr().err
    assert (target / "config.json").read_bytes() == before


@pytest.mark.parametrize("template, words", [
    ("{% for m in messages %}", "does not compile"),
    ({"default": "x"}, "expected a jinja template"),
])
def test_a_chat_template_that_does_not_compile_is_named_at_start(tmp_path, template, words):
    target = pair_copy(tmp_path, None)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match=words) as e:
        ServedTokenizer.load(target)
    assert str(e.value).startswith(f"{target / 'tokenizer_config.json'}: field 'chat_template'")


@pytest.mark.parametrize("template, words", [
    ("{{ 7 ** 10000000 }}", "SecurityError: a power of 8,450,980 digits"),  # jinja2 folded it
    ("{{ 'x' * 10000000000 }}", "SecurityError: a product of 10,000,000,000 items"),
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
     "TimeoutError: it ran past 0.5 s"),   # each range within the sandbox's; it ran minutes
])
def test_a_chat_template_too_costly_to_render_fails_its_request_not_the_server(
        tmp_path, monkeypatch, template, words):
    import stepgap.engine.tokenizer as tokenizer
    monkeypatch.setattr(tokenizer, "RENDER_S", 0.5)
    target = pair_copy(tmp_path, None)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    cfg["chat_template"] = template + "{{ messages[0]['content'] }}"
    (target / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = ServedTokenizer.load(target)
    with pytest.raises(ValueError, match=f"the chat template failed: {words}"):
        tok.render_chat([{"role": "user", "content": "hi"}])
    tok.template = tokenizer.compile_template("{{ messages[0]['content'] }}", "x")
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "hi"   # tracing is off


def test_a_declared_body_too_large_is_answered_though_the_client_stops_sending(trap_server):
    """100 MB announced, a little sent, then the client waits: it gets the 413 (the server
    drops what comes while it comes), not a wait for the rest nor a reset."""
    with socket.create_connection(("127.0.0.1", trap_server.port), timeout=HANG_S) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 100000000\r\n\r\n" + b'{"prompt": "' + b"x" * 65536)
        data = b""
        while not data.endswith(b"}"):
            more = s.recv(65536)
            assert more, data
            data += more
    head, body = data.split(b"\r\n\r\n", 1)
    assert head.split()[1] == b"413" and json.loads(body)["error"]["code"] == 413
    serves_on(trap_server)
