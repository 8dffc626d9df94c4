"""The command line starts without torch: `stepgap --help` and the simulator's commands
(simulate, sweep, plot) and compare never import it, so that they start in a fraction of the
time torch's import takes, and every test that starts `python -m stepgap` pays less. Each
command runs in a fresh interpreter, which then reports the heavy packages it loaded."""

import subprocess
import sys
from pathlib import Path

import pytest

from stepgap.cli import main

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "fastapi", "uvicorn")
# Runs one command as `stepgap` does, then prints which of HEAVY it imported.
PROBE = f"""
import sys
from stepgap.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:   # --help
    code = e.code
sys.stdout.flush()
print("loaded:", [m for m in {HEAVY!r} if m in sys.modules], "status:", code, file=sys.stderr)
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A simulated result and timeline, and a sweep of two axes, for the commands to read."""
    d = tmp_path_factory.mktemp("startup")
    assert main(["simulate", "--preset", "seed-l20", "--num-prompts", "4", "--result-json",
                 str(d / "r.json"), "--timeline", str(d / "t.jsonl"), "--quiet"]) == 0
    assert main(["sweep", "--preset", "seed-l20", "--set", "num_prompts=2", "--grid", "k=0,1",
                 "--grid", "max_concurrency=1,2", "--jobs", "1", "--out", str(d / "sw"),
                 "--quiet"]) == 0
    return d


# Each command's argv, given the inputs' folder and a folder of its own for its outputs.
COMMANDS = {
    "--help": lambda d, out: ["--help"],
    "simulate": lambda d, out: ["simulate", "--preset", "seed-l20", "--num-prompts", "4",
                                "--result-json", str(out / "r.json"), "--quiet"],
    "sweep": lambda d, out: ["sweep", "--preset", "seed-l20", "--set", "num_prompts=2",
                             "--grid", "k=0,1", "--jobs", "1", "--out", str(out), "--quiet"],
    "plot sweep": lambda d, out: ["plot", "sweep", str(d / "sw"), "--out", str(out),
                                  "--quiet"],
    "plot timeline": lambda d, out: ["plot", "timeline", str(d / "t.jsonl"), "--out",
                                     str(out / "t.png"), "--quiet"],
    "compare": lambda d, out: ["compare", str(d / "r.json"), str(d / "r.json")],
    "advise": lambda d, out: ["advise", "--preset", "seed-l20", "--num-prompts", "2",
                              "--max-concurrency", "1", "--max-k", "1",
                              "--result-json", str(out / "a.json")],
    "explain": lambda d, out: ["explain", "--preset", "seed-l20", "--num-prompts", "2",
                               "--output-len", "16", "--chrome", str(out / "c.json"),
                               "--quiet"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_command_runs_without_importing_torch(command, inputs, tmp_path):
    proc = subprocess.run([sys.executable, "-c", PROBE, *COMMANDS[command](inputs, tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.stderr.strip().splitlines()[-1] == "loaded: [] status: 0", proc.stderr
