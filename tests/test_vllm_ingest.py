"""vLLM as the measured side: its traces, hook spans, /metrics scrapes and bench files read into
stepgap's formats (calibrate/vllm.py, common/vllm_bench.py), on fixtures cut from real vLLM 0.32
output (tests/data/vllm, made by bench/vllm/fixtures.py); no vLLM is needed."""

import copy
import gzip
import json
import re
from pathlib import Path

import pytest

from stepgap.calibrate.vllm import SCOPES, acceptance_from_scrapes, read_source, vllm_timeline
from stepgap.common.errors import UserError
from stepgap.common.formats import LANES, OPS, load_timeline, step_gaps
from stepgap.common.run_result import bench_result
from stepgap.common.vllm_bench import bench_requests, bursty_share, read_bench
from stepgap.cli import main

DATA = Path(__file__).resolve().parent / "data" / "vllm"
ROOT = DATA.parents[2]
WORKER, API = DATA / "worker.pt.trace.json.gz", DATA / "api_server.pt.trace.json.gz"
HOOKS = sorted((DATA / "hooks").glob("*.jsonl"))
K = 2   # the fixtures' speculation depth


def by_step(spans):
    out = {}
    for s in spans:
        out.setdefault(s.step, []).append(s)
    return out


def write_trace(path: Path, doc: dict) -> Path:
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def trace_doc() -> dict:
    return json.loads(gzip.decompress(WORKER.read_bytes()))


# ---------------------------------------------------------------------------------------------
# Profiler traces


def test_a_worker_trace_becomes_a_timeline_of_designs_lanes_and_ops():
    spans = vllm_timeline([WORKER, API])
    steps = by_step(spans)
    assert len(steps) == 8
    for s in spans:
        assert s.lane in LANES and s.op in OPS[s.lane], s
        assert s.end_us >= s.start_us
    for n, st in steps.items():
        ops = [(s.op, (s.args or {}).get("i")) for s in sorted(st, key=lambda s: s.start_us)
               if s.lane == "device" or s.op == "prepare_inputs"]
        assert ops == [("prepare_inputs", None), ("target_forward", None),
                       ("rejection_sample", None), ("draft_forward", 0), ("draft_forward", 1),
                       ("d2h", None)], n
        dev = sorted((s for s in st if s.lane == "device"), key=lambda s: s.start_us)
        assert all(a.end_us <= b.start_us for a, b in zip(dev, dev[1:]))   # one device
    # the worker waits on the engine core before every step after the first
    waits = [s for s in spans if s.op == "wait" and s.args["on"] == "engine core"]
    assert sorted(s.step for s in waits) == list(range(1, 8))
    gaps = step_gaps(spans)
    assert len(gaps) == 7 and all(g > 0 for g in gaps)


def test_every_mapped_vllm_scope_is_in_the_docs_table():
    doc = (ROOT / "docs" / "explanation" / "vllm.md").read_text()
    for scope, (lane, op) in SCOPES.items():
        assert re.search(rf"`{re.escape(scope)}`.*\|\s*`?{lane}`?\s*\|\s*`?{op}`?", doc), scope


def test_a_scope_with_no_op_keeps_its_vllm_name(tmp_path):
    doc = trace_doc()
    fwd = next(e for e in doc["traceEvents"] if e.get("name") == "gpu_model_runner: forward")
    odd = {**copy.deepcopy(fwd), "name": "gpu_model_runner: something new", "dur": 5}
    doc["traceEvents"].append(odd)
    spans = vllm_timeline([write_trace(tmp_path / "rank0.x.pt.trace.json.gz", doc)])
    kept = [s for s in spans if s.op == "unmapped"]
    assert [s.args["vllm"] for s in kept] == ["gpu_model_runner: something new"]
    assert kept[0].lane == "cpu.worker"


def test_on_a_gpu_trace_the_device_ops_are_their_kernels(tmp_path):
    """A GPU trace: launches (cuda_runtime) inside the scopes, kernels linked by correlation id,
    later on the device. The device spans take the kernels' times, not the host scopes'."""
    ev, cid = [], iter(range(1, 100))

    def x(name, ts, dur, cat, **args):
        ev.append({"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "args": args})

    kernels = {}
    for n in range(3):
        t = 1000.0 * n
        x(f"execute_context_0(0)_generation_2({2 * (K + 1)})", t, 900, "user_annotation")
        for name, a, b in (("preprocess", 10, 50), ("forward", 60, 200), ("sample", 210, 250),
                           ("draft", 260, 400), ("bookkeep", 410, 420)):
            x(f"gpu_model_runner: {name}", t + a, b - a, "user_annotation")
            c = next(cid)
            x("cudaLaunchKernel", t + a + 1, 2, "cuda_runtime", correlation=c)
            if name != "preprocess":
                kernels[name, n] = (t + a + 300, 30)
                x(f"kernel_{name}", t + a + 300, 30, "kernel", correlation=c)
    doc = {"traceEvents": ev, "vllm_version": "0.32.0"}
    spans = vllm_timeline([write_trace(tmp_path / "rank0.gpu.pt.trace.json.gz", doc)])
    fwd = [s for s in spans if s.op == "target_forward"]
    assert [(s.start_us, s.end_us - s.start_us) for s in fwd] == \
        [(kernels["forward", n][0], 30) for n in range(3)]   # from the first step (at 0)
    assert all(s.lane == "device" for s in spans if s.op in ("rejection_sample", "d2h"))


def test_hook_spans_join_the_worker_steps_in_vllm_order():
    spans = vllm_timeline(HOOKS)
    steps = by_step(spans)
    joined = 0
    for n, st in steps.items():
        ops = {s.op: s for s in st if s.lane != "device"}
        dev = [s for s in st if s.lane == "device"]
        if "schedule" in ops:   # the step's schedule ends before the worker prepares it
            assert ops["schedule"].end_us <= ops["prepare_inputs"].start_us
        if "update_from_output" in ops:   # its update follows its output
            assert ops["update_from_output"].start_us >= max(s.end_us for s in dev)
            joined += 1
        if "process_outputs" in ops:
            assert ops["process_outputs"].start_us >= ops["update_from_output"].end_us
    assert joined >= 6
    lanes = {s.lane for s in spans}
    assert lanes == set(LANES)
    # the sync engine core fetches the drafts after each update (its post-step RPC)
    drafts = [s for s in spans if s.lane == "cpu.engine" and s.op == "wait"]
    assert drafts and all(s.args["on"] == "take_draft_token_ids" for s in drafts)


def test_ingest_and_plot_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "tl.jsonl"
    assert main(["ingest", "vllm-profile", str(WORKER), str(API), *map(str, HOOKS[:0]),
                 "--out", str(out), "--chrome", str(tmp_path / "tl.json")]) == 0
    assert "8 steps" in capsys.readouterr().out
    assert load_timeline(out) == vllm_timeline([WORKER, API])
    png = tmp_path / "tl.png"
    assert main(["plot", "timeline", f"vllm={out}", "--out", str(png)]) == 0
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("content, message", [
    (b"hello", "not valid JSON"),   # a file named a trace is read as one, never as hooks
    (gzip.compress(b"[1, 2]", mtime=0), "no traceEvents"),
    (gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1,
                                                "dur": 1}]}).encode(), mtime=0),
     "not a vLLM profile"),
    (b"\x1f\x8b\x08garbage", "not a gzip file"),
])
def test_a_file_that_is_not_a_vllm_profile_fails_with_one_clear_message(tmp_path, content,
                                                                       message):
    bad = tmp_path / "bad.pt.trace.json.gz"
    bad.write_bytes(content)
    with pytest.raises(UserError, match=message) as e:
        vllm_timeline([bad])
    assert str(bad) in str(e.value)


def test_a_gzip_bomb_of_a_trace_stops_at_the_limit(tmp_path):
    from unittest import mock
    bomb = tmp_path / "rank0.pt.trace.json.gz"   # 4 MiB of spaces after a valid trace
    bomb.write_bytes(gzip.compress(json.dumps(trace_doc()).encode() + b" " * (4 << 20)))
    with mock.patch("stepgap.common.fileio.MAX_DECOMPRESSED_BYTES", 1 << 20), \
            pytest.raises(UserError, match=rf"{re.escape(str(bomb))}: decompresses to more "
                                           r"than 1 MiB \(a gzip bomb\?\)"):
        read_source(bomb)


def test_a_hook_line_that_is_not_a_span_names_its_line(tmp_path):
    f = tmp_path / "1.jsonl"
    lines = HOOKS[0].read_text().splitlines()
    f.write_text("\n".join([lines[0], '{"lane": "cpu.engine"}', *lines[1:]]) + "\n")
    with pytest.raises(UserError, match=rf"{re.escape(str(f))}:2\b"):
        read_source(f)
    f.write_text(lines[0].replace('"cpu.', '"gpu.') + "\n")
    with pytest.raises(UserError, match="unknown lane"):
        read_source(f)


# ---------------------------------------------------------------------------------------------
# /metrics scrapes


def counters(text: str) -> dict:
    """The spec-decode counters, read by hand from the Prometheus text."""
    out = {}
    for m in re.finditer(r'^vllm:spec_decode_(\w+?)_total\{([^}]*)\} (\S+)$', text, re.M):
        pos = re.search(r'position="(\d+)"', m.group(2))
        out[(m.group(1), int(pos.group(1)) if pos else None)] = float(m.group(3))
    return out


def test_acceptance_is_the_difference_of_two_scrapes(tmp_path):
    after, before = (DATA / "bench.after.txt").read_text(), (DATA / "bench.before.txt").read_text()
    a, b = counters(after), counters(before)
    drafts = a["num_drafts", None] - b["num_drafts", None]
    assert drafts > 0
    out = tmp_path / "acc.json"
    assert main(["ingest", "vllm-metrics", str(DATA / "bench.after.txt"), "--before",
                 str(DATA / "bench.before.txt"), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    want = [(a["num_accepted_tokens_per_pos", p] - b["num_accepted_tokens_per_pos", p]) / drafts
            for p in range(K)]
    assert doc["k"] == K and doc["rates"] == pytest.approx(want)
    assert doc["rates"][0] >= doc["rates"][1]
    # the simulator takes it as it is
    res = tmp_path / "sim.json"
    assert main(["simulate", "--model", "llama-3.2-1b", "--gpu", "h100", "-k", str(K),
                 "--acceptance", str(out), "--num-prompts", "4", "--random-input-len", "16",
                 "--random-output-len", "40", "--save-result", "--result-filename",
                 str(res), "--quiet"]) == 0
    rates = json.loads(res.read_text())["spec_decode"]["acceptance_rate_per_pos"]
    assert len(rates) == K


def test_a_scrape_without_spec_decode_counters_fails_clearly(tmp_path):
    bare = tmp_path / "bare.txt"
    bare.write_text("".join(x + "\n" for x in (DATA / "bench.after.txt").read_text()
                    .splitlines() if "spec_decode" not in x))
    with pytest.raises(UserError, match=f"{re.escape(str(bare))}: no vllm:spec_decode"):
        acceptance_from_scrapes(bare.read_text(), None, bare)
    with pytest.raises(UserError, match="exceed"):   # the scrapes swapped
        acceptance_from_scrapes((DATA / "bench.before.txt").read_text(),
                                (DATA / "bench.after.txt").read_text(), "after", "before")


# ---------------------------------------------------------------------------------------------
# Bench files


def test_a_bench_file_is_a_run_result_and_the_trace_that_made_it(tmp_path):
    doc = read_bench(DATA / "bench.json")
    res = bench_result(doc, DATA / "bench.json")
    # recomputed from the per-request lists, the bench's own means come back
    for key in ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "mean_e2el_ms"):
        assert res[key] == pytest.approx(doc[key], rel=1e-6), key
    assert res["completed"] == doc["completed"]
    assert res["config"]["max_concurrency"] == doc["max_concurrency"]
    reqs = bench_requests(doc, DATA / "bench.json")
    assert [r.prompt_len for r in reqs] == doc["input_lens"]
    assert [r.output_len for r in reqs] == doc["output_lens"]
    out = tmp_path / "trace.jsonl"
    assert main(["ingest", "vllm-bench", str(DATA / "bench.json"), "--trace-out",
                 str(out)]) == 0
    assert len(out.read_text().splitlines()) == len(reqs)


@pytest.mark.parametrize("key", ["input_lens", "output_lens"])
def test_a_request_longer_than_any_context_is_named_by_its_field(tmp_path, key):
    doc = json.loads((DATA / "bench.json").read_text())
    doc[key][1] = 10 ** 30
    f = tmp_path / "b.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=rf"b.json: field '{key}\[1\]': 10+ tokens, more than "
                                        "any request holds"):
        bench_requests(read_bench(f), f)


@pytest.mark.parametrize("rates", [[float("nan")], [1.5], "0.9"])
def test_per_position_rates_are_checked_with_or_without_the_draft_counts(tmp_path, rates):
    doc = json.loads((DATA / "bench.json").read_text())
    doc["spec_decode_per_position_acceptance_rates"] = rates
    for key in [k for k in doc if k.startswith("spec_decode_") and "rates" not in k]:
        del doc[key]   # (vLLM writes the counts with them; a file edited by hand may not)
    f = tmp_path / "b.json"
    f.write_text(json.dumps(doc))   # (NaN as Python writes it)
    with pytest.raises(UserError, match=r"b.json: field 'spec_decode_per_position_acceptance_"
                                        r"rates': expected a list of rates from 0 to 1"):
        read_bench(f)


def test_a_bench_file_without_details_says_what_to_add(tmp_path):
    doc = json.loads((DATA / "bench.json").read_text())
    del doc["itls"]
    f = tmp_path / "b.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(UserError, match=r"b.json.*itls.*--save-detailed"):
        bench_requests(read_bench(f), f)
    f.write_text(json.dumps({"date": "x"}))
    with pytest.raises(UserError, match="not a `vllm bench serve"):
        read_bench(f)


@pytest.mark.parametrize("k", ["²", "9" * 5000, "65", 65, "-1", 2.0, True, "2 "])
def test_a_bench_files_depth_is_an_integer_from_0_to_64_named_as_its_field(tmp_path, k):
    f = tmp_path / "b.json"   # `--metadata num_speculative_tokens=K` writes a string
    f.write_text(json.dumps({**json.loads((DATA / "bench.json").read_text()),
                             "num_speculative_tokens": k}))
    with pytest.raises(UserError, match=r"b.json: field 'num_speculative_tokens': expected an "
                                        r"integer from 0 to 64, got "):
        read_bench(f)


@pytest.mark.parametrize("key, v", [("mean_itl_ms", "x"), ("p99_tpot_ms", float("nan")),
                                    ("p99_itl_ms", 1e308), ("mean_ttft_ms", -1.0),
                                    ("median_e2el_ms", None)])
def test_a_bench_files_times_are_milliseconds_within_its_run_named_as_their_field(tmp_path, key,
                                                                                   v):
    f = tmp_path / "b.json"   # a string made calibrate raise TypeError; 1e308 passed, exit 0
    f.write_text(json.dumps({**json.loads((DATA / "bench.json").read_text()), key: v}))
    with pytest.raises(UserError, match=rf"b.json: field '{key}': expected milliseconds from 0 "
                                        r"to the run's duration"):
        read_bench(f)


def test_calibrate_refuses_a_bench_file_of_zero_tpot_naming_the_field(tmp_path, capsys):
    from stepgap.cli import main
    f = tmp_path / "b.json"   # calibrate reads tokens per step as ITL / TPOT: ZeroDivisionError
    f.write_text(json.dumps({**json.loads((DATA / "bench.json").read_text()),
                             "mean_tpot_ms": 0.0, "mean_itl_ms": 3.0,
                             "model_id": "meta-llama/Llama-3.1-8B-Instruct"}))
    assert main(["calibrate", str(f), "--gpu", "l20", "--model", "llama-3.1-8b", "--draft",
                 "llama-3.1-8b-eagle3", "--out", str(tmp_path / "p.json")]) == 2
    assert "b.json: field 'mean_tpot_ms': 0; calibrate fits" in capsys.readouterr().err


def test_bench_files_of_different_models_are_refused(tmp_path):
    from stepgap.calibrate.vllm_fit import load_runs
    doc = json.loads((DATA / "bench.json").read_text())
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "b.json").write_text(json.dumps({**doc, "model_id": "another/model"}))
    with pytest.raises(UserError, match=r"model_id.*one setup"):
        load_runs([tmp_path])


def test_a_starved_clients_bursts_are_told_apart():
    doc = {"itls": [[3.1e-3, 2.9e-3, 4e-6, 3e-6], [3.0e-3, 2e-6]]}   # seconds, as vLLM's
    assert bursty_share(doc) == pytest.approx(0.5)
    assert bursty_share({"itls": [[3.0e-3, 2.0e-3]]}) == 0.0


# ---------------------------------------------------------------------------------------------
# Our engine against vLLM


def test_our_engine_gives_vllms_tokens_and_acceptance_step_by_step():
    """The committed vLLM outputs (traces/measured/vllm-cpu/tokens.json.gz: every chunk vLLM
    streamed for the 48 held-out prompts, per k) against our engine on the same pair: the same
    greedy tokens, and the same tokens in every step (1 + the drafts accepted)."""
    from stepgap.calibrate.pair import load_heldout
    from stepgap.engine.args import EngineArgs
    from stepgap.engine.loop import run_trace
    pair = ROOT / "checkpoints" / "pystdlib"
    with gzip.open(ROOT / "traces" / "measured" / "vllm-cpu" / "tokens.json.gz", "rt") as f:
        vllm = json.load(f)
    reqs = load_heldout(pair)
    assert set(vllm) >= {"0", "2", "4"}
    for k in (0, 2, 4):
        chunks = {r["request_id"]: r["chunks"] for r in vllm[str(k)]}
        args = EngineArgs(model=str(pair / "target"), draft=str(pair / "eagle3") if k else None,
                          k=k, dtype="float32", max_model_len=256, max_num_seqs=8,
                          num_threads=1)
        vocab = json.loads((pair / "target" / "config.json").read_text())["vocab_size"]
        out = run_trace(args.make_executor(), reqs, args.engine_config("sync"), vocab_size=vocab,
                        max_concurrency=4, detailed=True)
        for r, sizes in zip(reqs, out.result["chunk_tokens"]):
            want = chunks[r.request_id]
            assert out.output_token_ids[r.request_id] == [t for c in want for t in c], (k, r)
            if k:
                assert sizes == [len(c) for c in want], (k, r.request_id)
