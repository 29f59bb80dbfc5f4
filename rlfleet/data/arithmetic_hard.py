"""The hard level of the arithmetic task (`rlfleet data arithmetic --level hard`): a task the tool decides.

Each problem chains three or four whole numbers of 3-4 digits with products and sums, at least one
of each, applied left to right and written with the parentheses that order needs
("What is (4821 + 376) * 1290 + 5512?"). A product of two 4-digit numbers has 7-8 digits: a model
of a few hundred million parameters rarely gets one right in its head, and a calculator gets every
one right, so accuracy with a tool measures whether the model uses it. At most two products, so a
result stays below 10^12 (the calculator's range is 10^15).

The worked answer has GSM8K's form, one line per operation (`4821 + 376 = 5197`) and `#### N`;
train and test are disjoint by the same hash of the expression as the easy level
(rlfleet/data/arithmetic.py).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

SYMBOLS = {"add": "+", "mul": "*"}
MIN_VALUE, MAX_VALUE = 100, 9999
MAX_PRODUCTS = 2


@dataclass(frozen=True)
class Chain:
    operands: tuple[int, ...]
    operations: tuple[str, ...]  # one fewer than operands: 'add' or 'mul', applied left to right

    @property
    def expression(self) -> str:
        """Left-to-right order in ordinary notation: the running sum is parenthesized before a product."""
        text, top_level_sum = str(self.operands[0]), False
        for op, x in zip(self.operations, self.operands[1:]):
            if op == "mul" and top_level_sum:
                text = f"({text})"
            text = f"{text} {SYMBOLS[op]} {x}"
            top_level_sum = op == "add"
        return text

    def steps(self) -> list[tuple[int, str, int, int]]:
        """(left, symbol, right, value) of each operation, in order."""
        out, value = [], self.operands[0]
        for op, x in zip(self.operations, self.operands[1:]):
            step = value + x if op == "add" else value * x
            out.append((value, SYMBOLS[op], x, step))
            value = step
        return out

    @property
    def result(self) -> int:
        return self.steps()[-1][3]

    def worked_answer(self) -> str:
        lines = [f"{a} {symbol} {b} = {c}" for a, symbol, b, c in self.steps()]
        return "\n".join([*lines, f"#### {self.result}"])


def draw_chain(rng: random.Random) -> Chain:
    """3 or 4 operands of 3-4 digits; 1 or 2 products and at least one sum."""
    count = rng.randint(3, 4)
    while True:
        operations = tuple(rng.choice(("add", "mul")) for _ in range(count - 1))
        if "add" in operations and 1 <= operations.count("mul") <= MAX_PRODUCTS:
            break
    return Chain(tuple(rng.randint(MIN_VALUE, MAX_VALUE) for _ in range(count)), operations)
