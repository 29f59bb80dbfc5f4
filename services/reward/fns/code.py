"""Code-execution reward: run the completion's Python against test cases in the sandbox.

The program is the last fenced code block of the completion (```python … ```),
or the whole completion when it has none. The tests come from the ground truth,
a JSON document in one of these forms:

- ``[{"input": "1 2\\n", "output": "3\\n"}, …]`` or ``{"inputs": [...], "outputs": [...]}``:
  the program reads the input on stdin and must print the output (compared line by
  line, trailing whitespace ignored);
- ``{"asserts": ["assert add(1, 2) == 3", …]}``: each snippet runs after the program
  and must exit cleanly.

The score is the fraction of tests passed. A program that loops, exhausts its
memory, writes outside its directory or reaches for the network fails that test
(scores 0 for it): that is the policy's failure, so it is a reward, not an error.
A ground truth that is not such a document raises, so the sample is reported
as unscorable instead of being scored 0.
"""
from __future__ import annotations

import json
import re

from rlfleet.sandbox import SandboxLimits, SandboxResult, run_python

_FENCE = re.compile(r"```[ \t]*(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(solution_str: str) -> str:
    blocks = _FENCE.findall(solution_str or "")
    return blocks[-1] if blocks else (solution_str or "")


def parse_tests(ground_truth: str) -> list[tuple[str, str | None, str | None]]:
    """[(stdin, expected stdout or None, assert snippet or None)]."""
    try:
        spec = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    except json.JSONDecodeError as exc:
        raise ValueError(f"code reward: ground truth is not JSON: {exc}") from None
    if isinstance(spec, dict) and "asserts" in spec:
        return [("", None, str(a)) for a in spec["asserts"]]
    if isinstance(spec, dict) and "inputs" in spec and "outputs" in spec:
        if "fn_name" in spec:
            raise ValueError("code reward: call-based tests (fn_name) are not supported; use asserts")
        if len(spec["inputs"]) != len(spec["outputs"]):
            raise ValueError("code reward: inputs and outputs differ in length")
        spec = [{"input": i, "output": o} for i, o in zip(spec["inputs"], spec["outputs"])]
    if isinstance(spec, list) and spec and all(isinstance(t, dict) and "output" in t for t in spec):
        return [(str(t.get("input", "")), str(t["output"]), None) for t in spec]
    raise ValueError("code reward: ground truth must be a non-empty test list, {inputs, outputs} or "
                     "{asserts}")


def _same_output(actual: str, expected: str) -> bool:
    def lines(text: str) -> list[str]:
        return [ln.rstrip() for ln in text.strip().splitlines()]
    return lines(actual) == lines(expected)


def run_test(code: str, stdin: str, expected: str | None, snippet: str | None,
             limits: SandboxLimits) -> tuple[bool, SandboxResult]:
    program = code if snippet is None else f"{code}\n\n{snippet}\n"
    result = run_python(program, stdin, limits)
    passed = result.ok and (expected is None or _same_output(result.stdout, expected))
    return passed, result


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  timeout_s: float = 5.0, memory_mb: int = 512, file_mb: int = 8,
                  stop_at_first_failure: bool = False) -> float:
    tests = parse_tests(ground_truth)
    code = extract_code(solution_str)
    if not code.strip():
        return 0.0
    limits = SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, file_mb=file_mb)
    passed = 0
    for stdin, expected, snippet in tests:
        ok, _ = run_test(code, stdin, expected, snippet, limits)
        passed += ok
        if not ok and stop_at_first_failure:
            break
    return passed / len(tests)
