"""`stepgap validate-gpu` runs its whole plan on the CPU with the tiny pair, into the measured
format that `stepgap validate` writes and tests/test_fidelity.py re-judges."""

import json
import tarfile

from stepgap.cli import main


def test_the_gpu_plan_runs_on_the_cpu_into_a_measured_folder(tmp_path):
    out = tmp_path / "m"
    assert main(["validate-gpu", "--device", "cpu", "--out", str(out), "--output-len", "4",
                 "--prompts", "3", "--tar", "--quiet"]) == 0
    files = {p.name for p in out.iterdir()}
    assert {"manifest.json", "profile.json", "runs", "report.md", "env.json", "log.txt",
            "timelines", "models", "calibration.jsonl"} <= files
    env = json.loads((out / "env.json").read_text())
    assert env["selfcheck"]["all_equal"] and not env["skipped"]
    assert env["microbench"]["copy_GBps_read_plus_write"] > 0
    man = json.loads((out / "manifest.json").read_text())
    assert len(man["cells"]) == 27 and all(c["num_runs"] == 1 for c in man["cells"])
    assert man["sim"]["executor"] == "inline" and man["sim"]["device"] == "cpu"
    assert man["traces"]["calibration_runs"] == 9       # one per (k, concurrency) group
    profile = json.loads((out / "profile.json").read_text())
    assert {f["op"] for f in profile["device_ops"]} >= {"target_forward", "draft_forward",
                                                        "rejection_sample"}
    from stepgap.calibrate.measured import load_measured
    _, cells = load_measured(out)
    for c in cells:
        assert c.runs[0].metrics["completed"] == min(3, 2 * c.conc)
        if c.k:   # the synthetic MT-bench profile accepts drafts
            assert c.runs[0].spec_decode["num_accepted_tokens"] > 0
    assert "| zero-bubble | 4 | 32 |" in (out / "report.md").read_text()
    with tarfile.open(f"{out}.tar.gz") as tar:
        assert "m/manifest.json" in tar.getnames()
    # re-judged from the folder alone, as the fidelity test does
    again = tmp_path / "again"
    assert main(["validate", "--from-measured", str(out), "--out", str(again), "--quiet"]) == 0
    sim = json.loads((again / "simulated" / "sync-k2-c8.json").read_text())
    assert sim["config"]["resolved"]["device_costs"]["target_forward"].startswith("profile")
