"""What a setting may be: the limits both halves and the command line hold numbers to, and the
one check of each kind of number (an integer, a number, a finite number), so that a `true`, a
`"4"` or a NaN is refused alike everywhere (docs/reference/robustness.md)."""

from __future__ import annotations

import math

# The most a setting may be. Past these a value is a typo (1e308), not a setting: it would
# overflow the simulator's clock, hang the engine or fill the memory (docs/reference/robustness.md).
# The command line (common/options.py), SimConfig (grid files, presets) and EngineArgs hold
# their fields to the same limits.
MAX_US = 1e9              # an op's cost or a latency in microseconds: 1000 s
MAX_MS = MAX_US / 1e3     # the same in milliseconds
MAX_SCALE = 1e6           # a multiplier of every cost (--cpu-scale, --speed)
MIN_SPEED = 1 / MAX_SCALE # the machine's level (--speed): 1e-300 would make every cost 0
MAX_SPREAD = 100.0        # a logit-scale spread of acceptance
MAX_SKEW = 10.0           # the Zipf exponent of MoE routing (at 10 the top-k experts take
                          # nearly every token: 64 tokens touch 12 of 128 at top-8)
MAX_K = 64                # draft tokens per step
MAX_PROMPTS = 1_000_000   # requests of one run
MAX_PARAM = 1_000_000     # a workload's length parameter, or --output-len (tokens)
# An arrival after 1e6 s (11.6 days) would have the engine sleep that long and the simulator's
# clock lose its microseconds: a trace's arrival_s, and num_prompts / --request-rate, the last
# arrival of a rate (1e-20 req/s: a client whose hold rounds to 0 and spins forever).
MAX_ARRIVAL_S = 1e6
# The gamma shape of inter-arrival times (--burstiness): below 0.01 its draws underflow to 0
# (at 1e-3, 34 of 80 intervals; at 1e-6 every one), so every request would arrive at once.
MIN_BURSTINESS = 0.01
# Prompt tokens a generated workload may hold (common/workloads.py, whose generators hold them as
# Python lists: at this limit 0.57 GB where prompts share prefixes, 1.99 GB where none do,
# measured), so that sessions x turns or prompts
# x prefix length are refused before they are built (gsp's defaults hold 1.8 million).
MAX_WORKLOAD_TOKENS = 50_000_000
# What a .gz input may decompress to (common/fileio.py gunzip): 1 GiB, 75 times the largest
# input read so far (a vLLM torch-profiler trace of a CPU benchmark run, 13 MB), and what a
# 4 GB machine can still hold while it reads it. A gzip bomb (3 GB of zeros in 3 MB) stops there.
MAX_DECOMPRESSED_BYTES = 1 << 30
# How deeply a YAML file (LLMServingSim's meta.yaml and hardware.yaml, a GPU file) may nest its
# mappings and lists: theirs nest 4 deep; PyYAML builds a document recursively, and 20,000
# levels overflowed its stack (common/fileio.py read_yaml counts them before it builds).
MAX_YAML_DEPTH = 100
# How many values a YAML file may hold once its aliases are expanded: PyYAML writes aliases
# (`&id001` ... `*id001`) in LLMServingSim's hardware.yaml, and a "billion laughs" file of nine
# aliases of ten expands to 10^9 (building it is cheap, but printing or walking it ran past a
# minute). The largest committed one (RTXPRO6000's hardware.yaml) holds 3,307; 1 M is the
# limit (common/fileio.py read_yaml counts them on the event stream).
MAX_YAML_NODES = 1_000_000
# The load points of one `stepgap advise` question (its concurrencies x its rates): each is a
# column of sync cells and one of async and zero-bubble cells at every k, and their bands'
# searches. The default question's six loads run 340 simulations
# (docs/reports/2026-12-03-advise-speed.md): 100 loads are about 5,700, hours of simulation; a
# list of 3,000 would be 170,000.
MAX_LOADS = 100
# The bench files one `stepgap calibrate` fits: every fit step simulates every run (each of up
# to 250 prompts, calibrate/bench_fit.py MAX_FIT_PROMPTS), dozens of steps, and keeps each run's
# recorded steps; 1,000 files held 3.7 GB and ran past 240 s to a MemoryError (issue 55). One
# run of 80 prompts took 10.2 s to fit (calibrate/bench_fit.py), so 100 runs are about 17 min.
MAX_BENCH_FILES = 100
# The cells of one sweep grid: each is validated before any runs (0.3 ms a cell, 10,000 cells in
# 3 s for `stepgap sweep --preset seed-l20 --grid max_num_seqs=1..100 --grid
# max_concurrency=1..100 --dry-run`), then simulated (0.1-1 s a cell). 100,000 cells is half a
# minute of checks and hours of simulation; two axes of 10,000 (1e8 cells) ran past 90 s unchecked.
MAX_GRID_CELLS = 100_000
# The longest field of a CSV file (a perf bundle's tables, a peer run's timeseries.csv): Python's
# csv module's own limit (csv.field_size_limit), named here so that a field past it is one line
# naming the file and line (common/fileio.py csv_rows), not the module's exception.
MAX_CSV_FIELD = 131_072
# GPUs of one node running one model replica (--tensor-parallel-size, a perf bundle's
# tp_degrees): multi-node parallelism is not modelled.
MAX_TP = 8
# A token count of one sequence or one step, and a KV cache's blocks or a block's tokens
# (--max-model-len, --max-num-batched-tokens, --block-size, --num-gpu-blocks-override): 2^24,
# 16.8 M, past the longest context any served model has (10 M tokens). A --block-size of 400
# digits overflowed the KV cache's sizing (a float); the others ran with exit 0.
MAX_TOKENS = 1 << 24
# The most requests one step may hold (--max-num-seqs): a run's requests (MAX_PROMPTS).
# A count on a measured table's grid (tokens, sequences, a prefill chunk, decodes, a KV history:
# sim/tables.py): 2^24, 16.8 M, past the longest context any served model has (10 M tokens); a
# kv_decode of 1e300 made every request fit the tables' KV grid.
MAX_TABLE_COUNT = 1 << 24
# A skew fit's alpha (sim/table_interp.py SkewFit: the share of the gap between the attention at the
# decodes' mean history and at their longest that a mix of unequal histories adds). The
# committed fits' bucket alphas run from -14.0 to 4.3 (buckets of one sample), their pooled
# alpha_default from 0.054 to 0.065; past 100 either way it is a broken fit, not a measurement
# (an alpha of -1e9 made the attention of decodes of unequal histories negative, with exit 0).
MAX_SKEW_ALPHA = 100.0
# A timestamp of vLLM's monotonic clock in a peer run's requests (seconds since the machine
# started; epoch seconds are 1.8e9): at 1e10 a float's step is 1.9 us already, and a
# last_token_ts of 1e308 is a broken recorder, not a run (common/peer_run.py).
MAX_TIMESTAMP_S = 1e10


def is_int(v) -> bool:
    """An integer (not a bool, a float or a string)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v) -> bool:
    """An integer or a float, not a bool (inf and NaN included)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_finite(v) -> bool:
    """A number that is neither inf nor NaN, nor an integer past a float's range (10^400 in a
    JSON or YAML file reads as an int that every reader's float arithmetic overflows on)."""
    try:
        return is_number(v) and math.isfinite(v)
    except OverflowError:
        return False

# `stepgap serve`'s HTTP edge (engine/api_server.py), checked before a body is parsed or a prompt
# tokenized. A request line and headers up to vLLM's h11 limit (H11_MAX_INCOMPLETE_EVENT_SIZE,
# 4 MiB) are read, and a URL past MAX_URL_BYTES is then a 414 (the API takes no query); a body
# past MAX_BODY_BYTES is a 413 before it is read: the longest context a served model has, 128k
# tokens, is a body of about 0.5 MB as text and 1 MB as token ids (a 100 MB prompt aborted the
# server; 10-21 MB ones held its event loop for 34-61 s).
MAX_HTTP_HEAD_BYTES = 4 << 20
MAX_URL_BYTES = 8 << 10
MAX_BODY_BYTES = 16 << 20


def first_repeat(values):
    """The first item of `values` that an earlier one equals (None: each is there once)."""
    return next((x for i, x in enumerate(values) if x in values[:i]), None)
