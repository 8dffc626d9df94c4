"""sim: a SimPy model of an LLM serving engine's step loop (docs/explanation/simulator.md).

`sim.loop.simulate(SimConfig(...), requests)` runs one serving benchmark and returns its run
result and timeline; `stepgap simulate` is the command line over it.
"""
