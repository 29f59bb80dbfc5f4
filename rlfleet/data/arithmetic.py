"""Built-in real-model task: generated arithmetic in GSM8K's answer format.

Each problem is a sum, a difference or a product of two or three whole numbers
("What is 48 + 7 + 23?"), asked with the GSM8K instruction, so a chat model that
was taught GSM8K's `#### N` convention can answer it the same way. The reference
answer is written as GSM8K writes its solutions, one line per operation and the
result after `####` (`48 + 7 = 55\\n55 + 23 = 78\\n#### 78`); it is stored in
`extra_info.answer` (as the GSM8K converter stores GSM8K's), which makes the same
file usable for a supervised warm start (`rlfleet sft --response-key extra_info.answer`).

`level="hard"` draws the chains of rlfleet/data/arithmetic_hard.py instead (3-4 numbers of 3-4
digits, products and sums: a task a calculator decides); the options of ArithmeticSpec are the easy
level's.

Train and test are disjoint by construction: a problem belongs to the test side when
a hash of its canonical text falls in the lowest `TEST_SHARE_PERCENT` of buckets, and a
split only ever draws problems of its own side. So two files written with any seeds
and sizes never share a problem across the two splits.

Rows follow verl's schema; `data_source` is `rlfleet/arithmetic`, whose reward
(`services/reward/fns/final_number.py`) is the number after `####`, else the last
number of a response that ended on its own, and never credits a response cut at
the token budget.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any

from rlfleet.data.arithmetic_hard import Chain, draw_chain
from rlfleet.data.convert import GSM8K_INSTRUCTION, make_row
from rlfleet.errors import ConfigError, DataError

TASK_NAME = "rlfleet/arithmetic"
ABILITY = "math"
SYMBOLS = {"add": "+", "sub": "-", "mul": "*"}
SPLITS = ("train", "test")
LEVELS = ("easy", "hard")
TEST_SHARE_PERCENT = 10
_QUESTIONS = ("What is {expr}?", "Compute {expr}.", "Calculate {expr}.", "Work out {expr}.")
# Draws per requested row before concluding the option space is too small for the row count.
_DRAWS_PER_ROW = 200


@dataclass(frozen=True)
class ArithmeticSpec:
    """What problems to draw. Operands are whole numbers in [min_value, max_value]
    ([min_value, mul_max_value] for products, which grow fast); a difference never goes below 0."""

    operations: tuple[str, ...] = ("add", "sub", "mul")
    min_operands: int = 2
    max_operands: int = 3
    min_value: int = 1
    max_value: int = 99
    mul_max_value: int = 20

    def check(self) -> None:
        unknown = [op for op in self.operations if op not in SYMBOLS]
        if unknown or not self.operations:
            raise ConfigError(f"--operations: {unknown or 'none'} not among {', '.join(SYMBOLS)}")
        if not 2 <= self.min_operands <= self.max_operands <= 3:
            raise ConfigError(
                f"--min-operands {self.min_operands} / --max-operands {self.max_operands}: "
                "need 2 <= min <= max <= 3"
            )
        if not 0 <= self.min_value <= min(self.max_value, self.mul_max_value):
            raise ConfigError(
                f"--min-value {self.min_value} must be >= 0 and <= --max-value {self.max_value} "
                f"and --mul-max-value {self.mul_max_value}"
            )


@dataclass(frozen=True)
class Problem:
    operation: str
    operands: tuple[int, ...]

    @property
    def expression(self) -> str:
        return f" {SYMBOLS[self.operation]} ".join(str(x) for x in self.operands)

    @property
    def result(self) -> int:
        apply = {"add": int.__add__, "sub": int.__sub__, "mul": int.__mul__}[self.operation]
        value = self.operands[0]
        for x in self.operands[1:]:
            value = apply(value, x)
        return value

    def worked_answer(self) -> str:
        """GSM8K's solution style: one line per operation, then `#### N`."""
        lines, value = [], self.operands[0]
        for x in self.operands[1:]:
            step = Problem(self.operation, (value, x)).result
            lines.append(f"{value} {SYMBOLS[self.operation]} {x} = {step}")
            value = step
        return "\n".join([*lines, f"#### {value}"])


def split_of(problem: Problem | Chain) -> str:
    """'test' for the lowest TEST_SHARE_PERCENT hash buckets of the canonical expression, else 'train'."""
    digest = hashlib.sha256(problem.expression.encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % 100 < TEST_SHARE_PERCENT else "train"


def draw_problem(rng: random.Random, spec: ArithmeticSpec) -> Problem | None:
    """One problem, or None when a difference came out negative (the caller draws again)."""
    operation = rng.choice(spec.operations)
    count = rng.randint(spec.min_operands, spec.max_operands)
    top = spec.mul_max_value if operation == "mul" else spec.max_value
    problem = Problem(operation, tuple(rng.randint(spec.min_value, top) for _ in range(count)))
    return problem if problem.result >= 0 else None


def make_rows(
    rows: int, seed: int = 0, split: str = "train", spec: ArithmeticSpec | None = None,
    instruction: str = GSM8K_INSTRUCTION, level: str = "easy",
) -> list[dict[str, Any]]:
    """`rows` distinct problems of `split`'s side at `level`, deterministic given the arguments."""
    spec = spec or ArithmeticSpec()
    spec.check()
    if level not in LEVELS:
        raise ConfigError(f"--level {level!r}: must be one of {', '.join(LEVELS)}")
    if split not in SPLITS:
        raise ConfigError(f"--split {split!r}: must be one of {', '.join(SPLITS)} (they are disjoint)")
    if rows < 1:
        raise ConfigError(f"--rows must be at least 1, not {rows}")
    stream = f"{TASK_NAME}:{split}:{seed}" if level == "easy" else f"{TASK_NAME}:{level}:{split}:{seed}"
    rng = random.Random(stream)
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for _ in range(rows * _DRAWS_PER_ROW):
        problem = draw_problem(rng, spec) if level == "easy" else draw_chain(rng)
        if problem is None or problem.expression in seen or split_of(problem) != split:
            continue
        seen.add(problem.expression)
        question = rng.choice(_QUESTIONS).format(expr=problem.expression)
        content = f"{question} {instruction}".strip()
        out.append(make_row(
            TASK_NAME, [{"role": "user", "content": content}], ABILITY, str(problem.result),
            {"split": split, "index": len(out), "question": question, "answer": problem.worked_answer(),
             "level": level},
        ))
        if len(out) == rows:
            return out
    raise DataError(
        f"only {len(out)} distinct {split} problems found for --rows {rows} with these options; "
        "widen --max-value / --mul-max-value / the operations, or ask for fewer rows"
    )
