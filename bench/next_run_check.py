"""Issue 51's targets on a user's path: after the run `stepgap advise` recommends, the band of
what async saves is at most half as wide as before; and the new user's file (200 prompts of
1,024 tokens, no --save-detailed) calibrates with its own prompts, its mean TTFT within 20 %
and its host factor inside its range or warned about.

Two setups, each from the user's first sync run:

- `seed`: vLLM PR #25872's sync row (traces/seed/vllm-pr25872-sync.json: L20, Llama-3.1-8B +
  EAGLE-3, k 4, MT-bench, concurrency 1). The run advise names is the PR's async row where it
  names async at k 4 and concurrency 1 (a real run); else simulated on the host the first
  calibration fitted.
- `h100`: the made-up new user of tests/data/new-user (bench/new_user_files.py: H100, the
  same model, 200 random prompts of 1,024 tokens). The run advise names is made as those files
  were (the same truth, `bench_doc`), wherever it is.

Each: `stepgap calibrate` on the first run, `stepgap advise --profile` (the band before, and
the run it names), that run made, `stepgap calibrate` on both, `stepgap advise --profile` again
(the band after, and the run it names next). Prints the widths and their ratio.

    python bench/next_run_check.py [--setup seed|h100|both] [--noise FRAC] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.cli import main as stepgap  # noqa: E402

MODEL = ["--model", "llama-3.1-8b", "--draft", "llama-3.1-8b-eagle3"]
NOISE = None   # --noise: calibrate's own (1 %) unless given
SETUPS = {
    "seed": dict(gpu="l20", first=ROOT / "traces/seed/vllm-pr25872-sync.json",
                 calibrate=["-k", "4", "--max-concurrency", "1", "--no-enable-prefix-caching",
                            "--max-model-len", "2048", "--dataset-name", "hf",
                            "--dataset-path", "philschmid/mt-bench", "--hf-output-len", "256"],
                 advise=["--trace", "mtbench", "--num-prompts", "80", "--output-len", "256",
                         "--no-enable-prefix-caching", "--max-model-len", "2048",
                         "--max-concurrency", "1"],
                 real={("async", 4, 1): ROOT / "traces/seed/vllm-pr25872-async.json"}),
    "h100": dict(gpu="h100", first=ROOT / "tests/data/new-user/sync-k4-c1.json",
                 calibrate=["-k", "4", "--max-concurrency", "1"],
                 advise=["--dataset-name", "random", "--random-input-len", "1024",
                         "--random-output-len", "128", "--num-prompts", "200",
                         "--max-concurrency", "1"],
                 real={}),
}


def calibrate(files: list, setup: dict, out: Path, same: bool = True) -> Path:
    """`stepgap calibrate` on `files`; `same`: all at the first run's k and concurrency (else
    the later files say theirs, in their --metadata)."""
    args = list(setup["calibrate"])
    if not same:   # the concurrency is each file's own; k too, where the first's differs
        i = args.index("--max-concurrency")
        del args[i:i + 2]
    rc = stepgap(["calibrate", *map(str, files), "--gpu", setup["gpu"], *MODEL, *args,
                  *(["--noise", str(NOISE)] if NOISE else []), "--out", str(out)])
    if rc:
        raise SystemExit(rc)
    return out


def advise(profile: Path, setup: dict, out: Path) -> dict:
    rc = stepgap(["advise", "--profile", str(profile), *MODEL, *setup["advise"], "--max-k", "6",
                  "--result-json", str(out), "--quiet"])
    if rc:
        raise SystemExit(rc)
    return json.loads(out.read_text())


def saving(doc: dict) -> tuple[float, float, float]:
    b = doc["loads"][0]["async_saving"]
    return b["value"], b["low"], b["high"]


def make_run(name: str, setup: dict, run: dict, profile: Path, out: Path) -> Path:
    """The run advise named: the real one where it exists, else made on the setup's truth."""
    key = (run["mode"], run["k"], run["max_concurrency"])
    if key in setup["real"]:   # (with the --metadata a user following docs/explanation/vllm.md adds)
        print(f"   ({name}: the run named is a real one: {setup['real'][key].name})")
        doc = json.loads(setup["real"][key].read_text())
        doc.update({"mode": run["mode"], "num_speculative_tokens": str(run["k"])})
        out.write_text(json.dumps(doc))
        return out
    if name == "h100":
        sys.path.insert(0, str(ROOT / "bench"))
        from new_user_files import bench_doc
        doc = bench_doc(out.name, run["mode"], run["k"], run["max_concurrency"], False)
        doc.update({"mode": run["mode"], "num_speculative_tokens": str(run["k"])})
    else:   # on the host the first calibration fitted (the seed's truth, for all we know)
        from stepgap.sim.config import SimConfig, profile_defaults
        from stepgap.sim.loop import simulate
        settings, _ = profile_defaults({"profile": str(profile), "model": "llama-3.1-8b",
                                        "draft": "llama-3.1-8b-eagle3", "workload": "mtbench",
                                        "num_prompts": 80, "output_len": 256,
                                        "enable_prefix_caching": False, "max_model_len": 2048,
                                        "k": run["k"], "mode": run["mode"],
                                        "max_concurrency": run["max_concurrency"]}, set())
        res = simulate(SimConfig(**settings))[0]
        doc = {"date": "20260101-000000", "backend": "vllm",
               "model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 80,
               "completed": 80, "request_rate": "inf", "burstiness": 1.0,
               "max_concurrency": run["max_concurrency"], "duration": res["duration"],
               "mode": run["mode"], "num_speculative_tokens": str(run["k"]),
               **{m: res[m] for m in ("mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                                      "p99_itl_ms", "mean_ttft_ms")}}
        print(f"   ({name}: the run named is simulated on the first calibration's host)")
    out.write_text(json.dumps(doc))
    return out


def check(name: str, out: Path) -> None:
    setup = SETUPS[name]
    t0 = time.perf_counter()
    print(f"\n== {name}: first run {setup['first'].relative_to(ROOT)}")
    p1 = calibrate([setup["first"]], setup, out / f"{name}-p1.json")
    a1 = advise(p1, setup, out / f"{name}-advise1.json")
    v, lo, hi = saving(a1)
    nxt = a1.get("next_run")
    print(f"1. advise with the first run's profile: async saves {100 * v:.1f} % "
          f"[{100 * lo:.1f}, {100 * hi:.1f}], {100 * (hi - lo):.1f} points wide")
    if not nxt:
        print("   advise named no next run")
        return
    run = nxt["run"]
    print(f"   next run named: {run['mode']} k={run['k']} at concurrency "
          f"{run['max_concurrency']}; expected width {100 * nxt['width_after']:.1f} points "
          f"({100 * nxt['width_after'] / nxt['width_now']:.0f} % of its own "
          f"{100 * nxt['width_now']:.1f} now)")
    second = make_run(name, setup, run, p1, out / f"{name}-{run['mode']}-k{run['k']}-"
                                                  f"c{run['max_concurrency']}.json")
    p2 = calibrate([setup["first"], second], setup, out / f"{name}-p2.json", same=False)
    a2 = advise(p2, setup, out / f"{name}-advise2.json")
    v2, lo2, hi2 = saving(a2)
    ratio = (hi2 - lo2) / (hi - lo)
    print(f"2. advise after calibrating on both: async saves {100 * v2:.1f} % "
          f"[{100 * lo2:.1f}, {100 * hi2:.1f}], {100 * (hi2 - lo2):.1f} points wide: "
          f"{100 * ratio:.0f} % of before -> target (at most half) "
          f"{'met' if ratio <= 0.5 else 'NOT met'}")
    if a2.get("next_run"):
        r = a2["next_run"]["run"]
        print(f"   the run after it: {r['mode']} k={r['k']} at concurrency "
              f"{r['max_concurrency']} (expected width "
              f"{100 * a2['next_run']['width_after']:.1f} points)")
    print(f"({time.perf_counter() - t0:.0f} s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--setup", choices=("seed", "h100", "both"), default="both")
    ap.add_argument("--out", type=Path, help="keep the files here (default: a temp dir)")
    ap.add_argument("--noise", type=float, help="the runs' noise on mean ITL, as calibrate "
                                                "--noise takes it (default: calibrate's, 1 %%)")
    args = ap.parse_args()
    global NOISE
    NOISE = args.noise
    out = args.out or Path(tempfile.mkdtemp(prefix="next-run-"))
    out.mkdir(parents=True, exist_ok=True)
    for name in (("seed", "h100") if args.setup == "both" else (args.setup,)):
        check(name, out)
    print(f"\nfiles: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
