"""Verifiable tasks generated in code, split into warm-up and GRPO prompts, with R1-style rewards.

Every example is a prompt such as ``"47+38="`` and a reference answer ``"85"``. The
expected completion is the answer followed by the terminator ``"."`` (then EOS).

Tasks (``TASKS``): ``add`` (two ``digits``-digit operands), ``sort`` (sort ``digits``
digits) and ``reverse`` (reverse ``digits`` digits; the prompt also holds distractor
letters ``x``/``y`` that must be dropped, e.g. ``"R:4x71y2="`` -> ``"2174"``).

The prompt space of each task is split by a hash of the prompt text (:func:`split_of`):
warm-up prompts and GRPO prompts are disjoint by construction, so GRPO has to
generalise instead of recalling answers seen in supervised warm-up.

Rewards (``REWARD_FUNCS``, logged by TRL as ``rewards/<name>/mean``), summed by TRL:

* ``correctness`` 1.0 when the text before the first terminator equals the answer;
* ``partial_credit`` up to 0.5, in proportion to the answer positions that are right;
* ``format`` 0.2 when the completion is digits followed by exactly one terminator;
* ``length`` up to 0.1, falling linearly with the gap between the answer's length and
  the completion's (0 at a gap of the answer's whole length or more).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass
from typing import Callable

TERMINATOR = "."
CORRECT_REWARD = 1.0
PARTIAL_REWARD = 0.5
FORMAT_REWARD = 0.2
LENGTH_REWARD = 0.1
ALPHABET = "0123456789+-=RSxy:."
DISTRACTORS = "xy"
SPLITS = ("warmup", "grpo")
_FORMAT_RE = re.compile(r"^\d+\.$")


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer (without the terminator)."""

    prompt: str
    answer: str


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def _add(rng: random.Random, digits: int) -> Example:
    a, b = rng.randrange(10**digits), rng.randrange(10**digits)
    return Example(f"{a:0{digits}d}+{b:0{digits}d}=", str(a + b))


def _sort(rng: random.Random, digits: int) -> Example:
    s = _digits(rng, digits)
    return Example(f"S:{s}=", "".join(sorted(s)))


def _reverse(rng: random.Random, digits: int) -> Example:
    s = _digits(rng, digits)
    chars = list(s)
    for _ in range(rng.randint(1, 2)):  # one or two distractor letters at random places
        chars.insert(rng.randint(0, len(chars)), rng.choice(DISTRACTORS))
    return Example(f"R:{''.join(chars)}=", s[::-1])


TASKS: dict[str, Callable[[random.Random, int], Example]] = {"add": _add, "sort": _sort, "reverse": _reverse}
DEFAULT_DIGITS: dict[str, int] = {"add": 2, "sort": 4, "reverse": 4}
"""Input length per task when none is given (2-digit addition: 10^4 prompts; 4-digit strings: 10^4)."""


def split_of(prompt: str) -> str:
    """Which half of the prompt space ``prompt`` belongs to: ``"warmup"`` or ``"grpo"``.

    Parameters
    ----------
    prompt : str
        Prompt text.

    Returns
    -------
    str
        ``"warmup"`` or ``"grpo"``, from the parity of the first byte of the prompt's SHA-256.

    Example
    -------
    >>> split_of("12+34=") in SPLITS
    True
    """
    return SPLITS[hashlib.sha256(prompt.encode()).digest()[0] % 2]


def make_examples(task: str, digits: int, n: int, seed: int, split: str) -> list[Example]:
    """Draw ``n`` examples of ``task`` whose prompts lie in ``split`` (repeats allowed).

    Parameters
    ----------
    task : str
        One of ``TASKS``.
    digits : int
        Operand or string length (at least 2).
    n : int
        Number of examples.
    seed : int
        Seed of the draw.
    split : str
        ``"warmup"`` or ``"grpo"``; prompts of the other split are rejected.

    Returns
    -------
    list of Example

    Raises
    ------
    ValueError
        Unknown task or split, or ``digits`` below 2.

    Example
    -------
    >>> all(split_of(e.prompt) == "grpo" for e in make_examples("sort", 4, 5, seed=0, split="grpo"))
    True
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose from {sorted(TASKS)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")
    if digits < 2:
        raise ValueError(f"digits={digits} is too small to split the prompt space; use 2 or more")
    rng = random.Random(seed)
    out: list[Example] = []
    while len(out) < n:
        ex = TASKS[task](rng, digits)
        if split_of(ex.prompt) == split:
            out.append(ex)
    return out


def max_answer_length(task: str, digits: int) -> int:
    """Longest answer (in characters) ``task`` can produce with ``digits``-digit inputs."""
    return digits + 1 if task == "add" else digits


def noisy_target(ex: Example, noise: float, rng: random.Random) -> str:
    """Supervised warm-up target: the answer and terminator, or with probability ``noise`` a corrupted one.

    A corrupted target has one to all of its digits replaced at random, and a quarter
    of the corrupted targets also lose the terminator, so every reward function starts
    below its maximum and GRPO has something to learn for each.
    """
    if rng.random() >= noise:
        return ex.answer + TERMINATOR
    chars = list(ex.answer)
    for i in rng.sample(range(len(chars)), rng.randint(1, len(chars))):
        chars[i] = rng.choice("0123456789")
    wrong = "".join(chars)
    return wrong if rng.random() < 0.25 else wrong + TERMINATOR


def _body(completion: str) -> str:
    return completion.split(TERMINATOR, 1)[0].strip()


def correctness(completions: list[str], answer: list[str], **_: object) -> list[float]:
    """1.0 when the completion's text before the first terminator equals the answer."""
    return [CORRECT_REWARD if _body(c) == a else 0.0 for c, a in zip(completions, answer)]


def partial_credit(completions: list[str], answer: list[str], **_: object) -> list[float]:
    """0.5 times the share of answer positions that the text before the first terminator gets right."""
    return [PARTIAL_REWARD * sum(x == y for x, y in zip(_body(c), a)) / len(a) for c, a in zip(completions, answer)]


def format(completions: list[str], answer: list[str], **_: object) -> list[float]:  # noqa: A001 - logged name
    """0.2 when the completion is one or more digits followed by exactly one terminator."""
    return [FORMAT_REWARD if _FORMAT_RE.match(c.strip()) else 0.0 for c in completions]


def length(completions: list[str], answer: list[str], **_: object) -> list[float]:
    """0.1 times (1 - |len(text before terminator) - len(answer)| / len(answer)), floored at 0."""
    return [LENGTH_REWARD * max(0.0, 1.0 - abs(len(_body(c)) - len(a)) / len(a)) for c, a in zip(completions, answer)]


REWARD_FUNCS: list[Callable[..., list[float]]] = [correctness, partial_credit, format, length]
REWARD_RANGE: tuple[float, float] = (0.0, CORRECT_REWARD + PARTIAL_REWARD + FORMAT_REWARD + LENGTH_REWARD)
