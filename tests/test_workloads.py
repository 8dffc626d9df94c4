"""Built-in workloads and the load generator."""

import math
import re

import pytest

from stepgap.common.errors import UserError
from stepgap.common.formats import TraceRequest, save_trace
from stepgap.common.workloads import (LoadGenerator, arrival_times, load_workload, mtbench_like,
                               sharegpt_like)


def test_mtbench_like_has_eighty_prompts_ten_per_category():
    reqs = mtbench_like()
    assert len(reqs) == 80 and {r.output_len for r in reqs} == {256}
    cats = [r.category for r in reqs]
    assert all(cats.count(c) == 10 for c in set(cats)) and len(set(cats)) == 8
    assert mtbench_like() == reqs  # deterministic
    assert mtbench_like(seed=1) != reqs


def test_sharegpt_like_length_mix():
    reqs = sharegpt_like(2000)
    mean_in = sum(r.prompt_len for r in reqs) / len(reqs)
    mean_out = sum(r.output_len for r in reqs) / len(reqs)
    assert 120 < mean_in < 200 and 250 < mean_out < 400
    assert max(r.prompt_len for r in reqs) <= 1024


def test_arrival_times_match_vllm_rescaling():
    t = arrival_times(100, request_rate=4.0, seed=3)
    assert t[-1] == pytest.approx(25.0) and t == sorted(t)
    assert arrival_times(5, math.inf) == [0.0] * 5
    assert arrival_times(4, 2.0, burstiness=math.inf) == pytest.approx([0.5, 1.0, 1.5, 2.0])


@pytest.mark.parametrize("rate, burst", [(-1.0, 1.0), (0.0, 1.0), (1.0, 0.0)])
def test_bad_rates_are_user_errors(rate, burst):
    with pytest.raises(UserError):
        arrival_times(3, rate, burst)


def test_load_generator_holds_max_concurrency():
    reqs = [TraceRequest(str(i), 0.0, 4, 4) for i in range(3)]
    gen = LoadGenerator(reqs, max_concurrency=1)
    assert [r.request_id for r in gen.pop_due(0.0)] == ["0"]
    assert gen.next_arrival() is None and gen.pop_due(5.0) == []
    gen.complete()
    assert gen.next_arrival() == 0.0 and [r.request_id for r in gen.pop_due(5.0)] == ["1"]


def test_load_generator_waits_for_arrivals():
    reqs = [TraceRequest("late", 2.0, 4, 4), TraceRequest("early", 1.0, 4, 4)]
    gen = LoadGenerator(reqs)
    assert gen.pop_due(0.5) == [] and gen.next_arrival() == 1.0
    assert [r.request_id for r in gen.pop_due(2.0)] == ["early", "late"]


def test_trace_file_workload_cycles_and_overrides(tmp_path):
    save_trace(tmp_path / "t.jsonl", [TraceRequest("a", 0.0, 3, 5, accepted=[1, 2])])
    reqs = load_workload(str(tmp_path / "t.jsonl"), num_prompts=3, output_len=9)
    assert [r.request_id for r in reqs] == ["a", "a#1", "a#2"]
    assert {r.output_len for r in reqs} == {9} and reqs[0].accepted is None


def test_unknown_workload_is_named():
    with pytest.raises(UserError, match="unknown workload 'nope'"):
        load_workload("nope")


def test_mtbench_like_prompt_lengths_follow_the_question_set():
    # Category means estimated from MT-bench's first turns plus the Llama-3.1 chat template.
    reqs = mtbench_like(num_prompts=8000)
    by_cat = {}
    for r in reqs:
        by_cat.setdefault(r.category, []).append(r.prompt_len)
    means = {c: sum(v) / len(v) for c, v in by_cat.items()}
    assert max(means, key=means.get) == "extraction" and min(means, key=means.get) == "humanities"
    assert 95 < sum(r.prompt_len for r in reqs) / len(reqs) < 110


def test_cycling_a_trace_never_repeats_an_id_the_trace_holds(tmp_path):
    path = tmp_path / "t.jsonl"
    save_trace(path, [TraceRequest(rid, 0.0, 4, 4) for rid in ("a", "a#2")])
    ids = [r.request_id for r in load_workload(str(path), num_prompts=5)]
    assert ids == ["a", "a#2", "a#2#", "a#2#3", "a#4"]   # the 3rd repeats a, as a#2 would


# -- workloads with shared prefixes (prefix caching) ----------------------------------------

def test_prefix_repetition_shares_each_prefix_among_its_prompts():
    from stepgap.common.workloads import load_workload
    reqs = load_workload("prefix_repetition:prefix_len=64:suffix_len=16:num_prefixes=4",
                         num_prompts=20, output_len=8, vocab_size=1000)
    assert len(reqs) == 20 and all(r.prompt_len == 80 for r in reqs)
    prefixes = {tuple(r.prompt_token_ids[:64]) for r in reqs}
    assert len(prefixes) == 4
    assert all(max(r.prompt_token_ids) < 1000 for r in reqs)
    assert len({tuple(r.prompt_token_ids[64:]) for r in reqs}) == 20


def test_generated_shared_prefix_is_groups_of_questions_after_a_system_prompt():
    from stepgap.common.workloads import load_workload
    reqs = load_workload("generated-shared-prefix:num_groups=3:prompts_per_group=2:"
                         "system_prompt_len=32:question_len=8", vocab_size=500)
    assert [r.request_id for r in reqs] == ["gsp-0-0", "gsp-0-1", "gsp-1-0", "gsp-1-1",
                                            "gsp-2-0", "gsp-2-1"]
    assert reqs[0].prompt_token_ids[:32] == reqs[1].prompt_token_ids[:32] \
        != reqs[2].prompt_token_ids[:32]


def test_each_turn_of_a_session_extends_the_last_turns_prompt():
    from stepgap.common.workloads import load_workload
    reqs = {r.request_id: r for r in load_workload(
        "multi-turn:sessions=2:turns=3:first_len=20:user_len=5", output_len=4)}
    t0, t1, t2 = (reqs[f"session-1-turn-{t}"] for t in range(3))
    assert (t0.prompt_len, t1.prompt_len, t2.prompt_len) == (20, 29, 38)
    assert t1.prompt_token_ids[:20] == t0.prompt_token_ids
    assert t2.prompt_token_ids[:29] == t1.prompt_token_ids


@pytest.mark.parametrize("spec, message", [
    ("prefix_repetition:prefix_len=x", r"prefix_len must be an integer"),
    ("prefix_repetition:num_groups=3", r"takes no parameter 'num_groups'"),
    ("prefix_repetition:num_prefixes=0", r"num_prefixes must be an integer from 1"),
    ("mtbench:prefix_len=3", r"'mtbench' takes no parameter"),
])
def test_a_bad_workload_parameter_is_one_clear_error(spec, message):
    from stepgap.common.workloads import load_workload
    with pytest.raises(UserError, match=message):
        load_workload(spec)


def test_vllms_flags_make_the_workload_spec():
    from types import SimpleNamespace
    from stepgap.common.options import WORKLOAD_FLAGS, workload_spec
    flags = {f.lstrip("-").replace("-", "_"): None for f, _, _ in WORKLOAD_FLAGS}
    args = SimpleNamespace(trace=None, output_len=None, dataset_name="prefix_repetition",
                           **{**flags, "prefix_repetition_prefix_len": 128,
                              "prefix_repetition_num_prefixes": 5,
                              "prefix_repetition_output_len": 32})
    assert workload_spec(args) == "prefix_repetition:prefix_len=128:num_prefixes=5"
    assert args.output_len == 32
    args = SimpleNamespace(trace=None, output_len=None, dataset_name="prefix_repetition",
                           **{**flags, "gsp_num_groups": 2})
    with pytest.raises(UserError, match=r"--gsp-num-groups: an option of another workload"):
        workload_spec(args)


def test_token_ids_past_the_vocabulary_are_refused_before_the_run(tmp_path):
    import json
    from stepgap.sim.config import SimConfig
    from stepgap.sim.loop import simulate
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"request_id": "x", "arrival_s": 0, "prompt_len": 2,
                                 "output_len": 2, "prompt_token_ids": [5, 200000]}) + "\n")
    with pytest.raises(UserError, match=r"request 'x': prompt_token_ids holds 200000, past the "
                                        r"target's vocabulary of 128256"):
        simulate(SimConfig(workload=str(trace)))


def test_a_block_size_that_does_not_divide_the_context_is_refused_with_prefix_caching():
    from stepgap.common.scheduler import SchedulerConfig
    with pytest.raises(UserError, match=r"--block-size 16 does not divide the model's context "
                                        r"\(max_position_embeddings 1000\)"):
        SchedulerConfig(num_blocks=100, block_size=16, max_model_len=500,
                        max_position_embeddings=1000)
    SchedulerConfig(num_blocks=100, block_size=16, max_model_len=500,
                    max_position_embeddings=1000, enable_prefix_caching=False)
    # a run's own --max-model-len may stop anywhere short of the context, as in vLLM
    SchedulerConfig(num_blocks=100, block_size=16, max_model_len=50, max_position_embeddings=1024)


# -- the shared fraction of the prompt (the sweep axis shared_fraction) -------------------------

@pytest.mark.parametrize("spec, shared, rest", [
    ("prefix_repetition:prefix_len=64:suffix_len=16:num_prefixes=4", "prefix_len", "suffix_len"),
    ("prefix_repetition:num_prefixes=4", "prefix_len", "suffix_len"),   # the defaults' 512
    ("generated-shared-prefix:num_groups=4:prompts_per_group=5:system_prompt_len=60:"
     "question_len=20", "system_prompt_len", "question_len")])
@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.75, 1.0])
def test_a_shared_fraction_sizes_the_prefix_and_keeps_the_prompts_length(spec, shared, rest,
                                                                          fraction):
    from stepgap.common.workloads import load_workload, parse_spec, shared_split
    plain = load_workload(spec, num_prompts=20, output_len=4, vocab_size=1000)
    reqs = load_workload(spec, num_prompts=20, output_len=4, vocab_size=1000,
                         shared_fraction=fraction)
    length = plain[0].prompt_len
    assert all(r.prompt_len == length for r in reqs)
    split = shared_split(spec, fraction)
    assert split[shared] == round(fraction * length) and sum(split.values()) == length
    assert parse_spec(spec)[0] and set(split) == {shared, rest}
    prefix = split[shared]
    # four groups: their prompts share exactly the first `prefix` tokens
    assert len({tuple(r.prompt_token_ids[:prefix]) for r in reqs}) == (4 if prefix else 1)
    if split[rest]:
        assert len({tuple(r.prompt_token_ids) for r in reqs}) == 20


@pytest.mark.parametrize("spec, fraction, message", [
    ("mtbench", 0.5, "has no shared prefix to size"),
    ("multi-turn", 0.5, "has no shared prefix to size"),
    ("prefix_repetition", 1.5, "from 0 to 1"),
    ("prefix_repetition", -0.1, "from 0 to 1")])
def test_a_shared_fraction_where_it_means_nothing_is_refused(spec, fraction, message):
    with pytest.raises(UserError, match=message):
        load_workload(spec, num_prompts=4, shared_fraction=fraction)


def test_the_simulator_refuses_a_shared_fraction_of_a_workload_without_a_prefix():
    from stepgap.sim.config import SimConfig
    with pytest.raises(UserError, match="shared-fraction.*prefix_repetition or "
                                        "generated-shared-prefix"):
        SimConfig(workload="mtbench", shared_fraction=0.5)
    with pytest.raises(UserError, match="shared-fraction.*from 0 to 1"):
        SimConfig(workload="prefix_repetition", shared_fraction=2.0)


# ---------------------------------------------------------------------------------------------
# `vllm bench serve`'s datasets (common/datasets.py)

PAIR = __import__("pathlib").Path(__file__).resolve().parents[1] / "checkpoints" / "pystdlib"


def vllm_random_lengths(n, input_len, output_len, ratio, special, seed=0):
    """vLLM 0.32's RandomDataset.get_sampling_params, restated from its source: one
    default_rng(seed), input lengths then output lengths drawn from integer ranges."""
    import numpy as np
    rng = np.random.default_rng(seed)
    real = max(0, input_len - special)
    ins = rng.integers(math.floor(real * (1 - ratio)), math.ceil(real * (1 + ratio)) + 1, n)
    outs = rng.integers(max(math.floor(output_len * (1 - ratio)), 1),
                        max(math.ceil(output_len * (1 + ratio)), 1) + 1, n)
    return ins.tolist(), outs.tolist()


def test_random_draws_vllms_lengths_for_the_same_seed():
    reqs = load_workload("random:input_len=1000:range_ratio=0.5", num_prompts=50,
                         output_len=100, seed=7, model="llama-3.1-8b", vocab_size=128256)
    ins, outs = vllm_random_lengths(50, 1000, 100, 0.5, special=1, seed=7)
    assert [r.prompt_len for r in reqs] == [1 + n for n in ins]   # the server adds BOS back
    assert [r.output_len for r in reqs] == outs
    assert len(load_workload("random")) == 1000   # vLLM's default --num-prompts


def test_random_without_a_range_is_the_lengths_given_and_qwen_adds_no_token():
    reqs = load_workload("random:input_len=512", num_prompts=3, output_len=64,
                         model="qwen3-8b")
    assert {(r.prompt_len, r.output_len) for r in reqs} == {(512, 64)}


def test_random_prefix_is_shared_by_every_prompt_and_the_rest_is_its_own():
    reqs = load_workload("random:input_len=64:prefix_len=32", num_prompts=4, output_len=8,
                         model="llama-3.1-8b", vocab_size=128256)
    assert {r.prompt_len for r in reqs} == {1 + 32 + 63}
    prefixes = {tuple(r.prompt_token_ids[:33]) for r in reqs}
    rests = {tuple(r.prompt_token_ids[33:]) for r in reqs}
    assert len(prefixes) == 1 and len(rests) == 4


def test_vllms_flags_make_the_random_spec_and_random_is_vllms_default(capsys):
    from types import SimpleNamespace
    from stepgap.common.options import WORKLOAD_FLAGS, workload_spec
    flags = {f.lstrip("-").replace("-", "_"): None for f, _, _ in WORKLOAD_FLAGS}
    args = SimpleNamespace(trace=None, output_len=None, dataset_name=None, dataset_path=None,
                           command="simulate", **{**flags, "random_input_len": 1024,
                                                  "random_output_len": 128,
                                                  "random_range_ratio": 0.25})
    assert workload_spec(args) == "random:input_len=1024:range_ratio=0.25"
    assert args.output_len == 128
    assert "vLLM's default dataset, random" in capsys.readouterr().err


def sharegpt(tmp_path, n=6):
    import json
    data = [{"id": str(i), "conversations": [
        {"from": "human", "value": "def f(x):\n    return x + %d  # explain\n" % i * (i + 1)},
        {"from": "gpt", "value": "It adds a number to x. " * (i + 1)}]} for i in range(n)]
    data.append({"id": "one-turn", "conversations": [{"from": "human", "value": "hi"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    return path, data


def test_sharegpt_lengths_come_from_the_models_tokenizer(tmp_path):
    from tokenizers import Tokenizer
    path, data = sharegpt(tmp_path)
    tok = Tokenizer.from_file(str(PAIR / "target" / "tokenizer.json"))
    reqs = load_workload(f"sharegpt:shuffle=0:path={path}", num_prompts=6,
                         model=str(PAIR / "target"))
    want = [(len(tok.encode(d["conversations"][0]["value"]).ids),
             len(tok.encode(d["conversations"][1]["value"]).ids)) for d in data[:6]]
    want = [(p, o) for p, o in want if p >= 4 and o >= 4]   # vLLM's length checks
    assert [(r.prompt_len, r.output_len) for r in reqs][:len(want)] == want
    assert len(reqs) == 6   # oversampled to --num-prompts from the ones kept


def test_sharegpt_counts_a_lone_surrogate_as_utf8_would_hold_it(tmp_path):
    path = tmp_path / "s.json"   # JSON may escape half a pair; the tokenizer raised TypeError
    path.write_text('[{"conversations": [{"from": "human", "value": "\\ud800 def f(x): '
                    'return x"}, {"from": "gpt", "value": "It returns x, as it is."}]}]')
    reqs = load_workload(f"sharegpt:shuffle=0:path={path}", num_prompts=2,
                         model=str(PAIR / "target"))
    assert len(reqs) == 2 and reqs[0].prompt_len >= 4


def test_sharegpt_shuffles_with_pythons_random_as_vllm_does(tmp_path):
    import random
    path, data = sharegpt(tmp_path)
    order = list(range(6))
    random.seed(3)
    random.shuffle(order)
    reqs = load_workload(f"sharegpt:path={path}", num_prompts=6, seed=3, output_len=5)
    lens = [len(data[i]["conversations"][0]["value"]) for i in order]
    assert [r.prompt_len for r in reqs] == [round(n / 4) for n in lens]   # no tokenizer
    assert {r.output_len for r in reqs} == {5}


def test_without_a_tokenizer_the_estimate_is_named_in_the_runs_notes(tmp_path):
    from stepgap.sim.config import SimConfig
    from stepgap.sim.plan import resolve
    path, _ = sharegpt(tmp_path)
    notes = resolve(SimConfig(workload=f"sharegpt:path={path}")).notes
    assert any("lengths estimated at 4 characters a token" in n for n in notes)
    notes = resolve(SimConfig(workload=f"sharegpt:path={path}", model=str(PAIR / "target"),
                              draft=str(PAIR / "eagle3"), gpu="cpu")).notes
    assert any("lengths from the tokenizer" in n for n in notes)


def test_hf_mt_bench_is_the_built_in_mtbench_with_vllms_default_prompts():
    assert load_workload("hf:path=philschmid/mt-bench", num_prompts=80) == mtbench_like()
    assert len(load_workload("hf:path=philschmid/mt-bench")) == 1000


@pytest.mark.parametrize("name, path, message", [
    ("sonnet", None, "a vLLM dataset stepgap does not sample"),
    ("hf", "likaixin/InstructCoder", "stepgap has the lengths of philschmid/mt-bench only"),
    ("random", "x.json", "random makes its own prompts"),
    ("bogus", None, "not a dataset of `vllm bench serve`"),
])
def test_a_dataset_stepgap_does_not_sample_is_one_line_saying_what_to_give(name, path, message):
    from stepgap.common.options import dataset_spec
    with pytest.raises(UserError, match=message) as e:
        dataset_spec(name, path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("spec", ["multi-turn:sessions=5:turns=4",
                                  "generated-shared-prefix:num_groups=4:prompts_per_group=3:"
                                  "system_prompt_len=40:question_len=8"])
def test_num_prompts_builds_only_the_first_requests_with_the_same_tokens(spec):
    whole = load_workload(spec)
    for n in (1, 3, 5, 7, len(whole)):
        assert load_workload(spec, num_prompts=n) == whole[:n]


@pytest.mark.parametrize("spec, num_prompts, words", [
    ("multi-turn:sessions=1000000:turns=1000000", None, "sessions x turns = 1,000,000,000,000"),
    ("generated-shared-prefix:num_groups=1000000:prompts_per_group=1000000", None,
     "num_groups x prompts_per_group"),
    ("multi-turn:sessions=1000:turns=1000:first_len=1000000", 2000, "tokens, more than"),
    ("prefix_repetition:prefix_len=1000000:suffix_len=1000000", 100000, "tokens, more than"),
])
def test_a_workload_whose_size_is_a_product_is_refused_before_it_is_built(spec, num_prompts,
                                                                          words):
    with pytest.raises(UserError, match=re.escape(words)):
        load_workload(spec, num_prompts=num_prompts)


def test_the_generated_shared_prefix_defaults_fit_the_default_max_model_len():
    from stepgap.sim.config import SimConfig
    reqs = load_workload("generated-shared-prefix", num_prompts=2)
    assert max(r.prompt_len + r.output_len for r in reqs) <= SimConfig().max_model_len


@pytest.mark.parametrize("rate, n", [(1e-20, 80), (1e-300, 2), (79e-6, 80)])
def test_a_rate_whose_last_arrival_passes_a_million_seconds_is_refused(rate, n):
    with pytest.raises(UserError, match=r"--request-rate .*after 1e\+06 s"):
        arrival_times(n, rate)
    assert arrival_times(n, n / 1e6)[-1] == pytest.approx(1e6)
