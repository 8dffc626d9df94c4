"""Workloads and the load generator, with the semantics of `vllm bench serve`.

Built-in workloads (documented and justified in docs/reference/workloads.md, "Workloads"):

- `mtbench`: 80 prompts in MT-bench's eight categories, ten each, output 256 tokens;
- `sharegpt`: a ShareGPT-like length mix (log-normal prompt and output lengths); with a path,
  a local ShareGPT file sampled as vLLM samples it;
- `vllm bench serve`'s `random` and `hf` (philschmid/mt-bench) datasets, as vLLM samples them
  (common/datasets.py);
- with shared prefixes, and token ids: `prefix_repetition` (vLLM's dataset of that name),
  `generated-shared-prefix` (SGLang's), `multi-turn` (chat sessions, each turn extending the
  last), parameters given as NAME:KEY=VALUE:KEY=VALUE.

The load generator sends each request at its arrival time and holds at most `max_concurrency`
in flight, as the benchmark client does with its semaphore. `--request-rate` replaces the trace's
arrival times with a gamma process (Poisson when burstiness is 1), rescaled so that the last
arrival lands at num_prompts / rate, as vLLM does.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from pathlib import Path

import numpy as np

from stepgap.common.datasets import DEFAULT_VOCAB
from stepgap.common.errors import UserError
from stepgap.common.formats import TraceRequest, load_trace
from stepgap.common.limits import (MAX_ARRIVAL_S, MAX_PARAM, MAX_PROMPTS, MAX_WORKLOAD_TOKENS,
                                   MIN_BURSTINESS)

# MT-bench first-turn prompts per category, in Llama-3 tokens after the Llama-3.1 chat template
# (its system header with the knowledge and current dates adds about 36 tokens): means of the
# ten questions of each category of FastChat's question.jsonl, counted with Llama-3's
# pre-tokenizer pattern (docs/reference/workloads.md, "Workloads", says how).
MTBENCH_CATEGORIES = {
    "writing": 79, "roleplay": 100, "reasoning": 97, "math": 77,
    "coding": 77, "extraction": 254, "stem": 75, "humanities": 59,
}
MTBENCH_SIGMA = 0.3  # log-normal spread within a category (0.29 pooled over the questions)


def mtbench_like(num_prompts: int = 80, output_len: int = 256, seed: int = 0) -> list[TraceRequest]:
    """An MT-bench-like trace: categories in turn, ten prompts each for the default 80."""
    rng = np.random.default_rng(seed)
    cats = list(MTBENCH_CATEGORIES)
    per_cat = max(1, math.ceil(num_prompts / len(cats)))
    out = []
    for i in range(num_prompts):
        cat = cats[(i // per_cat) % len(cats)]
        mean = MTBENCH_CATEGORIES[cat]
        mu = math.log(mean) - MTBENCH_SIGMA ** 2 / 2
        plen = min(max(round(rng.lognormal(mu, MTBENCH_SIGMA)), 40), 1024)
        out.append(TraceRequest(f"mtbench-{i}", 0.0, plen, output_len, category=cat))
    return out


# ShareGPT (the vLLM benchmark's ShareGPT_V3 mix): mean prompt about 161 and mean output about
# 338 tokens, as the vLLM paper reports for it; long right tails.
SHAREGPT_PROMPT = (161.0, 1.0)   # (mean, log-normal sigma)
SHAREGPT_OUTPUT = (338.0, 0.9)
SHAREGPT_MAX_LEN = 1024


def sharegpt_like(num_prompts: int = 1000, output_len: int | None = None,
                  seed: int = 0) -> list[TraceRequest]:
    """A ShareGPT-like length mix. `output_len`, when given, fixes every output length."""
    rng = np.random.default_rng(seed)

    def draw(mean, sigma):
        v = rng.lognormal(math.log(mean) - sigma ** 2 / 2, sigma, num_prompts)
        return np.clip(np.round(v), 4, SHAREGPT_MAX_LEN).astype(int)

    prompts, outputs = draw(*SHAREGPT_PROMPT), draw(*SHAREGPT_OUTPUT)
    return [TraceRequest(f"sharegpt-{i}", 0.0, int(p), output_len or int(o))
            for i, (p, o) in enumerate(zip(prompts, outputs))]


# Workloads that share prefixes (prefix caching, docs/reference/workloads.md "Workloads"): random
# token ids below `vocab_size` (the target's vocabulary, passed by whoever runs the trace), seeded.


def _tokens(rng, n: int, vocab_size: int) -> list[int]:
    return rng.integers(0, vocab_size, n).tolist()


def check_size(name: str, requests: int, tokens: int, how: str) -> None:
    """A generated workload of `requests` prompts holding `tokens` tokens in all, refused
    before it is built when it passes MAX_PROMPTS or MAX_WORKLOAD_TOKENS (common/limits.py):
    its size is a product of parameters each within bounds (sessions x turns), which would
    fill the memory. `how` says the product."""
    if requests > MAX_PROMPTS:
        raise UserError(f"workload {name}: {how} = {requests:,} requests, more than "
                        f"{MAX_PROMPTS:,}; give --num-prompts, or smaller parameters")
    if tokens > MAX_WORKLOAD_TOKENS:
        raise UserError(f"workload {name}: its {requests:,} prompts hold {tokens:,} tokens, more "
                        f"than {MAX_WORKLOAD_TOKENS:,}; give fewer prompts (--num-prompts) or "
                        "shorter ones")


def _shared_groups(rng, name: str, groups: int, per: int, prefix_len: int, suffix_len: int,
                   output_len: int, vocab_size: int, limit: int | None = None
                   ) -> list[TraceRequest]:
    """`groups` random prefixes, each followed by `per` random suffixes of its own, group after
    group (the random draws in that order): name-g-j; the first `limit` of them (built lazily:
    the draws of those kept are the same)."""
    if prefix_len + suffix_len < 1:
        raise UserError("a workload of empty prompts: the shared prefix and each prompt's own "
                        "part are both 0 tokens long")
    n = groups * per if limit is None else min(limit, groups * per)
    workload, product = {"gsp": ("generated-shared-prefix", "num_groups x prompts_per_group"),
                         "prefix": ("prefix_repetition", "num_prefixes x prompts each")}[name]
    check_size(workload, n, n * (prefix_len + suffix_len), product)
    reqs = []
    for g in range(groups):
        prefix = _tokens(rng, prefix_len, vocab_size)
        for j in range(per):
            if len(reqs) == n:
                return reqs
            ids = prefix + _tokens(rng, suffix_len, vocab_size)
            reqs.append(TraceRequest(f"{name}-{g}-{j}", 0.0, len(ids), output_len, ids))
    return reqs


def prefix_repetition(num_prompts: int = 100, output_len: int = 128, seed: int = 0,
                      prefix_len: int = 256, suffix_len: int = 256, num_prefixes: int = 10,
                      vocab_size: int = DEFAULT_VOCAB) -> list[TraceRequest]:
    """vLLM's `--dataset-name prefix_repetition` (PrefixRepetitionRandomDataset): num_prefixes
    random prefixes of prefix_len tokens, each followed by num_prompts // num_prefixes random
    suffixes of suffix_len, shuffled (seeded)."""
    per = num_prompts // num_prefixes
    if per < 1:
        raise UserError(f"prefix_repetition: num_prompts ({num_prompts}) must be at least "
                        f"num_prefixes ({num_prefixes})")
    rng = np.random.default_rng(seed)
    reqs = _shared_groups(rng, "prefix", num_prefixes, per, prefix_len, suffix_len, output_len,
                          vocab_size)
    order = rng.permutation(len(reqs))
    return [reqs[i] for i in order]


def generated_shared_prefix(num_prompts: int | None = None, output_len: int = 256,
                            seed: int = 0, num_groups: int = 64, prompts_per_group: int = 16,
                            system_prompt_len: int = 1664, question_len: int = 128,
                            vocab_size: int = DEFAULT_VOCAB) -> list[TraceRequest]:
    """SGLang's `--dataset-name generated-shared-prefix` (its gsp options): num_groups system
    prompts of system_prompt_len tokens, each followed by prompts_per_group questions of
    question_len; num_prompts, when given, takes the first of them, group after group (and only
    those are built). SGLang's system prompt is 2048 tokens; stepgap's default, 1664, makes the
    default prompt (1792) and output (256) fit the default --max-model-len, 2048."""
    return _shared_groups(np.random.default_rng(seed), "gsp", num_groups, prompts_per_group,
                          system_prompt_len, question_len, output_len, vocab_size, num_prompts)


def multi_turn(num_prompts: int | None = None, output_len: int = 64, seed: int = 0,
               sessions: int = 16, turns: int = 4, first_len: int = 256, user_len: int = 64,
               vocab_size: int = DEFAULT_VOCAB) -> list[TraceRequest]:
    """Chat sessions: each turn's prompt is the last turn's prompt, that turn's answer and a new
    user message of user_len tokens. A static trace cannot hold the model's own answer, so the
    answer is output_len tokens of the trace's own (the cached prefix a turn finds is the last
    turn's prompt, not its answer: a real client's reuse is that plus the answer). Turns in
    order, session after session within each turn; num_prompts, when given, the first (and only
    those are built, with the same draws)."""
    n = sessions * turns if num_prompts is None else min(num_prompts, sessions * turns)
    grow = output_len + user_len   # tokens a prompt gains each turn
    full, part = divmod(n, sessions)
    tokens = sessions * (full * first_len + grow * full * (full - 1) // 2) \
        + part * (first_len + grow * full)
    check_size("multi-turn", n, tokens, "sessions x turns")
    rng = np.random.default_rng(seed)
    prompts = [_tokens(rng, first_len, vocab_size) for _ in range(min(sessions, n))]
    reqs = []
    for t in range(turns):
        for s in range(sessions):
            if len(reqs) == n:
                return reqs
            reqs.append(TraceRequest(f"session-{s}-turn-{t}", 0.0, len(prompts[s]), output_len,
                                     list(prompts[s])))
            prompts[s] = prompts[s] + _tokens(rng, grow, vocab_size)
    return reqs


def hf_dataset(num_prompts: int = 1000, output_len: int = 256, seed: int = 0,
               path: str = "philschmid/mt-bench") -> list[TraceRequest]:
    """`--dataset-name hf --dataset-path ID`: a Hugging Face dataset stepgap has the lengths of
    (common/datasets.py HF_DATASETS), with vLLM's default of 1000 prompts (oversampled)."""
    from stepgap.common.datasets import check_dataset_name
    check_dataset_name("hf", path)
    return mtbench_like(num_prompts, output_len, seed)


def _random(**kw) -> list[TraceRequest]:
    from stepgap.common.datasets import random_dataset
    return random_dataset(**kw)


def _sharegpt(path: str | None = None, **kw) -> list[TraceRequest]:
    """The built-in ShareGPT-like mix, or with a path vLLM's ShareGPT sampling of that file."""
    from stepgap.common.datasets import sharegpt_file
    if path is None:
        kw.pop("model", None), kw.pop("tokenizer", None), kw.pop("shuffle", None)
        return sharegpt_like(**kw)
    return sharegpt_file(path, **kw)


BUILTIN = {"mtbench": mtbench_like, "sharegpt": _sharegpt,
           "prefix_repetition": prefix_repetition,
           "generated-shared-prefix": generated_shared_prefix, "multi-turn": multi_turn,
           "random": _random, "hf": hf_dataset}
# The parameters each built-in takes in a spec (NAME:KEY=VALUE:KEY=VALUE), integers but where
# FLOAT_PARAMS or TEXT_PARAMS say; a `path` comes last and takes the rest of the spec.
PARAMS = {"prefix_repetition": ("prefix_len", "suffix_len", "num_prefixes"),
          "generated-shared-prefix": ("num_groups", "prompts_per_group", "system_prompt_len",
                                      "question_len"),
          "multi-turn": ("sessions", "turns", "first_len", "user_len"),
          "random": ("input_len", "range_ratio", "prefix_len", "tokenizer"),
          "sharegpt": ("shuffle", "tokenizer", "path"), "hf": ("path",)}
FLOAT_PARAMS = ("range_ratio",)
TEXT_PARAMS = ("tokenizer", "path")
TOKEN_WORKLOADS = ("prefix_repetition", "generated-shared-prefix", "multi-turn",
                   "random")   # the built-ins with token ids (vocab_size matters)
ZERO_OK = ("prefix_len", "suffix_len", "question_len", "user_len", "input_len",
           "shuffle")   # the parameters that may be 0
# The workloads a shared fraction applies to: (the shared prefix's length, the rest's). A fraction
# f keeps the prompt's length (the two's sum, each as given or its default) and makes the first
# round(f x length) tokens the shared prefix: the sweep axis `shared_fraction`.
SHARED_SPLIT = {"prefix_repetition": ("prefix_len", "suffix_len"),
                "generated-shared-prefix": ("system_prompt_len", "question_len")}


def parse_spec(spec: str) -> tuple[str, dict]:
    """`prefix_repetition:prefix_len=768:suffix_len=256` -> (name, {prefix_len: 768, ...});
    `sharegpt:path=FILE` (the path last, whatever it holds)."""
    head, sep, path = spec.partition(":path=")
    name, *rest = head.split(":")
    params = {}
    if sep:
        rest.append("path=" + path)
    for item in rest:
        key, sep, value = item.partition("=")
        if name not in PARAMS or key not in PARAMS[name]:
            allowed = ", ".join(PARAMS.get(name, ())) or "none"
            raise UserError(f"workload {spec!r}: {name!r} takes no parameter {key!r} (its "
                            f"parameters: {allowed})")
        if key in TEXT_PARAMS:
            if not value:
                raise UserError(f"workload {spec!r}: {key} is empty")
            params[key] = value
            continue
        try:
            v = float(value) if key in FLOAT_PARAMS else int(value)
        except ValueError:
            raise UserError(f"workload {spec!r}: {key} must be "
                            f"{'a number' if key in FLOAT_PARAMS else 'an integer'}, got "
                            f"{value!r}") from None
        if key in FLOAT_PARAMS:
            if not (sep and 0 <= v < 1):
                raise UserError(f"workload {spec!r}: {key} must be a number in [0, 1), got "
                                f"{value!r}")
        elif not sep or not (0 if key in ZERO_OK else 1) <= v <= MAX_PARAM:
            raise UserError(f"workload {spec!r}: {key} must be an integer from "
                            f"{0 if key in ZERO_OK else 1} to {MAX_PARAM}, got {value!r}")
        params[key] = v
    return name, params


def shared_fraction_problem(spec: str, fraction) -> str | None:
    """What is wrong with sizing `spec`'s shared prefix at `fraction` (None: nothing): the
    one check of the simulator's setting and of load_workload."""
    if isinstance(fraction, bool) or not (isinstance(fraction, (int, float))
                                          and 0 <= fraction <= 1):
        return "must be a number from 0 to 1"
    if spec.split(":")[0] not in SHARED_SPLIT:
        return (f"sizes the shared prefix of {' or '.join(SHARED_SPLIT)}; workload {spec!r} "
                "has no shared prefix to size")
    return None


def shared_split(spec: str, fraction: float) -> dict:
    """The prefix and suffix lengths of a workload with shared prefixes at a shared fraction
    of its prompt (SHARED_SPLIT), from its spec's own lengths or the defaults."""
    import inspect
    why = shared_fraction_problem(spec, fraction)
    if why:
        raise UserError(f"shared fraction {fraction!r}: {why}")
    name, params = parse_spec(spec)
    shared, rest = SHARED_SPLIT[name]
    defaults = inspect.signature(BUILTIN[name]).parameters
    length = sum(params.get(key, defaults[key].default) for key in (shared, rest))
    prefix = round(fraction * length)
    return {shared: prefix, rest: length - prefix}


def workload_notes(spec: str, model: str | None) -> list[str]:
    """What a run's workload rests on, one line each: where a ShareGPT file's lengths came
    from (the model's tokenizer, or the estimate; common/datasets.py)."""
    from stepgap.common.datasets import CHARS_PER_TOKEN, find_tokenizer
    name, params = parse_spec(spec) if spec.split(":")[0] in BUILTIN else (spec, {})
    if name != "sharegpt" or "path" not in params:
        return []
    tok, source = find_tokenizer(model, params.get("tokenizer"))
    if tok is not None:
        return [f"{params['path']}: lengths from the tokenizer {source}"]
    return [f"{params['path']}: lengths estimated at {CHARS_PER_TOKEN:g} characters a token: "
            f"{source}"]


def workload_files(spec: str) -> list[str]:
    """The files a workload spec reads: a trace file, or a dataset's file and tokenizer."""
    if spec.split(":")[0] not in BUILTIN:
        return [spec]
    params = parse_spec(spec)[1]
    return [params[k] for k in TEXT_PARAMS if k in params]


def load_workload(spec: str, num_prompts: int | None = None, output_len: int | None = None,
                  seed: int = 0, vocab_size: int | None = None,
                  shared_fraction: float | None = None,
                  model: str | None = None) -> list[TraceRequest]:
    """A built-in workload by name (with its parameters, NAME:KEY=VALUE...), or a trace file in
    the docs/explanation/design.md format.

    `num_prompts` takes the first N requests of a file (cycling if it holds fewer, as the
    benchmark oversamples), and `output_len` overrides every request's output length;
    `vocab_size` bounds the token ids of the built-ins that have them (the target's);
    `shared_fraction` sizes a shared-prefix workload's prefix as that fraction of its prompt
    (shared_split); `model` (its tokenizer) gives a ShareGPT file's lengths and the tokens a
    random dataset's server adds (common/datasets.py).
    """
    name, params = parse_spec(spec) if spec.split(":")[0] in BUILTIN else (spec, {})
    if shared_fraction is not None:
        params = {**params, **shared_split(spec, shared_fraction)}
    if name in BUILTIN:
        kwargs = {"seed": seed, **params}
        if num_prompts is not None:
            kwargs["num_prompts"] = num_prompts
        if output_len is not None:
            kwargs["output_len"] = output_len
        if name in TOKEN_WORKLOADS and vocab_size is not None:
            kwargs["vocab_size"] = vocab_size
        if name == "random":   # the tokens the server adds (the model's tokenizer's)
            from stepgap.common.datasets import special_tokens
            kwargs["special_tokens"] = special_tokens(model, kwargs.pop("tokenizer", None))
        elif name == "sharegpt":
            kwargs["model"] = model
        return BUILTIN[name](**kwargs)
    if not Path(spec).exists():
        raise UserError(f"unknown workload {spec!r}: expected one of {', '.join(BUILTIN)} "
                        "or a trace file (JSON lines, or a `vllm bench serve` result)")
    from stepgap.common.peer_run import is_peer_requests, load_peer_trace
    if spec.endswith(".json"):   # a vllm bench serve result: the trace it served
        from stepgap.common.vllm_bench import bench_requests, read_bench
        reqs = bench_requests(read_bench(spec), spec)
    elif is_peer_requests(spec):   # a vLLM run's requests.jsonl (common/peer_run.py)
        reqs = load_peer_trace(spec)
    else:
        reqs = load_trace(spec)
    if num_prompts is not None:
        reqs = cycle(reqs, num_prompts)
    if output_len is not None:
        reqs = [replace(r, output_len=output_len, accepted=None) for r in reqs]
    return reqs


def cycle(reqs: list[TraceRequest], n: int) -> list[TraceRequest]:
    """The first n requests, cycling through the trace if it holds fewer, as the benchmark
    oversamples. A repeat is named ID#i (i its place in the run), with '#' added until the name
    is one the trace does not hold (a trace may have ids `a` and `a#2`)."""
    out, taken = [], {r.request_id for r in reqs}
    for i in range(n):
        r = reqs[i % len(reqs)]
        if i >= len(reqs):
            rid = f"{r.request_id}#{i}"
            while rid in taken:
                rid += "#"
            taken.add(rid)
            r = replace(r, request_id=rid)
        out.append(r)
    return out


def last_arrival_problem(n: int, request_rate: float) -> str | None:
    """What is wrong with sending `n` requests at `request_rate` (None: nothing): the last
    would arrive after MAX_ARRIVAL_S (common/limits.py)."""
    if n / request_rate <= MAX_ARRIVAL_S:
        return None
    return (f"sends the last of {n} requests at {n / request_rate:.3g} s, after "
            f"{MAX_ARRIVAL_S:g} s; give a rate of at least {n / MAX_ARRIVAL_S:.3g} req/s")


def arrival_times(n: int, request_rate: float, burstiness: float = 1.0,
                  seed: int = 0) -> list[float]:
    """Send times of `vllm bench serve`: gamma intervals (shape = burstiness, mean = 1/rate),
    rescaled so the last arrival is at n / rate. An infinite rate sends everything at once."""
    if not request_rate > 0:
        raise UserError(f"--request-rate must be > 0 (or inf), got {request_rate}")
    if not burstiness >= MIN_BURSTINESS:
        raise UserError(f"--burstiness must be at least {MIN_BURSTINESS:g}, got {burstiness}")
    why = last_arrival_problem(n, request_rate)
    if why:
        raise UserError(f"--request-rate {request_rate:g}: {why}")
    if math.isinf(request_rate):
        return [0.0] * n
    if math.isinf(burstiness):
        delays = np.full(n, 1.0 / request_rate)
    else:
        rng = np.random.default_rng(seed)
        delays = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n)
    t = np.cumsum(delays)
    if t[-1] > 0:
        t *= (n / request_rate) / t[-1]
    if not np.isfinite(t).all():
        raise UserError(f"--request-rate {request_rate:g} with --burstiness {burstiness:g}: "
                        "the arrival times are not finite numbers; give a burstiness nearer 1")
    return [float(x) for x in t]


def apply_request_rate(reqs: list[TraceRequest], request_rate: float | None,
                       burstiness: float = 1.0, seed: int = 0) -> list[TraceRequest]:
    """Replace arrival times by the rate's (None keeps the trace's own arrival times)."""
    if request_rate is None:
        return sorted(reqs, key=lambda r: r.arrival_s)
    times = arrival_times(len(reqs), request_rate, burstiness, seed)
    return [replace(r, arrival_s=t) for r, t in zip(reqs, times)]


class LoadGenerator:
    """The benchmark client: sends requests in arrival order, at most `max_concurrency` at once.

    A request is sent at max(its arrival time, the time a slot frees), in order; its TTFT and
    E2EL are measured from that send time, as `vllm bench serve` measures them.
    """

    def __init__(self, requests: list[TraceRequest], max_concurrency: int | None = None):
        if max_concurrency is not None and max_concurrency < 1:
            raise UserError(f"--max-concurrency must be >= 1, got {max_concurrency}")
        self.pending = deque(sorted(requests, key=lambda r: r.arrival_s))
        self.max_concurrency = max_concurrency
        self.in_flight = 0

    def _slot_free(self) -> bool:
        return self.max_concurrency is None or self.in_flight < self.max_concurrency

    def next_arrival(self) -> float | None:
        """Arrival time of the next request that could be sent now, or None if none can."""
        if self.pending and self._slot_free():
            return self.pending[0].arrival_s
        return None

    def pop_due(self, now: float) -> list[TraceRequest]:
        """Send every request that has arrived by `now`, while slots are free."""
        sent = []
        while self.pending and self._slot_free() and self.pending[0].arrival_s <= now:
            sent.append(self.pending.popleft())
            self.in_flight += 1
        return sent

    def complete(self) -> None:
        """A request's last chunk arrived: its slot is free."""
        self.in_flight -= 1

    @property
    def done(self) -> bool:
        return not self.pending and self.in_flight == 0
