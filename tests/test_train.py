"""`stepgap train` and the committed trained pair (checkpoints/pystdlib).

The training code: deterministic, its training-time-test unroll equals the head run the engine's
way. The committed pair: it loads in transformers and in the engine, speculative decoding on it
is lossless with acceptances at every draft position, and its acceptance length on held-out code
at k = 4 is at least 2.5.
"""

import functools
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from stepgap.training import corpus
from stepgap.engine.checkpoint import load_draft, load_target
from stepgap.calibrate.pair import PAIR, load_heldout, pair_paths
from stepgap.engine.model import Llama, init_weights
from stepgap.training.train import PRESETS, Eagle3Head, train_pair, ttt_unroll
from stepgap.engine.args import EngineArgs
from tests.helpers import reference_greedy
from stepgap.cli import main
from stepgap.common.formats import load_trace

SMOKE = PRESETS["smoke"]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """40 training files and 3 held-out files of the stdlib, at their relative paths."""
    root, train, held = corpus.split()
    out = tmp_path_factory.mktemp("corpus")
    for f in train[:40] + held[:3]:
        dst = out / f.relative_to(root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dst)
    return out


def _bytes(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "train.json"}


def test_training_twice_with_one_seed_gives_the_same_bytes(small_corpus, tmp_path):
    a = train_pair(tmp_path / "a", SMOKE, small_corpus, threads=1, progress=False,
                   log=lambda *_: None)
    b = train_pair(tmp_path / "b", SMOKE, small_corpus, threads=1, progress=False,
                   log=lambda *_: None)
    files = _bytes(tmp_path / "a")
    assert {"target/model.safetensors", "target/tokenizer.json", "eagle3/model.safetensors",
            "heldout.jsonl"} <= set(files)
    assert files == _bytes(tmp_path / "b")
    assert a["agreement"] == b["agreement"]


def test_head_training_moves_the_head_and_leaves_the_target_and_embedding_alone():
    from stepgap.training.train import build_head, train_head
    torch.manual_seed(0)
    target = Llama(SMOKE.target_config(), SMOKE.aux_layers, max_positions=64)
    init_weights(target, seed=0)
    seqs = torch.randint(0, SMOKE.vocab_size, (40, SMOKE.seq_len + 1))
    head = build_head(target, SMOKE, seqs.numpy())
    frozen = {n: p.clone() for n, p in target.named_parameters()}
    fc = head.fc.weight.clone()
    train_head(target, head, seqs, SMOKE, torch.Generator().manual_seed(0), progress=False)
    for n, p in target.named_parameters():
        assert torch.equal(p, frozen[n]), n
    assert head.embed_tokens is target.embed_tokens
    assert not torch.equal(head.fc.weight, fc)


def test_ttt_steps_equal_the_head_run_the_engines_way():
    # The engine drafts from base position p with step 0's KV at positions <= p and its own
    # steps' KV after it: a causal run over exactly those rows (the dense path).
    torch.manual_seed(0)
    cfg = SMOKE
    with torch.device("cpu"):
        target = Llama(cfg.target_config(), cfg.aux_layers, max_positions=64).double()
        head = Eagle3Head(cfg.draft_config(), cfg.hidden_size, max_positions=64).double()
    init_weights(target, seed=0)
    init_weights(head, seed=1, std=0.2)
    head.embed_tokens = target.embed_tokens
    b, t, steps = 2, 12, 4
    ids = torch.randint(0, cfg.vocab_size, (b, t + 1))
    with torch.no_grad():
        _, aux = target(ids[:, :-1].flatten(), torch.arange(t).repeat(b))
        outs = ttt_unroll(head, ids, aux, steps)
        fused = head.combine(aux).view(b, t, -1)
        for s in range(b):
            for p in range(t - steps):
                hidden, toks = [fused[s, :p + 1]], ids[s, 1:p + 2].tolist()
                for j in range(steps):
                    if j:
                        toks.append(int(ids[s, p + j + 1]))
                    pre = head(torch.tensor(toks), torch.arange(len(toks)), torch.cat(hidden))
                    torch.testing.assert_close(pre[-1], outs[j][s * t + p], rtol=0, atol=1e-12)
                    hidden.append(pre[-1:])


def test_train_cli_writes_the_pair_and_says_where(small_corpus, tmp_path, capsys):
    assert main(["train", str(tmp_path / "o"), "--preset", "smoke", "--corpus",
                 str(small_corpus), "--quiet", "--threads", "1"]) == 0
    text = capsys.readouterr().out
    for name in ("target", "eagle3", "heldout", "log", "s wall"):
        assert name in text
    assert len(load_trace(tmp_path / "o" / "heldout.jsonl")) == SMOKE.heldout_prompts


@pytest.mark.parametrize("field, value, needle", [
    ("draft_vocab_size", 400, "draft_vocab_size (400) exceeds vocab_size (320)"),
    ("aux_layers", (1, 1, 3), "aux_layers must be three distinct layers of 4"),
    ("ttt_steps", 0, "ttt_steps must be an integer >= 1"),
    ("seed", -1, "seed must be an integer >= 0"),
])
def test_bad_training_configs_name_the_field(field, value, needle):
    from stepgap.common.errors import UserError
    with pytest.raises(UserError, match=re.escape(needle)):
        replace(SMOKE, **{field: value})


# -- the committed pair ---------------------------------------------------------------------------


def pair_args(dtype: str, **kw) -> EngineArgs:
    paths = pair_paths(PAIR)
    base = dict(num_gpu_blocks_override=160, max_model_len=272, max_num_seqs=8, max_k=5)
    return EngineArgs(model=paths["target"], draft=paths["eagle3"], dtype=dtype,
                      **{**base, **kw})


@functools.lru_cache(maxsize=None)
def pair_executor(dtype: str):
    return pair_args(dtype).make_executor()


@functools.lru_cache(maxsize=None)
def pair_reference(rid: str, n: int) -> tuple:
    model, _ = load_target(pair_paths(PAIR)["target"], torch.device("cpu"), torch.float64)
    req = {r.request_id: r for r in load_heldout(PAIR)}[rid]
    return tuple(reference_greedy(model, req.prompt_token_ids, n))


def pair_run(dtype, reqs, k, mode="sync", executor=None, num_blocks=160, max_num_seqs=4,
             max_num_batched_tokens=8192, max_concurrency=None):
    from stepgap.engine.loop import run_trace
    cfg = pair_args(dtype, mode=mode, num_gpu_blocks_override=num_blocks,
                    max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens).engine_config(k=k)
    return run_trace(executor or pair_executor(dtype), reqs, cfg, vocab_size=4096,
                     max_concurrency=max_concurrency)


# The tests of the pair's engine runs share its executors and its greedy references (computed
# once per process, a few seconds each): they run on one pytest-xdist worker.
PAIR_RUNS = pytest.mark.xdist_group("train-pair-runs")


def heldout_prefixes(n: int = 6, output_len: int = 40):
    """The first n held-out prompts, each asked for output_len tokens."""
    return [replace(r, output_len=output_len) for r in load_heldout(PAIR, n)]


def assert_target_greedy(out, reqs):
    for r in reqs:
        want = list(pair_reference(r.request_id, r.output_len))
        assert out.output_token_ids[r.request_id] == want, r.request_id


def test_the_committed_pair_is_small_and_complete():
    paths = pair_paths(PAIR)
    total = sum(p.stat().st_size for p in PAIR.rglob("*") if p.is_file())
    assert total <= 8 * 2 ** 20
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (Path(paths["target"]) / f).is_file()
    assert len(load_heldout(PAIR)) >= 32


def test_the_committed_target_loads_in_transformers_with_the_engines_logits():
    transformers = pytest.importorskip("transformers")
    paths = pair_paths(PAIR)
    hf = transformers.LlamaForCausalLM.from_pretrained(paths["target"], dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(paths["target"])
    text = "def read_text(path):\n    with open(path) as f:\n        return f.read()\n"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    model, _ = load_target(paths["target"], torch.device("cpu"), torch.float32)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0]
        hidden, _ = model(torch.tensor(ids), torch.arange(len(ids)), return_aux=False)
        torch.testing.assert_close(model.compute_logits(hidden), want, rtol=1e-4, atol=1e-4)


def test_the_committed_head_loads_in_the_engine_with_its_draft_vocabulary():
    from safetensors.torch import load_file
    paths = pair_paths(PAIR)
    target, tcfg = load_target(paths["target"], torch.device("cpu"), torch.float32)
    head, dcfg = load_draft(paths["eagle3"], target, torch.device("cpu"), torch.float32)
    assert dcfg.layout == "yuhuili" and dcfg.draft_vocab_size < tcfg.vocab_size
    assert len(set(dcfg.aux_layers_for(tcfg))) == 3 and target.aux_layers == dcfg.aux_layer_ids
    assert head.embed_tokens is target.embed_tokens  # shared, as yuhuili heads are
    t2d = load_file(str(Path(paths["eagle3"]) / "model.safetensors"))["t2d"]
    ids = torch.arange(dcfg.draft_vocab_size) + head.d2t
    assert t2d.sum() == dcfg.draft_vocab_size and t2d[ids].all()


@PAIR_RUNS
@pytest.mark.parametrize("k", [1, 4, 5])
def test_spec_decode_on_the_pair_is_lossless_with_acceptances_at_every_position(k):
    reqs = heldout_prefixes()
    out = pair_run("float64", reqs, k)
    assert_target_greedy(out, reqs)
    spec = out.result["spec_decode"]
    assert all(rate > 0 for rate in spec["acceptance_rate_per_pos"])
    assert spec["acceptance_rate"] < 1.0


@PAIR_RUNS
def test_spec_decode_on_the_pair_is_lossless_under_preemption():
    reqs = heldout_prefixes()
    out = pair_run("float64", reqs, 3, num_blocks=24)
    assert out.result["config"]["num_preemptions"] > 0
    assert_target_greedy(out, reqs)


@PAIR_RUNS
def test_spec_decode_on_the_pair_is_lossless_with_chunked_prefill():
    reqs = heldout_prefixes()
    out = pair_run("float64", reqs, 4, max_num_batched_tokens=24)
    assert_target_greedy(out, reqs)


@PAIR_RUNS
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("mode", ["async", "zero-bubble"])
def test_overlapped_modes_on_the_pair_emit_the_targets_greedy_tokens(mode, concurrency):
    reqs = heldout_prefixes()
    out = pair_run("float64", reqs, 4, mode=mode, max_concurrency=concurrency)
    assert_target_greedy(out, reqs)  # what sync emits too
    assert all(rate > 0 for rate in out.result["spec_decode"]["acceptance_rate_per_pos"])


@PAIR_RUNS
def test_the_process_executor_on_the_pair_emits_the_targets_greedy_tokens():
    reqs = heldout_prefixes()
    with pair_args("float64", executor="process", max_k=4, num_threads=1).make_executor() as ex:
        out = pair_run("float64", reqs, 4, mode="zero-bubble", executor=ex, max_concurrency=4)
    assert_target_greedy(out, reqs)


@PAIR_RUNS
def test_acceptance_length_on_heldout_code_at_k4_is_at_least_2_5():
    out = pair_run("float32", load_heldout(PAIR, 12), 4, max_num_seqs=8)
    assert out.result["spec_decode"]["acceptance_length"] >= 2.5


def test_demo_prints_the_engine_next_to_the_simulator(capsys):
    assert main(["demo", "--num-prompts", "2", "--k", "3", "--quiet", "--no-advise"]) == 0
    text = capsys.readouterr().out
    for needle in ("engine (measured)", "sim (predicted)", "Acceptance length", "Mean TPOT (ms)",
                   "P99 ITL (ms)", "Per-position acceptance (%)", "generated",
                   "costs: measured on this machine just before, in the same worker"):
        assert needle in text


def test_demo_takes_the_committed_profile_when_asked(capsys):
    assert main(["demo", "--num-prompts", "2", "--k", "3", "--profile", "committed",
                 "--quiet", "--no-advise"]) == 0
    text = capsys.readouterr().out
    assert "costs: the measured profile traces/measured/cpu/profile.json" in text
    assert "(measured on the machine of docs/explanation/validation.md, not this one)" in text


def test_the_demo_leads_with_advises_answer_on_the_seeds_setup(monkeypatch, capsys):
    from stepgap.calibrate import demo
    said = []
    monkeypatch.setattr(demo, "headline", lambda out: said.append("headline") or out("HEAD"))
    assert main(["demo", "--num-prompts", "2", "--k", "3", "--quiet",
                 "--profile", "committed"]) == 0
    text = capsys.readouterr().out
    assert said == ["headline"] and text.startswith("HEAD\n")
    assert text.index("HEAD") < text.index("engine (measured)")


def test_the_headline_is_advises_verdict_and_the_prs_k_in_both_modes():
    from stepgap.calibrate.demo import headline
    from stepgap.sim.advise_report import verdict
    lines = []
    advice = headline(lines.append, num_prompts=4, output_len=32)
    a = advice.answers[0]
    assert lines[1] == f"  {verdict(a)}"
    sync, asyn = a.modes["sync"].grid[4], a.modes["async"].grid[4]
    assert lines[2].startswith(f"  at the PR's k=4: sync {sync:.2f} ms, async {asyn:.2f} ms")
    assert "the PR measured 9.91 and 9.57 ms (saves 3.4 %)" in lines[2]


def test_demo_names_a_missing_pair(tmp_path, capsys):
    assert main(["demo", "--pair", str(tmp_path)]) == 2
    assert "stepgap train" in capsys.readouterr().err
