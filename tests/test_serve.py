"""`stepgap serve`: the OpenAI API over HTTP, driven by a streaming client as `vllm bench serve`
drives it, on 127.0.0.1 only. Every server here is a real `python -m stepgap serve` process
(front end, engine core and, with --executor process, a worker), bounded in time. The tests that
only send requests share one server (`pair_server`, tests/conftest.py); those that kill, signal
or stop a process, or need another model, start their own."""

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from stepgap.common.run_result import RunResult
from stepgap.engine.tokenizer import Detokenizer, ServedTokenizer
from stepgap.cli import main
from tests.helpers import (HANG_S, PAIR, SERVED_K as K, Server, alive, get, post, stream,
                           wait_idle)

ROOT = Path(__file__).resolve().parents[1]
# ---------------------------------------------------------------------------------------------
# The trained pair, with its tokenizer (and a chat template added to a copy of it), served by
# the shared `pair_server`


@pytest.fixture(scope="module")
def tok():
    return ServedTokenizer.load(PAIR / "target")


def heldout(n: int) -> list[dict]:
    lines = (PAIR / "heldout.jsonl").read_text().splitlines()[:n]
    return [json.loads(x) for x in lines]


def test_a_stream_is_one_chunk_per_step_with_1_to_k_plus_1_tokens_then_usage(pair_server):
    events = stream(pair_server.url, {"prompt": "def main(argv):\n", "max_tokens": 40,
                                      "ignore_eos": True, "return_token_ids": True,
                                      "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    *chunks, usage_chunk, _ = events
    for c in chunks:
        assert c["object"] == "text_completion" and c["model"] == "pystdlib"
        assert c["id"] == chunks[0]["id"] and c["id"].startswith("cmpl-")
        (choice,) = c["choices"]
        assert set(choice) >= {"index", "text", "logprobs", "finish_reason"}
        assert 1 <= len(choice["token_ids"]) <= K + 1
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * (len(chunks) - 1) + \
        ["length"]
    assert any(len(c["choices"][0]["token_ids"]) > 1 for c in chunks)   # drafts accepted
    assert usage_chunk["choices"] == []
    n = sum(len(c["choices"][0]["token_ids"]) for c in chunks)
    assert usage_chunk["usage"] == {"prompt_tokens": 6, "completion_tokens": n,
                                    "total_tokens": 6 + n} and n == 40


def test_greedy_text_and_acceptance_counters_equal_stepgap_runs(pair_server, tok, tmp_path):
    reqs = heldout(3)
    for r in reqs:
        r["output_len"] = 24
        assert tok.encode(tok.decode(r["prompt_token_ids"])) == r["prompt_token_ids"]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    assert main(["run", "--model", str(PAIR / "target"), "--draft", str(PAIR / "eagle3"),
                 "-k", str(K), "--max-model-len", "256", "--max-num-seqs", "8", "--num-gpu-blocks-override", "256", "--trace",
                 str(trace), "--max-concurrency", "1", "--detailed", "--quiet",
                 "--result-json", str(tmp_path / "run.json")]) == 0
    run = RunResult.load(tmp_path / "run.json")

    before = pair_server.metrics()
    for r, want in zip(reqs, run.requests.output_token_ids):
        events = stream(pair_server.url, {"prompt": tok.decode(r["prompt_token_ids"]),
                                          "max_tokens": 24, "ignore_eos": True,
                                          "return_token_ids": True})
        chunks = [e["choices"][0] for e in events[:-1]]
        assert [t for c in chunks for t in c["token_ids"]] == want
        assert "".join(c["text"] for c in chunks) == tok.decode(want)
    after = pair_server.metrics()

    spec = run.spec_decode
    grew = {k: after[k] - before.get(k, 0.0) for k in after if k.startswith("vllm:spec_decode")}
    assert grew["vllm:spec_decode_num_drafts_total"] == spec["num_drafts"] > 0
    assert grew["vllm:spec_decode_num_draft_tokens_total"] == spec["num_draft_tokens"]
    assert grew["vllm:spec_decode_num_accepted_tokens_total"] == spec["num_accepted_tokens"]
    per_pos = [grew[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}']
               for i in range(K)]
    assert per_pos == [round(r * spec["num_drafts"]) for r in spec["acceptance_rate_per_pos"]]
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 72


@pytest.mark.parametrize("body, param", [
    (b'{"max_tokens": 8}', "prompt"),
    (b'{"prompt": "x", "max_tokens": -1}', "max_tokens"),
    (b'{"prompt": [1, 2, 99999]}', "prompt"),
    (b'{"prompt": "x", "max_tokens": "many"}', "max_tokens"),
    (b'{"prompt": 5}', "prompt"),
    (b'{"prompt": "x", "stream": [1]}', "stream"),
    (b'{"prompt": "x", "temperature": 0.7}', "temperature"),
    (b'{"prompt": "x", "stop": ["\\n"]}', "stop"),
    (b'{"prompt": "x", "n": 2}', "n"),
    (b'{"prompt": ""}', "prompt"),
    (b'{"prompt": "x", "stream_options": {"include_usage": true}}', "stream_options"),
    (b"not json at all", None),
    (b"[1, 2]", None),
])
def test_a_bad_request_gets_an_openai_400_naming_the_field_and_the_server_serves_on(
        pair_server, body, param):
    r = post(pair_server.url + "/v1/completions", content=body,
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400 and err["param"] == param
    assert err["message"] and (param is None or err["message"].startswith(param))
    ok = post(pair_server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                    timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_a_prompt_longer_than_max_model_len_is_refused(pair_server):
    r = post(pair_server.url + "/v1/completions", json={"prompt": [5] * 300})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert "256" in r.json()["error"]["message"]


def test_an_unknown_model_is_a_404_and_models_lists_the_served_name(pair_server):
    r = post(pair_server.url + "/v1/completions", json={"prompt": "x", "model": "gpt"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    (card,) = get(pair_server.url + "/v1/models").json()["data"]
    assert card["id"] == "pystdlib" and card["max_model_len"] == 256


def test_a_whole_completion_of_two_prompts_has_two_choices_and_their_usage(pair_server, tok):
    ids = tok.encode("class Foo:\n")
    r = post(pair_server.url + "/v1/completions", timeout=60,
                   json={"prompt": [ids, ids], "max_tokens": 12, "ignore_eos": True,
                         "return_token_ids": True}).json()
    a, b = r["choices"]
    assert (a["index"], b["index"]) == (0, 1) and a["token_ids"] == b["token_ids"]
    assert a["text"] == tok.decode(a["token_ids"]) and a["finish_reason"] == "length"
    assert r["usage"] == {"prompt_tokens": 2 * len(ids), "completion_tokens": 24,
                          "total_tokens": 2 * len(ids) + 24}


def test_chat_completions_use_the_chat_template(pair_server, tok):
    msgs = [{"role": "user", "content": "write a loop"}]
    r = post(pair_server.url + "/v1/chat/completions", timeout=60,
                   json={"messages": msgs, "max_tokens": 10, "ignore_eos": True,
                         "return_token_ids": True}).json()
    prompt = "# user: write a loop\n# assistant:"
    assert r["object"] == "chat.completion"
    assert r["usage"]["prompt_tokens"] == len(tok.encode(prompt))
    want = post(pair_server.url + "/v1/completions", timeout=60,
                      json={"prompt": prompt, "max_tokens": 10, "ignore_eos": True}).json()
    assert r["choices"][0]["message"] == {"role": "assistant",
                                          "content": want["choices"][0]["text"]}


def test_eos_stops_a_request_unless_ignore_eos_and_no_chat_template_is_a_400(tmp_path):
    # The trained pair hardly ever writes its EOS, so: the tiny random pair, with a small BPE
    # tokenizer (no chat template) whose EOS is a token the tiny target writes greedily.
    import sysconfig

    from stepgap.common.formats import TraceRequest
    from stepgap.engine.args import EngineArgs
    from stepgap.engine.loop import run_trace
    from stepgap.training.corpus import save_tokenizer, train_tokenizer
    prompt = [11, 22, 33, 44]
    ea = EngineArgs(model="tiny", dtype="float64", max_model_len=512,
                    num_gpu_blocks_override=64)
    with ea.make_executor() as ex:
        out = run_trace(ex, [TraceRequest("a", 0.0, 4, 40, prompt)], ea.engine_config(),
                        vocab_size=512).output_token_ids["a"]
    eos = out[6]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / f).read_text() for f in ("argparse.py", "inspect.py", "typing.py")]
    save_tokenizer(train_tokenizer(texts, 512), tmp_path, 512)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    server = Server("--model", "tiny", "--tokenizer", str(tmp_path), "--dtype", "float64",
                    "--max-model-len", "512", "--num-gpu-blocks-override", "64")
    try:
        body = {"prompt": prompt, "max_tokens": 40, "return_token_ids": True}
        free = post(server.url + "/v1/completions",
                          json={**body, "ignore_eos": True}).json()["choices"][0]
        assert free["token_ids"] == out and free["finish_reason"] == "length"
        stop = post(server.url + "/v1/completions", json=body).json()["choices"][0]
        assert stop["token_ids"] == out[:out.index(eos) + 1]
        assert stop["finish_reason"] == "stop"
        r = post(server.url + "/v1/chat/completions",
                       json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        assert "chat template" in r.json()["error"]["message"]
    finally:
        assert server.stop()


# ---------------------------------------------------------------------------------------------
# Detokenization


def test_streamed_text_adds_up_to_the_decode_even_where_pieces_split_characters(tok):
    ids = tok.encode("héllo — “wörld” 日本 ✓ 🎉 done")
    for cut in range(1, len(ids) + 1):
        d = Detokenizer(tok)
        pieces = [d.step(ids[i:min(i + 3, cut)]) for i in range(0, cut, 3)]
        text = "".join(pieces) + d.finish()
        assert text == tok.decode(ids[:cut])
        assert all("\ufffd" not in p for p in pieces)   # a split character is held back


# ---------------------------------------------------------------------------------------------
# Load and faults, on the tiny random pair (no tokenizer: prompts as token ids)


TINY = ("--model", "tiny", "--draft", "tiny-eagle3", "-k", "2", "--max-model-len", "512",
        "--max-num-seqs", "16", "--num-gpu-blocks-override", "400", "--executor", "process",
        "--mode", "async")


async def _client(url: str, i: int, leave_after: int | None) -> tuple[int, bool]:
    """One streaming client; with `leave_after`, it disconnects after that many chunks."""
    body = {"prompt": [(7 * i + j) % 500 + 1 for j in range(20 + i)], "max_tokens": 40,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    tokens, done = 0, False
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            chunks = 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "usage" in event and not event["choices"]:
                    tokens = event["usage"]["completion_tokens"]
                chunks += 1
                if leave_after is not None and chunks >= leave_after:
                    break     # leaving the block closes the connection mid-stream
    return tokens, done


def test_64_clients_half_of_them_leaving_mid_stream_leave_no_block_or_request_behind():
    server = Server(*TINY)
    try:
        async def all_clients():
            return await asyncio.gather(*(_client(server.url, i, 2 + i % 5 if i % 2 else None)
                                          for i in range(64)))

        results = asyncio.run(asyncio.wait_for(all_clients(), 120))
        assert all(done and tokens == 40 for (tokens, done), i in zip(results, range(64))
                   if i % 2 == 0)
        m = wait_idle(server)
        assert m['vllm:request_success_total{finished_reason="length"}'] == 32
        assert m['vllm:request_success_total{finished_reason="abort"}'] == 32
        assert m["vllm:spec_decode_num_drafts_total"] > 0
        ok = post(server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 3})
        assert ok.json()["usage"]["completion_tokens"] == 3
        # A whole (non-streamed) request whose client gives up is aborted too. The engine core
        # is stopped meanwhile, so that the request is still running when the client leaves,
        # however fast the machine.
        os.kill(server.pids[1], signal.SIGSTOP)
        try:
            with pytest.raises(httpx.ReadTimeout):
                post(server.url + "/v1/completions", timeout=0.5,
                           json={"prompt": [1, 2], "max_tokens": 480, "ignore_eos": True})
            deadline = time.monotonic() + HANG_S
            while server.metrics()['vllm:request_success_total{finished_reason="abort"}'] < 33:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        finally:
            os.kill(server.pids[1], signal.SIGCONT)
        assert wait_idle(server)["vllm:num_requests_running"] == 0   # its blocks freed too
    finally:
        assert server.stop()


def _stream_in_background(url: str, out: list):
    import threading

    def go():
        try:
            stream(url, {"prompt": [3, 4, 5], "max_tokens": 480, "ignore_eos": True},
                   timeout=HANG_S, events=out)
        except Exception as e:    # the connection may go too: that ends it as well
            out.append(e)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _wait_for_chunks(out: list, n: int = 3) -> None:
    deadline = time.monotonic() + HANG_S
    while len(out) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(out) >= n


@pytest.mark.parametrize("sig, executor", [(signal.SIGINT, "inline"),
                                            (signal.SIGTERM, "process")])
def test_a_signal_ends_streams_in_flight_and_every_process(sig, executor):
    server = Server(*TINY[:-4], "--executor", executor)
    out: list = []
    t = _stream_in_background(server.url, out)
    _wait_for_chunks(out)
    assert server.stop(sig)
    t.join(HANG_S)
    assert not t.is_alive()
    assert any(isinstance(e, dict) and "error" in e for e in out) or \
        isinstance(out[-1], Exception)
    assert not any(alive(p) for p in server.pids)


def test_a_killed_worker_fails_health_and_ends_requests_in_flight_with_an_error():
    server = Server(*TINY)
    try:
        out: list = []
        t = _stream_in_background(server.url, out)
        _wait_for_chunks(out)
        subprocess.run(["kill", "-9", str(server.pids[2])], check=True)
        t.join(HANG_S)
        assert not t.is_alive()                        # never a hang
        assert "error" in out[-2] and out[-1] == "[DONE]"
        assert "worker" in out[-2]["error"]["message"]
        assert get(server.url + "/health").status_code == 503
        r = post(server.url + "/v1/completions", json={"prompt": [1], "max_tokens": 2})
        assert r.status_code == 503 and "dead" in r.json()["error"]["message"]
    finally:
        assert server.stop(signal.SIGINT)
    assert not any(alive(p) for p in server.pids)


def test_a_recorded_window_is_a_timeline_and_result_the_served_fit_reads(pair_server, tmp_path,
                                                                          tok):
    """POST /start_profile ... /stop_profile, as `vllm bench serve --profile` brackets its run:
    the timeline loads, has the front end's ops (one `stream` per chunk sent), and fits."""
    from stepgap.calibrate.serve_fit import load_served_run
    from stepgap.common.formats import load_timeline
    stream(pair_server.url, {"prompt": "warm", "max_tokens": 4})   # outside the window
    assert post(pair_server.url + "/start_profile", timeout=30).status_code == 200
    chunks = 0
    for r in heldout(6):
        events = stream(pair_server.url, {"prompt": tok.decode(r["prompt_token_ids"]),
                                          "max_tokens": 12, "ignore_eos": True})
        chunks += sum(1 for e in events if e != "[DONE]" and e["choices"])
    assert post(pair_server.url + "/stop_profile", timeout=30).status_code == 200
    run = tmp_path / "run"      # the window's files, where the served fit looks for them
    for suffix in (".server.jsonl", ".server.json"):
        shutil.copyfile(f"{pair_server.record}{suffix}", f"{run}{suffix}")
    spans = load_timeline(f"{run}.server.jsonl")
    ops = [(s.lane, s.op) for s in spans]
    assert ops.count(("cpu.frontend", "add_request")) == 6
    assert ops.count(("cpu.frontend", "stream")) == chunks
    assert ops.count(("cpu.frontend", "process_outputs")) == \
        ops.count(("cpu.engine", "update_from_output"))
    assert all(s.step == -1 for s in spans if s.op == "add_request")
    served = RunResult.load(f"{run}.server.json")
    assert served.backend == "stepgap-serve" and served.metrics["completed"] == 6
    # the client's own result: the server's, 2 ms later (what a client file gives)
    client = json.loads(Path(f"{run}.server.json").read_text())
    client["mean_ttft_ms"] += 2.0
    Path(f"{run}.vllm.json").write_text(json.dumps(client))
    assert load_served_run(Path(f"{run}.server.json"))["k"] == K
    out = tmp_path / "served.json"
    assert main(["calibrate-served", str(ROOT / "traces/measured/cpu/profile.json"),
                 str(tmp_path), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["topology"]["engine"] == "served" and doc["served_fit"]["runs"] == 1
    fit = doc["served_fit"]   # 2 ms, at the profile's level (the run's device ops against it)
    assert fit["client_latency_us"] == pytest.approx(2000.0 / fit["levels"][0], rel=1e-3)
    assert all(sum(doc["cpu"][t]) > 0 for t in ("add_request", "process_outputs"))


# ---------------------------------------------------------------------------------------------
# Requests are coerced, or refused, as vLLM's own request models do it


# What vLLM 0.32's CompletionRequest and ChatCompletionRequest make of each value, by the field's
# type (read off vLLM's pydantic models, /work/vllm-venv; REFUSED: a validation error, a 400).
REFUSED = "REFUSED"
VLLM_COERCES = {
    "int": {'" 1 "': 1, '"1"': 1, '"1e0"': REFUSED, '"false"': REFUSED, '"x"': REFUSED,
            "1.0": 1, "1.5": REFUSED, "[1]": REFUSED, "true": 1, "{}": REFUSED},
    "float": {'" 1 "': 1.0, '"1"': 1.0, '"1e0"': 1.0, '"false"': REFUSED, '"x"': REFUSED,
              "1.0": 1.0, "1.5": 1.5, "[1]": REFUSED, "true": 1.0, "{}": REFUSED},
    "bool": {'" 1 "': REFUSED, '"1"': True, '"1e0"': REFUSED, '"false"': False, '"true"': True,
             '"x"': REFUSED, "1.0": True, "1.5": REFUSED, "[1]": REFUSED, "{}": REFUSED},
    "str": {'" 1 "': " 1 ", '"1"': "1", '"x"': "x", "1.0": REFUSED, "true": REFUSED,
            "[1]": REFUSED, "{}": REFUSED},
}
FIELDS_BY_TYPE = {
    "completions": {"int": ("max_tokens", "top_k", "n", "seed"),
                    "float": ("temperature", "presence_penalty"),
                    "bool": ("stream", "ignore_eos", "echo", "return_token_ids"),
                    "str": ("user", "model")},
    "chat": {"int": ("max_tokens", "max_completion_tokens", "n", "seed"),
             "bool": ("add_generation_prompt", "echo", "logprobs", "stream"), "str": ("user",)},
}


@pytest.mark.parametrize("endpoint", sorted(FIELDS_BY_TYPE))
def test_request_fields_are_coerced_and_refused_as_vllms_request_models_do(endpoint):
    from stepgap.engine.protocol import APIError, ChatCompletionRequest, CompletionRequest, parse
    model, base = (CompletionRequest, {"prompt": [1, 2]}) if endpoint == "completions" else \
        (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}]})
    differ = []
    for kind, names in FIELDS_BY_TYPE[endpoint].items():
        for name in names:
            for text, want in VLLM_COERCES[kind].items():
                body = json.dumps(base)[:-1] + f', "{name}": {text}}}'
                try:
                    got = getattr(parse(model, body.encode()), name)
                except APIError as e:
                    got = REFUSED
                    assert e.param == name, e.message
                if got != want or type(got) is not type(want):
                    differ.append(f"{name}={text}: vLLM {want!r}, stepgap {got!r}")
    assert not differ, "\n".join(differ)


# ---------------------------------------------------------------------------------------------
# Start-up and bad clients


def test_max_model_len_defaults_to_the_models_own_context(pair_server):
    (card,) = get(pair_server.url + "/v1/models").json()["data"]
    assert card["max_model_len"] == 256   # the target's max_position_embeddings, as vLLM
    # max_tokens null: what the context leaves, as vLLM (with 2048 it was always refused)
    r = post(pair_server.url + "/v1/completions",
             json={"prompt": [5] * 250, "max_tokens": None, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 6


def test_a_half_sent_body_is_dropped_without_a_traceback(pair_server):
    with socket.create_connection(("127.0.0.1", pair_server.port)) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 100\r\n\r\n{\"prompt\": [1, 2")
    r = post(pair_server.url + "/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
    assert r.json()["usage"]["completion_tokens"] == 2   # the server serves on
    assert "Traceback" not in pair_server.text() and "Exception" not in pair_server.text()


def test_a_port_in_use_is_found_before_the_engine_is_built():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "stepgap", "serve", "--model", "tiny",
                            "--port", str(port)], cwd=ROOT, capture_output=True, text=True,
                           timeout=HANG_S)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"stepgap serve: error: --host 127.0.0.1 --port {port}: cannot listen there (Address "
        "already in use)"]   # and no "starting the engine core" before it


@pytest.mark.parametrize("option", ["--result-json", "--timeline"])
def test_served_outputs_are_checked_before_serving(option, tmp_path, capsys):
    assert main(["serve", "--model", "tiny", option, str(tmp_path)]) == 2
    assert f"{option} {tmp_path}: is a folder" in capsys.readouterr().err
    assert main(["serve", "--model", "tiny", "--timeline", str(tmp_path / "t.jsonl"),
                 "--result-json", str(tmp_path / "t.trace.json")]) == 2
    assert f"--timeline's Chrome trace {tmp_path / 't.trace.json'}: the same file as " \
           "--result-json" in capsys.readouterr().err   # (as run and simulate say it)
