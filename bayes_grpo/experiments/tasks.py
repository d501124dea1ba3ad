"""Verifiable reasoning tasks generated in code, with correctness and format rewards.

Every example is a prompt such as ``"47+38="`` and a target answer ``"85"``.  The
expected completion is the answer followed by the terminator ``"."`` (then EOS):
``correctness`` pays 1.0 when the digits before the terminator equal the answer,
``format`` pays 0.25 when the completion is an answer of the expected width (as many
digits as the reference) followed by exactly one ``"."``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Callable

TERMINATOR = "."
CORRECT_REWARD = 1.0
FORMAT_REWARD = 0.25
ALPHABET = "0123456789+-=RS:."
_FORMAT_RE = re.compile(r"^\d+\.$")


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer (without the terminator)."""

    prompt: str
    answer: str


def _add(rng: random.Random, digits: int) -> Example:
    a, b = rng.randrange(10**digits), rng.randrange(10**digits)
    return Example(f"{a:0{digits}d}+{b:0{digits}d}=", str(a + b))


def _reverse(rng: random.Random, digits: int) -> Example:
    s = "".join(rng.choice("0123456789") for _ in range(digits))
    return Example(f"R:{s}=", s[::-1])


def _sort(rng: random.Random, digits: int) -> Example:
    s = "".join(rng.choice("0123456789") for _ in range(digits))
    return Example(f"S:{s}=", "".join(sorted(s)))


TASKS: dict[str, Callable[[random.Random, int], Example]] = {"add": _add, "reverse": _reverse, "sort": _sort}


def make_examples(task: str, digits: int, n: int, seed: int) -> list[Example]:
    """Return ``n`` examples of ``task`` with ``digits``-digit operands, drawn with ``seed``."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    rng = random.Random(seed)
    return [TASKS[task](rng, digits) for _ in range(n)]


def max_answer_length(task: str, digits: int) -> int:
    """Longest answer (in characters) the task can produce."""
    return digits + 1 if task == "add" else digits


def noisy_target(ex: Example, noise: float, rng: random.Random) -> str:
    """Supervised target for the warm-up: with probability ``noise`` a corrupted answer.

    A corrupted answer has random digits of the same length, and half of the
    corrupted answers also lose the terminator, so both rewards start below their
    maximum and GRPO has something to learn for each.
    """
    if rng.random() >= noise:
        return ex.answer + TERMINATOR
    wrong = "".join(rng.choice("0123456789") for _ in ex.answer)
    return wrong if rng.random() < 0.5 else wrong + TERMINATOR


def correctness(completions: list[str], answer: list[str], **_: object) -> list[float]:
    """1.0 when the completion's text before the first terminator equals the answer."""
    return [CORRECT_REWARD if c.split(TERMINATOR, 1)[0].strip() == a else 0.0 for c, a in zip(completions, answer)]


def format(completions: list[str], answer: list[str], **_: object) -> list[float]:  # noqa: A001 - logged name
    """0.25 when the completion is ``len(answer)`` digits followed by exactly one terminator."""
    return [FORMAT_REWARD if _FORMAT_RE.match(c.strip()) and len(c.strip()) == len(a) + 1 else 0.0
            for c, a in zip(completions, answer)]


REWARD_FUNCS: list[Callable[..., list[float]]] = [correctness, format]
REWARD_RANGE: tuple[float, float] = (0.0, CORRECT_REWARD + FORMAT_REWARD)
