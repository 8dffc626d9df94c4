"""How many drafts the target accepts: per-position rates with per-request variation, or replay.

Rates are vLLM's per-position acceptance rates: the fraction of drafts whose position i was
accepted, so they are cumulative and non-increasing. Sampling uses the conditional rates
c_i = r_i / r_{i-1}: position i is accepted with probability c_i once position i-1 was.

Requests differ: on MT-bench, code and extraction are easy to draft, creative writing is not. Each
request gets a quality z ~ N(0, spread) that shifts every conditional rate on the logit scale,
logit(c_i,r) = logit(c_i) + z_r. The z_r are stratified (the normal quantiles of the request count,
in a seeded order), so a run of 80 requests holds the same spread of qualities whatever the seed.
The profile's rates are thus those of the median request. docs/explanation/acceptance.md says where
the `mtbench` numbers come from.

Replay: a trace line's `accepted` list gives the accepted count of each decode step of that
request, in order; the i-th decode step with drafts uses accepted[i]. A count above k is an
error (`check_replay`), never clipped: it was recorded at another depth. A step that verified
fewer than k drafts (the request's last tokens) accepts at most those. Past the end of the list
the rates take over.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from stepgap.common.errors import UserError, shown
from stepgap.common.formats import TraceRequest
from stepgap.common.limits import is_finite, is_number
from stepgap.common.speculation import BY_NGRAM, BY_SUFFIX, METHODS


@dataclass(frozen=True, slots=True)
class AcceptanceProfile:
    name: str
    rates: tuple[float, ...]   # cumulative per-position acceptance (vLLM's definition)
    spread: float = 0.0        # std of the per-request logit shift
    source: str = ""

    def __post_init__(self):
        rates = tuple(self.rates)
        object.__setattr__(self, "rates", rates)
        # Custom rates come from an option (their source): errors name it.
        who = self.source if self.name == "custom" and self.source else \
            f"acceptance profile {self.name!r}"
        if not rates:
            raise UserError(f"{who}: rates must not be empty")
        prev = 1.0
        for i, r in enumerate(rates):
            if not is_number(r) or not 0.0 <= r <= 1.0:
                raise UserError(f"{who}: position {i} must be in [0, 1], got {r!r}")
            if r > prev + 1e-12:
                raise UserError(f"{who}: position {i} ({r}) exceeds position {i - 1} ({prev}); "
                                "vLLM's per-position acceptance rates are cumulative, so they "
                                "cannot increase")
            prev = r
        if not (is_finite(self.spread) and self.spread >= 0):
            raise UserError(f"acceptance spread must be a number >= 0, got {shown(self.spread)}")

    def conditional(self, k: int) -> list[float]:
        """P(accept position i | position i-1 accepted), for i < k; the last rate repeats."""
        out, prev = [], 1.0
        for r in self.rates:
            out.append(r / prev if prev > 0 else 0.0)
            prev = r
        while len(out) < k:
            out.append(out[-1])
        return out[:k]

    def acceptance_length(self, k: int) -> float:
        """1 + expected accepted drafts per step for the median request."""
        return 1.0 + float(sum(np.cumprod(self.conditional(k))))

    def shifted(self, d: float, k: int) -> tuple[float, ...]:
        """The rates to depth k with every conditional rate shifted by d on the logit scale."""
        rates, prev = [], 1.0
        for c in self.conditional(k):
            c = 0.0 if c <= 0 else 1.0 if c >= 1 else 1 / (1 + math.exp(-(_logit(c) + d)))
            prev *= c
            rates.append(prev)
        return tuple(rates)

    def shift_for(self, ratio: float, k: int = 3) -> float:
        """The logit shift that makes the acceptance length at depth k `ratio` x this one's
        (within +-6)."""
        if ratio == 1.0:
            return 0.0
        target = self.acceptance_length(k) * ratio
        lo, hi = -6.0, 6.0
        for _ in range(50):   # the length grows with the shift: bisect
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if 1.0 + sum(self.shifted(mid, k)) < target else (lo, mid)
        return (lo + hi) / 2

    @classmethod
    def from_length(cls, name: str, length: float, k: int, source: str = "") -> AcceptanceProfile:
        """Rates r_i = c^i whose acceptance length at depth k is `length`: where only the mean
        was published, the conditional rate c is assumed the same at every position."""
        if not 1.0 <= length <= 1.0 + k:
            raise UserError(f"acceptance profile {name!r}: length {length} is outside 1..{1 + k}")
        lo, hi = 0.0, 1.0
        for _ in range(60):   # 1 + c + ... + c^k grows with c: bisect
            c = (lo + hi) / 2
            lo, hi = (c, hi) if 1.0 + sum(c ** i for i in range(1, k + 1)) < length else (lo, c)
        c = (lo + hi) / 2
        return cls(name, tuple(round(c ** i, 4) for i in range(1, k + 1)), 0.0, source)


PROFILES: dict[str, AcceptanceProfile] = {p.name: p for p in (
    # vLLM issue #26191: Llama-3.1-8B-Instruct + yuhuili EAGLE3 head, MT-bench (80 prompts),
    # temperature 0, k=7. The spread is fitted on the seed's sync P99 TPOT
    # (docs/explanation/acceptance.md).
    AcceptanceProfile("mtbench", (0.74, 0.54, 0.41, 0.31, 0.23, 0.17, 0.13), spread=0.50,
                      source="vLLM #26191 (rates); spread fitted on vLLM #25872 sync P99 TPOT"),
    AcceptanceProfile("none", (0.0,), source="every draft rejected"),
    AcceptanceProfile("full", (1.0,), source="every draft accepted"),
    # vLLM's acceptance-length regression test (tests/v1/spec_decode/test_acceptance_length.py):
    # MT-bench, 80 prompts, 256 output tokens, temperature 0, k=3, the RedHatAI heads; and its
    # MTP entry, DeepSeek-V3 FP8 at TP 8, k=1, acceptance length 1.882.
    AcceptanceProfile("vllm-llama-3.1-8b-eagle3", (0.7296, 0.5208, 0.3545),
                      source="vLLM test_acceptance_length.py: Llama-3.1-8B-Instruct + RedHatAI "
                             "EAGLE-3, MT-bench, T=0, k=3"),
    AcceptanceProfile("vllm-qwen3-8b-eagle3", (0.6541, 0.3993, 0.2020),
                      source="vLLM test_acceptance_length.py: Qwen3-8B + RedHatAI EAGLE-3, "
                             "MT-bench, T=0, k=3"),
    AcceptanceProfile("vllm-gpt-oss-20b-eagle3", (0.7165, 0.5120, 0.3337),
                      source="vLLM test_acceptance_length.py: gpt-oss-20b + RedHatAI EAGLE-3, "
                             "MT-bench, T=0, k=3"),
    AcceptanceProfile("vllm-deepseek-v3-mtp", (0.882,),
                      source="vLLM test_acceptance_length.py: DeepSeek-V3 MTP, MT-bench, T=0, "
                             "k=1, acceptance length 1.882"),
    # Mean acceptance lengths of yuhuili's Llama-3.1-8B EAGLE-3 head at k=7, temperature 1, by
    # dataset (the nebius/EAGLE3-Llama-3.3-70B-Instruct model card's comparison table); rates
    # from the length with one conditional rate at every position.
    *(AcceptanceProfile.from_length(
        f"nebius-llama-3.1-8b-eagle3-{ds}", al, 7,
        source=f"nebius/EAGLE3-Llama-3.3-70B-Instruct model card: yuhuili "
               f"EAGLE3-LLaMA3.1-Instruct-8B, {ds}, T=1, k=7, acceptance length {al}; "
               "geometric rates")
      for ds, al in (("mtbench", 2.77), ("humaneval", 3.49), ("gsm8k", 3.34))),
    # yuhuili's EAGLE (-1) head for Llama-3.1-8B on MT-bench: the rates are the differences of
    # the acceptance lengths at k = 2..7 of vLLM #20780 (2.10, 2.29, 2.39, 2.43, 2.45, 2.47; a
    # chain's rates do not depend on k), the first from vLLM #24343's length at k = 1 (1.71)
    AcceptanceProfile("vllm-llama-3.1-8b-eagle", (0.71, 0.39, 0.19, 0.10, 0.04, 0.02, 0.02),
                      spread=0.50, source="vLLM #20780 (lengths at k = 2..7) and #24343 (k = 1):"
                                          " Llama-3.1-8B + yuhuili EAGLE, MT-bench"),
    # n-gram matching (prompt_lookup_min 3, max 7) on Llama-3.1-8B-Instruct's outputs, greedy,
    # per step (steps without a match count as none accepted): SpecDecode-Bench's published
    # per-token profile (arXiv:2601.11580; bench/published/acceptance.md section 1)
    *(AcceptanceProfile(f"sdb-ngram-{ds}", rates,
                        source=f"SpecDecode-Bench's Llama-3.1-8B profile, n-gram on {title}, "
                               f"k = {len(rates)} (bench/published/acceptance.md)")
      for ds, title, rates in (
          ("sharegpt", "ShareGPT", (0.132, 0.101, 0.083, 0.072, 0.063)),
          ("cnndailymail", "CNN/DailyMail", (0.123, 0.089, 0.068, 0.054, 0.043)),
          ("gsm8k", "GSM8K", (0.078, 0.044, 0.026, 0.017, 0.012)),
          ("instructcoder", "InstructCoder",
           (0.263, 0.231, 0.214, 0.201, 0.189, 0.182, 0.168)))),
    # suffix decoding on MT-bench at k = 1 (vLLM #24852's test: acceptance at token 0 0.62)
    AcceptanceProfile("vllm-suffix-mtbench", (0.62,),
                      source="vLLM #24852: suffix decoding, MT-bench, k = 1, acceptance 0.62"),
)}
# The published profile of each (model preset, method); others fall back to `mtbench`.
PUBLISHED = {("llama-3.1-8b", "eagle3"): "mtbench",
             ("llama-3.1-8b", "eagle"): "vllm-llama-3.1-8b-eagle",
             ("qwen3-8b", "eagle3"): "vllm-qwen3-8b-eagle3",
             ("gpt-oss-20b", "eagle3"): "vllm-gpt-oss-20b-eagle3",
             ("deepseek-v3", "mtp"): "vllm-deepseek-v3-mtp"}


def default_profile(model: str, method: str) -> tuple[str, str | None]:
    """The acceptance profile of a model and method: the published one, or `mtbench` (with a
    note saying that it stands in)."""
    name = PUBLISHED.get((model, method))
    if name is not None:
        return name, None
    return "mtbench", (f"acceptance: no published profile for {model} with method {method}; "
                       "using mtbench (Llama-3.1-8B + EAGLE-3, vLLM #26191); give --acceptance "
                       "or --acceptance-rates")


# -- by dataset ---------------------------------------------------------------------------------
# What `vllm bench serve` sends, and what each dataset does to acceptance
# (bench/published/acceptance.md has every number and its source). For a drafter model (EAGLE,
# EAGLE-3, MTP, a draft model): its acceptance length at k = 3 as a ratio of its own on MT-bench,
# (nominal, low, high), applied as one logit shift of every conditional rate; for n-gram
# matching, the dataset's own profile and a ratio range around it. The range is the band's
# (sim/bands.py): the published spread for that dataset, wide where the evidence is thin.
@dataclass(frozen=True)
class DatasetAcceptance:
    name: str
    ratio: tuple[float, float, float]        # a drafter model's AL at k = 3 / MT-bench's
    source: str
    ngram: str                               # the n-gram profile of this dataset
    ngram_ratio: tuple[float, float, float]  # around it
    ngram_source: str


SDB = "SpecDecode-Bench's Llama-3.1-8B profile (vLLM 0.10.1, greedy)"
DATASETS: dict[str, DatasetAcceptance] = {d.name: d for d in (
    DatasetAcceptance(
        "mtbench", (1.0, 0.96, 1.08),
        "MT-bench itself: the Llama-3.1-8B EAGLE-3 heads' lengths at k = 3 from 2.61 (vLLM CI) "
        "to 2.79 (vLLM #20780), #26191's 2.69 between; the simulated mean over requests runs "
        "about 3 % under a profile's own length (its rates are the median request's)",
        "sdb-ngram-sharegpt", (1.0, 0.95, 1.25),
        "chat: TensorRT-LLM's n-gram on Magpie first turns 1.37-1.40, second turns 1.66-1.77 "
        "(tech blog 7), against ShareGPT's 1.40 (SpecDecode-Bench)"),
    DatasetAcceptance(
        "sharegpt", (0.98, 0.83, 1.02),
        f"{SDB}: ShareGPT 2.25 against EAGLE's 2.29 on MT-bench (vLLM #20780); SPEED-Bench's "
        "writing domain 0.83 x its mean",
        "sdb-ngram-sharegpt", (1.0, 0.95, 1.05),
        f"{SDB}; TensorRT-LLM's Magpie chat 1.37-1.40 against its 1.40 at k = 3"),
    DatasetAcceptance(
        "code", (1.03, 0.83, 1.26),
        f"{SDB}: InstructCoder 2.35 against 2.29; HumanEval 0.98 x MT-bench (gpt-oss-20b, "
        "P-EAGLE blog) to 1.26 x (nebius model card, T = 1, k = 7); SPEED-Bench's long-output "
        "coding 0.83 x MT-bench (P-EAGLE blog)",
        "sdb-ngram-instructcoder", (1.0, 0.8, 1.2),
        f"{SDB}: InstructCoder (code editing, where copying pays); code generation copies less"),
    DatasetAcceptance(
        "math", (1.04, 1.0, 1.21),
        f"{SDB}: GSM8K 2.39 against 2.29; GSM8K 1.21 x MT-bench (nebius model card, T = 1); "
        "SPEED-Bench's math domain 1.12 x its mean",
        "sdb-ngram-gsm8k", (1.0, 0.95, 1.1), f"{SDB}: GSM8K"),
    DatasetAcceptance(
        "summarization", (1.02, 0.98, 1.06),
        f"{SDB}: CNN/DailyMail 2.33 against 2.29; SPEED-Bench's summarisation 1.02 x its mean",
        "sdb-ngram-cnndailymail", (1.0, 0.95, 1.1), f"{SDB}: CNN/DailyMail"),
    DatasetAcceptance(
        "long", (1.0, 0.7, 1.02),
        "long context: MiniMax-M3's EAGLE-3 head 2.69 at 1K to 2.65 at 32K input (AMD's "
        "SPEED-Bench run); a head trained on short sequences falls (P-EAGLE blog), by how much "
        "unpublished: the low end is a guess",
        "sdb-ngram-cnndailymail", (1.0, 0.9, 1.3),
        f"{SDB}: CNN/DailyMail's long prompts stand in; longer contexts hold more to match"),
    DatasetAcceptance(
        "random", (1.0, 0.6, 1.25),
        "random tokens: no published acceptance; SPEED-Bench finds random-token prompts "
        "overestimate speculation's throughput by about 23 % against real ones of the same "
        "lengths; the low end is a guess",
        "sdb-ngram-sharegpt", (1.0, 0.76, 1.3),
        "random tokens: no published n-gram acceptance; ShareGPT's stands in, from nothing "
        "accepted to 1.3 x"),
)}
# Spellings of datasets as benchmarks and papers name them
DATASET_ALIASES = {"mt-bench": "mtbench", "philschmid/mt-bench": "mtbench", "hf": "mtbench",
                   "gsm8k": "math", "aime": "math", "math": "math", "humaneval": "code",
                   "instructcoder": "code", "likaixin/instructcoder": "code",
                   "cnn/dailymail": "summarization", "cnn_dailymail": "summarization",
                   "prefix_repetition": "random", "generated-shared-prefix": "random",
                   "multi-turn": "random", "random (inference-perf)": "random"}
NGRAM_MODEL = "llama-3.1-8b"   # whose outputs the n-gram profiles matched


def workload_dataset(spec: str | None) -> str | None:
    """The dataset a workload spec sends (common/workloads.py): random tokens for the
    generated ones; None for a trace file, whose dataset stepgap cannot tell."""
    from stepgap.common.workloads import BUILTIN
    name = (spec or "").split(":")[0]
    return dataset_name(name) if name in BUILTIN else None


def dataset_name(text: str) -> str | None:
    """A dataset's profile name (DATASETS) from how a benchmark or paper names it; None: not
    one stepgap has."""
    t = text.strip().lower()
    t = DATASET_ALIASES.get(t, t)
    return t if t in DATASETS else None


@dataclass(frozen=True)
class AcceptanceChoice:
    """A run's default acceptance: the profile (its rates shifted to the dataset), what it
    was borrowed from, and the band's logit shifts around it (low, high)."""
    profile: AcceptanceProfile
    dataset: str
    borrowed: bool                 # another model's or method's profile stands in
    band: tuple[float, float]      # the dataset's published spread, as logit shifts
    note: str | None
    band_source: str


@functools.cache   # (every plan asks it: advise's hundreds of runs, a few answers)
def dataset_acceptance(model: str, method: str, dataset: str) -> AcceptanceChoice:
    """The acceptance of `model` with `method` on `dataset` (DATASETS): n-gram matching takes
    the dataset's own profile; suffix decoding its MT-bench one; a drafter model its published
    MT-bench profile (else `mtbench`, borrowed), shifted on the logit scale to the dataset's
    length ratio. The band is the dataset's range, as shifts of that profile. Frozen,
    computed once a (model, method, dataset)."""
    d = DATASETS[dataset]
    note, model_of = None, METHODS[method].acceptance
    if model_of == BY_NGRAM:   # (the profiles are Llama-3.1-8B's outputs matched)
        base, (nom, lo, hi), src = PROFILES[d.ngram], d.ngram_ratio, d.ngram_source
        borrowed = model != NGRAM_MODEL
    elif model_of == BY_SUFFIX:
        base, borrowed = PROFILES["vllm-suffix-mtbench"], dataset != "mtbench"
        (nom, lo, hi), src = (1.0, 1.0, 1.0), PROFILES["vllm-suffix-mtbench"].source
    else:
        name, note = default_profile(model, method)
        base, borrowed = PROFILES[name], note is not None
        (nom, lo, hi), src = d.ratio, d.source
    shift = base.shift_for(nom)
    prof = base if shift == 0.0 else AcceptanceProfile(
        f"{base.name}@{dataset}", base.shifted(shift, max(3, len(base.rates))), base.spread,
        f"{base.source}; shifted to {dataset} (length x {nom:g} at k = 3: {src})")
    band = (base.shift_for(lo) - shift, base.shift_for(hi) - shift)
    return AcceptanceChoice(prof, dataset, borrowed, band, note, src)


FILE_FORMAT = "stepgap-acceptance/1"


def get_profile(name: str) -> AcceptanceProfile:
    """A named profile, or a measured acceptance file (`stepgap ingest vllm-metrics` writes
    them; a bench file with vLLM's spec_decode_* counters is one too)."""
    if name in PROFILES:
        return PROFILES[name]
    from pathlib import Path
    if not Path(name).is_file():
        raise UserError(f"acceptance: unknown profile {name!r} (known: {', '.join(PROFILES)}; "
                        "or an acceptance file, or give --acceptance-rates)")
    return load_profile_file(name)


def load_profile_file(path) -> AcceptanceProfile:
    """The acceptance a user measured: a file of `stepgap ingest vllm-metrics` ({"format":
    "stepgap-acceptance/1", "rates": [...], ...}), or a `vllm bench serve --save-result` file
    whose spec_decode_* counters vLLM wrote (its per-position rates). Named by its path, so that
    it is never taken for a borrowed profile (sim/bands.py)."""
    from stepgap.common.errors import where
    from stepgap.common.fileio import read_json
    from stepgap.common.vllm_bench import check_bench, is_bench
    doc = read_json(path)
    if is_bench(doc):
        check_bench(doc, path)
        rates = doc.get("spec_decode_per_position_acceptance_rates")
        if not rates or not doc.get("spec_decode_num_drafts"):
            raise UserError(f"{where(path, field='spec_decode_per_position_acceptance_rates')}: "
                            "missing: this bench file holds no acceptance (vLLM writes its "
                            "spec_decode_* counters when the server speculates; else scrape "
                            "/metrics around a run: stepgap ingest vllm-metrics)")
        return AcceptanceProfile(str(path), tuple(rates), 0.0,
                                 f"{path}: spec_decode_per_position_acceptance_rates (vLLM's "
                                 f"counters around the run, {doc['spec_decode_num_drafts']:,} "
                                 "drafts)")
    if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
        raise UserError(f"{where(path, field='format')}: expected {FILE_FORMAT!r} (a file of "
                        "`stepgap ingest vllm-metrics`) or a `vllm bench serve --save-result` "
                        "file with spec_decode_* counters")
    rates = doc.get("rates")
    if not isinstance(rates, list) or not rates:
        raise UserError(f"{where(path, field='rates')}: expected per-position rates")
    return AcceptanceProfile(str(path), tuple(rates), float(doc.get("spread", 0.0)),
                             doc.get("source", str(path)))


def check_replay(requests: list[TraceRequest], k: int) -> None:
    """Every recorded accepted count is one that k drafts allow: 0..k."""
    if k == 0:
        return   # nothing is drafted: the counts are not used
    for r in requests:
        bad = next(((i, a) for i, a in enumerate(r.accepted or ()) if a > k), None)
        if bad is not None:
            raise UserError(f"request {r.request_id!r}: field 'accepted': decode step {bad[0]} "
                            f"accepted {bad[1]} drafts, more than k = {k} (recorded at another "
                            "depth? replay it at its own k)")


class _Seeded(np.random.bit_generator.ISeedSequence):
    """A seed sequence whose state is known: `pcg64_seeds`'s row for one request."""

    __slots__ = ("state",)

    def __init__(self, state: np.ndarray):
        self.state = state

    def generate_state(self, n_words: int, dtype=np.uint32) -> np.ndarray:
        assert n_words == 4 and dtype == np.uint64   # (PCG64's call: the one that was found)
        return self.state


def pcg64_seeds(entropy: np.ndarray) -> np.ndarray:
    """For each row of `entropy` (uint32 words, at most 4 a row), the PCG64 seed that numpy's
    `SeedSequence(row).generate_state(4, np.uint64)` gives, for all rows at once: numpy seeds
    one generator in 10-20 us, mostly this, and a run seeds one per request.

    The algorithm is SeedSequence's (numpy/random/bit_generator.pyx, from O'Neill's seed_seq_fe):
    hash the words into a pool of 4, mix every pool word into every other, then hash the pool
    out into 8 words. Its multipliers run the same for every row, so each step is one array
    operation (uint32, wrapping). tests/test_paths.py holds it to numpy's own."""
    init_a, mult_a, init_b, mult_b, mix_l, mix_r = (
        0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED, 0xCA01F9DD, 0x4973F715)
    mask = 0xFFFFFFFF
    rows, width = entropy.shape
    assert width <= 4
    h = init_a

    def hashed(v: np.ndarray) -> np.ndarray:   # (advances the multiplier h)
        nonlocal h
        v = v ^ np.uint32(h)
        h = h * mult_a & mask
        v *= np.uint32(h)
        return v ^ v >> np.uint32(16)

    def mixed(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        v = x * np.uint32(mix_l) - y * np.uint32(mix_r)
        return v ^ v >> np.uint32(16)

    zero = np.zeros(rows, np.uint32)
    pool = [hashed(entropy[:, i] if i < width else zero) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mixed(pool[dst], hashed(pool[src]))
    out = np.empty((rows, 8), np.uint32)
    h = init_b
    for i in range(8):
        v = pool[i % 4] ^ np.uint32(h)
        h = h * mult_b & mask
        v *= np.uint32(h)
        out[:, i] = v ^ v >> np.uint32(16)
    return out.astype("<u4").view("<u8").astype(np.uint64)   # (word pairs, low first)


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


class Acceptance:
    """Accepted draft counts for a run: drawn per request ahead of time, consumed in order."""

    BLOCK = 64  # decode steps drawn at a time

    def __init__(self, profile: AcceptanceProfile, k: int, requests: list[TraceRequest],
                 seed: int, replay: bool = True):
        self.k = k
        self.cond = profile.conditional(k) if k else []
        self.seed = seed
        self.spread = profile.spread
        self.index = {r.request_id: i for i, r in enumerate(requests)}
        if replay:
            check_replay(requests, k)
        self.recorded = {r.request_id: r.accepted for r in requests
                         if replay and r.accepted is not None}
        # request id -> [counts, next index, its generator, its rates, the id]: the recorded
        # counts first, then its own stream, BLOCK steps at a time (a list and an index: the
        # simulator draws one per request per step)
        self._state: dict[str, list] = {}
        self._seeds = None   # each request's PCG64 seed (`_generator`), once one is asked for
        self._rates = None   # each request's rates (`rates`), once they are asked for

    def qualities(self) -> list[float]:
        """Each request's quality z, in trace order: the spread's normal quantiles at
        (j + 1/2) / n, dealt out in a seeded order."""
        n, spread, nd = len(self.index), self.spread, NormalDist()
        order = np.random.default_rng([self.seed, 2]).permutation(n).tolist()
        return [spread * nd.inv_cdf((o + 0.5) / n) if spread else 0.0 for o in order]

    def rates(self) -> np.ndarray:
        """Every request's conditional rates after its quality shift, a row each (found for all
        at the first call): each rate's logit shifted by the request's quality."""
        if self._rates is None:
            logits = [_logit(c) if 0.0 < c < 1.0 else None for c in self.cond]
            rows = [[c if lc is None or z == 0.0 else 1.0 / (1.0 + math.exp(-(lc + z)))
                     for c, lc in zip(self.cond, logits)] for z in self.qualities()]
            self._rates = np.array(rows, float).reshape(len(rows), len(self.cond))
        return self._rates

    def rates_for(self, request_id: str) -> np.ndarray:
        """The conditional rates of one request, after its quality shift."""
        return self.rates()[self.index[request_id]]

    def _generator(self, request_id: str) -> np.random.Generator:
        """A request's own stream, from its start: numpy's default_rng([seed, 1, its index]),
        seeded from all requests' seeds found at once where the seed is one uint32 word."""
        i = self.index[request_id]
        if type(self.seed) is not int or not 0 <= self.seed < 1 << 32:
            return np.random.default_rng([self.seed, 1, i])
        if self._seeds is None:
            n = len(self.index)
            self._seeds = pcg64_seeds(np.array([[self.seed] * n, [1] * n, range(n)], np.uint32).T)
        return np.random.Generator(np.random.PCG64(_Seeded(self._seeds[i])))

    def _draw(self, state: list) -> list[int]:
        """The next BLOCK counts of a request's own stream."""
        if state[2] is None:
            state[2] = self._generator(state[4])
            state[3] = self.rates_for(state[4])
        k = self.k
        hits = np.zeros((self.BLOCK, k + 1), bool)   # a miss past the last position, so that
        np.less(state[2].random((self.BLOCK, k)), state[3], out=hits[:, :k])
        return hits.argmin(axis=1).tolist()   # the first miss is the count of leading hits

    def first_counts(self, request_ids: list[str], rows: list[int]) -> np.ndarray:
        """The first rows[i] counts of each request's decode steps, as `next` draws them
        (before their min with the drafts verified), request after request in one array: its
        recorded counts, then its own stream (drawn at once, the same counts as BLOCK at a
        time), each request's uniforms compared with its rates as they are drawn. The run's
        own state is left alone: for a run that takes each request's steps whole
        (sim/paths.py)."""
        k = self.k
        hits = np.zeros((sum(rows), k + 1), bool)   # (a miss past the last position)
        drawn = np.empty((max(rows, default=0), k))   # (each request's uniforms in turn)
        recorded_at = []
        rates, a = self.rates(), 0
        for rid, n in zip(request_ids, rows):
            recorded = self.recorded.get(rid)
            if recorded:   # (a replay: its recorded counts first, then its stream)
                got = np.array(recorded[:n], np.int64)
                state = [None, 0, None, None, rid]
                while len(got) < n:
                    got = np.concatenate((got, self._draw(state)))[:n]
                recorded_at.append((a, got))
            else:
                u = self._generator(rid).random((n, k), out=drawn[:n])
                np.less(u, rates[self.index[rid]], out=hits[a:a + n, :k])
            a += n
        counts = hits.argmin(axis=1)   # the first miss is the count of leading hits
        for a, got in recorded_at:
            counts[a:a + len(got)] = got
        return counts

    def mean_length(self) -> float:
        """1 + the accepted count of a median request's decode step of k drafts."""
        return 1.0 + float(sum(np.cumprod(self.cond))) if self.k else 1.0

    def next(self, request_id: str, num_drafts: int) -> int:
        """Accepted count of this request's next decode step that verified `num_drafts`."""
        state = self._state.get(request_id) or self._start(request_id)
        counts, i = state[0], state[1]
        if i == len(counts):
            counts = state[0] = self._draw(state)
            i = 0
        state[1] = i + 1
        n = counts[i]
        return n if n < num_drafts else num_drafts

    def _start(self, request_id: str) -> list:
        recorded = self.recorded.get(request_id)
        state = self._state[request_id] = [list(recorded) if recorded else [], 0, None, None,
                                           request_id]
        return state

    def finished(self, request_id: str) -> None:
        """Free a finished request's draws."""
        self._state.pop(request_id, None)
