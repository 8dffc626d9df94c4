"""pytest's view of the test package: the shared helpers live in tests/helpers.py and are
imported as `from tests.helpers import ...`; fixtures shared by several files live here.

`make test` runs the suite on every core (pytest-xdist, `--dist loadgroup`). A costly fixture
is built once per worker that uses it, so every test that uses one of ONE_WORKER's fixtures is
sent to that fixture's worker (an `xdist_group` named for it, and for its parameter where it has
one: each folder's tests of test_fidelity.py go together): each is built once per run.
docs/explanation/design.md, "Tests", says how the suite is organised."""

import json
import shutil
import signal

import pytest

from tests.helpers import CHAT_TEMPLATE, PAIR, SERVED_K, Server, tiny_checkpoints

# The fixtures whose users run on one worker (any scope wider than a test's).
ONE_WORKER = ("pair_server", "process_executor", "graph_executor", "nb_kernel", "judged",
              "peer_judged")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in ONE_WORKER:
            if name in item.fixturenames:
                params = getattr(item, "callspec", None)
                param = params.params.get(name) if params else None
                group = name if param is None else f"{name}-{getattr(param, 'name', param)}"
                item.add_marker(pytest.mark.xdist_group(group))
                break


def pytest_terminal_summary(terminalreporter, config):
    """The order's seed, even under -q (which hides pytest-randomly's header line)."""
    seed = getattr(config.option, "randomly_seed", None)
    if isinstance(seed, int):
        terminalreporter.write_line(f"tests ran in pytest-randomly's order {seed}: "
                                    f"--randomly-seed={seed} repeats it")


@pytest.fixture(scope="session")
def tiny():
    """The tiny checkpoints' paths (target, eagle3-yuhuili, eagle3-speculators)."""
    return tiny_checkpoints()


@pytest.fixture(scope="session")
def pair_server(tmp_path_factory):
    """The one server of the tests that only send it requests: the trained pair served by
    `python -m stepgap serve` (process executor, k = SERVED_K, --served-model-name pystdlib,
    no --max-model-len: the model's own 256), a chat template added to a copy of its tokenizer,
    recording to `record` + .server.jsonl / .server.json (--timeline, --result-json: a test's
    window is bracketed by /start_profile and /stop_profile). A test must leave it as it found
    it: nothing left running, no process stopped or killed (those tests start their own)."""
    tmp = tmp_path_factory.mktemp("pair-server")
    target = tmp / "target"
    shutil.copytree(PAIR / "target", target)
    cfg = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**cfg,
                                                              "chat_template": CHAT_TEMPLATE}))
    record = tmp / "run"
    # float32 with one torch thread on both sides (the process executor's worker, and the
    # tests' own engine): equal shapes then give equal bits, so greedy outputs can be compared.
    server = Server("--model", str(target), "--draft", str(PAIR / "eagle3"), "-k", str(SERVED_K),
                    "--executor", "process", "--max-num-seqs", "8",
                    "--num-gpu-blocks-override", "256", "--served-model-name", "pystdlib",
                    "--timeline", f"{record}.server.jsonl",
                    "--result-json", f"{record}.server.json")
    server.record = record
    yield server
    assert server.stop(signal.SIGINT)
