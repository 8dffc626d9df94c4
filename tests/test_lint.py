"""pyflakes' checks (flake8 --select=F) over every tracked Python file, bench/ included: the
scripts that only run with vLLM installed (bench/vllm/) have no other test that imports them.
A name used before its local assignment (F823) crashed bench/vllm/measure.py ten minutes into
a measurement, after the servers' boot; this finds it in a second."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_pyflakes_finds_nothing():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    assert files
    r = subprocess.run([sys.executable, "-m", "flake8", "--select=F", *files], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_it_finds_a_name_used_before_its_local_assignment(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def only(a):\n    pass\n\n\ndef main(g):\n    only(1)\n"
                   "    if g:\n        only = {1}\n        return only\n")
    r = subprocess.run([sys.executable, "-m", "flake8", "--select=F", str(bad)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "F823" in r.stdout, r.stdout + r.stderr
