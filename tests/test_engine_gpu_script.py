"""The prepared GPU measurement script runs its whole sweep on the CPU with the tiny model."""

import gzip
import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_measure.py"


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_measure", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_script_sweeps_modes_k_and_concurrency_on_the_cpu(tmp_path):
    out = tmp_path / "m"
    assert load_script().main(["--device", "cpu", "--out", str(out), "--output-len", "4",
                               "--max-prompts", "3"]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["env.json", "log.txt", "profile.json", "results.jsonl", "summary.txt",
                     "timelines.jsonl.gz"]
    assert sum(p.stat().st_size for p in out.iterdir()) < 16 * 2 ** 20
    env = json.loads((out / "env.json").read_text())
    assert env["selfcheck"]["all_equal"] and not env["skipped"]
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    cells = {r["config"]["cell"] for r in results}
    assert cells == {f"{m}/k{k}/c{c}" for m in ("sync", "async", "zero-bubble")
                     for k in (0, 2, 4) for c in (1, 8, 32)}
    for r in results:
        assert r["completed"] > 0 and "step_gaps" in r
        if r["config"]["k"]:
            assert r["spec_decode"]["num_accepted_tokens"] > 0  # synthetic MT-bench profile
    with gzip.open(out / "timelines.jsonl.gz", "rt") as f:
        first = json.loads(f.readline())
    assert {"lane", "op", "step", "start_us", "end_us", "cell"} <= set(first)
    ops = {row["op"] for row in json.loads((out / "profile.json").read_text())["rows"]}
    assert {"target_forward", "draft_forward", "rejection_sample", "prepare_inputs"} <= ops
    # The comparison path takes the folder too: converted to a measured folder, re-simulated on
    # its own profile.json (the GPU run's check; here the tiny CPU sweep) and reported.
    from stepgap.cli import main
    report = tmp_path / "report"
    assert main(["validate", "--from-measured", str(out), "--out", str(report), "--quiet"]) == 0
    man = json.loads((report / "manifest.json").read_text())
    assert man["source"] == "bench/gpu_measure.py" and len(man["cells"]) == 27
    assert man["sim"]["worker"] == "inline" and man["sim"]["device"] == "sync"
    text = (report / "report.md").read_text()
    assert "| zero-bubble | 4 | 32 |" in text and "consistency check" in text
    sim = json.loads((report / "simulated" / "sync-k2-c8.json").read_text())
    assert sim["config"]["resolved"]["device_costs"]["target_forward"].startswith("profile")
