"""A speculation method is one object and its registration (common/speculation.py): a method
registered here, in this test alone, runs through the simulator with nothing else changed, its
own draft width (not k) sets the tokens each step verifies and the drafter's passes, and names
that are not registered still end in the options' one-line errors."""

from dataclasses import dataclass

import pytest

from stepgap.cli import main
from stepgap.common.errors import UserError
from stepgap.common.model_heads import eagle3_for
from stepgap.common.speculation import HEAD, METHODS, Speculation, method_of
from stepgap.sim.config import SimConfig
from stepgap.sim.costs import ConstantCosts
from stepgap.sim.loop import simulate


@dataclass(frozen=True, slots=True)
class Window(Speculation):
    """A toy method: an EAGLE-3 head that drafts at most two tokens a step, whatever k."""

    def draft_tokens(self, k: int) -> int:
        return min(k, 2)


@pytest.fixture
def window(monkeypatch):
    m = Window("window2", HEAD, derive_head=eagle3_for, unpadded=True)
    monkeypatch.setitem(METHODS, m.name, m)   # registered for this test only
    return m


class Seen:
    """Fixed device times (ConstantCosts), keeping every batch and draft pass it prices."""

    def __init__(self):
        self.costs, self.batches, self.passes = ConstantCosts(draft=100.0), [], []

    def target_forward(self, b):
        self.batches.append(b)
        return self.costs.target_forward(b)

    def draft_forward(self, b, i):
        self.passes.append(i)
        return self.costs.draft_forward(b, i)

    def __getattr__(self, name):
        return getattr(self.costs, name)


RUN = dict(gpu="h100", model="llama-3.1-8b", draft=None, max_concurrency=1, num_prompts=2,
           output_len=48, k=4)


def decode_batches(method: str) -> tuple[list, list]:
    seen = Seen()
    simulate(SimConfig(**RUN, method=method), device_costs=seen)
    # one request verifying its drafts: every token it runs needs logits
    return [b for b in seen.batches if b.num_reqs == 1 and b.num_tokens == b.num_logits
            and b.num_drafts], seen.passes


def test_a_registered_method_verifies_its_own_width_each_step(window):
    decodes, _ = decode_batches("window2")
    assert max(b.num_tokens for b in decodes) == window.verify_tokens(4) == 3
    assert max(b.num_drafts for b in decodes) == 2


def test_eagle3_at_the_same_k_verifies_one_plus_k():
    decodes, _ = decode_batches("eagle3")
    assert max(b.num_tokens for b in decodes) == 5


def test_a_registered_methods_drafter_runs_a_pass_a_draft(window):
    _, passes = decode_batches("window2")
    assert max(passes) == 1   # passes 0 and 1: its two drafts, not k = 4


def test_an_unregistered_method_ends_in_the_options_one_line_error(window, capsys):
    assert method_of("window2") is window
    with pytest.raises(SystemExit) as e:
        main(["simulate", "--speculative-config", '{"method": "window3"}'])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1
    assert "method 'window3' is not modelled (stepgap models eagle3, eagle, mtp, " \
           "draft_model, ngram, ngram_gpu, suffix, window2;" in err[0]


def test_a_method_not_registered_is_refused_by_the_run_spec():
    with pytest.raises(UserError) as e:
        SimConfig(**{**RUN, "method": "window2"})
    assert str(e.value) == ("--speculative-config method: must be one of eagle3, eagle, mtp, "
                            "draft_model, ngram, ngram_gpu, suffix, got 'window2'")
