"""`stepgap compare MEASURED SIMULATED`: how far one run result is from another, over the shared
core's comparison (common/compare.py), which belongs to neither half."""

from __future__ import annotations

import sys

from stepgap.common.compare import cmp_to_json, compare, format_compare, mismatches
from stepgap.common.fileio import dumps_json
from stepgap.common.options import add_command
from stepgap.common.run_result import RunResult

DESCRIPTION = (
    "Print the error of a simulated run result against a measured one: mean, median, P99 (and "
    "every percentile both carry) of TPOT, ITL, TTFT and E2EL, and the step-gap distributions. "
    "Either file may be a stepgap result (engine or simulator), one saved by `vllm bench serve "
    "--save-result` (no step gaps), or a peer's vLLM run as LLMServingSim's bench records it "
    "(vllm/requests.jsonl: TTFT = first token - queued, TPOT, E2EL; no ITL).")

EPILOG = """\
example:
  stepgap run ... --detailed --result-json measured.json
  stepgap simulate ... --detailed --result-json simulated.json
  stepgap compare measured.json simulated.json"""


def register(sub) -> None:
    p = add_command(sub, "compare", description=DESCRIPTION, epilog=EPILOG,
                    help="errors of one run result against another (simulated vs measured)")
    p.add_argument("measured", metavar="MEASURED", help="run result taken as the truth")
    p.add_argument("simulated", metavar="SIMULATED", help="run result judged against it")
    p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    p.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    measured, simulated = RunResult.load(args.measured), RunResult.load(args.simulated)
    for line in mismatches(measured, simulated):
        print(f"stepgap compare: warning: {line}", file=sys.stderr)
    cmp = compare(measured, simulated)
    if args.json:
        print(dumps_json(cmp_to_json(cmp), indent=1))   # valid JSON: NaN as "nan"
    else:
        print(f"measured:  {args.measured}\nsimulated: {args.simulated}")
        print(format_compare(cmp))
    return 0
