"""Model families and sizes: canonical family names and inference from model names.

A model name such as ``"unsloth/Qwen2.5-1.5B-Instruct"`` gives family ``"qwen"``
and size 1.5 (billions of parameters). Names are found in notebooks, console
output, ``config.json`` / ``adapter_config.json`` beside a ``trainer_state.json``
and ``model`` columns; the readers call :func:`infer_model` on them and
:func:`model_names_in_text` finds them in free text.
"""

from __future__ import annotations

import re

__all__ = ["infer_model", "model_names_in_text", "normalise_family"]

FAMILIES = ("qwen", "llama", "gemma", "phi", "mistral", "gpt-oss", "gpt-neox", "deepseek", "smollm", "olmo")
"""Known families (canonical names), matched by prefix in :func:`normalise_family`."""

# Names whose family is another family's architecture.
_ALIASES = {"mixtral": "mistral", "ministral": "mistral", "pythia": "gpt-neox", "tinyllama": "llama", "codellama": "llama"}
_FAMILY_RE = re.compile(
    r"(?<![a-z])(" + "|".join(re.escape(f).replace("\\-", "[-_ ]?") for f in (*_ALIASES, *FAMILIES)) + r")"
)
# A size token: a number right after a separator (or at the start), then b/m, then no letter or digit.
_SIZE_RE = re.compile(r"(?:^|[-_/\s:.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])")


def normalise_family(name: str) -> str:
    """Canonical family name: ``"Qwen2"``/``"qwen3"`` -> ``"qwen"``, ``"gpt_oss"`` -> ``"gpt-oss"``, ``"gemma3_text"`` -> ``"gemma"``.

    Families are matched by prefix against the known ones (transformers'
    ``model_type`` values and hub names alike); anything else is lower-cased with
    everything from the first non-letter on dropped (``"falcon_h1"`` -> ``"falcon"``).

    Parameters
    ----------
    name : str
        A family, ``model_type`` or model name.

    Returns
    -------
    str
        The canonical family.

    Example
    -------
    >>> normalise_family("Qwen2")
    'qwen'
    """
    text = str(name).strip().lower().replace("_", "-")
    known = next((family for family in FAMILIES if text.startswith(family)), None)
    if known:
        return known
    match = re.match(r"[a-z]+", text)
    return match.group(0) if match else text


def infer_model(name: str) -> tuple[str | None, float | None]:
    """Family and size (billions of parameters) read from a model name.

    The family is the first known family named in the model's own name (the
    part after the last ``/``, else the whole name; after ``Distill-`` it is
    the distilled-into architecture); the size is the first ``<number>B`` or
    ``<number>M`` token (``135M`` -> 0.135). Either is None when the name does
    not say it (``"microsoft/Phi-3-mini"`` has no size).

    Parameters
    ----------
    name : str
        A hub id, local path or display name, e.g. ``"unsloth/Qwen2.5-1.5B-Instruct"``.

    Returns
    -------
    tuple of (str or None, float or None)
        ``(family, params_b)``.

    Example
    -------
    >>> infer_model("unsloth/Qwen2.5-1.5B-Instruct")
    ('qwen', 1.5)
    >>> infer_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    ('smollm', 0.135)
    """
    text = str(name).strip().lower()
    text = re.sub(r"models--([^/\\]+)--([^/\\]+)", r"\1/\2", text)  # hub cache folder names
    tail = text.rstrip("/").rsplit("/", 1)[-1]  # the model's own name, without the organisation
    distilled = tail.split("distill", 1)[1] if "distill" in tail else ""
    found = _FAMILY_RE.search(distilled) or _FAMILY_RE.search(tail) or _FAMILY_RE.search(text)
    family = None
    if found:
        token = re.sub(r"[-_ ]", "-", found.group(1))
        family = _ALIASES.get(token.replace("-", ""), None) or normalise_family(token)
    size = None
    if match := _SIZE_RE.search(tail) or _SIZE_RE.search(text):
        number = float(match.group(1))
        size = number if match.group(2) == "b" else number / 1000
        size = size if size > 0 else None
    return family, size


# Where notebooks and scripts name the model they train.
_ASSIGN_RE = re.compile(
    r"\b(?:model_name_or_path|pretrained_model_name_or_path|base_model_name_or_path|model_name|model_id|"
    r"base_model|model_path|model)\s*[=:]\s*[\"']([^\"'\n]{2,200})[\"']",
    re.IGNORECASE,
)
_FROM_PRETRAINED_RE = re.compile(r"from_pretrained\(\s*[\"']([^\"'\n]{2,200})[\"']")
_HUB_ID_RE = re.compile(r"(?<![\w./-])([A-Za-z0-9][\w.-]{0,60}/[A-Za-z0-9][\w.-]{0,100})(?![\w.-]*/)")
# Logged metric names look like hub ids ("rewards/qwen_judge"); they never name the model.
_METRIC_PREFIXES = ("reward", "rewards", "train", "eval", "completions", "clip_ratio", "objective", "sampling")
_CACHE_RE = re.compile(r"models--([\w.-]+)--([\w.-]+)")
_UNSLOTH_PATCH_RE = re.compile(r"Unsloth[^\n]*?:\s*Fast (\w+) patching")


def model_names_in_text(text: str) -> list[str]:
    """Model names found in code or console output, most explicit first, without repeats.

    Looks, in this order, at ``model_name = "..."``-style assignments and
    ``from_pretrained("...")`` calls, then hub ids (``org/name``) and hub cache
    folders (``models--org--name``) that name a known family, then Unsloth's
    banner (``Unsloth 2025.3: Fast Qwen2 patching``, family only).

    Parameters
    ----------
    text : str
        Source code or printed output.

    Returns
    -------
    list of str
        Candidate model names; every one names a known family.

    Example
    -------
    >>> model_names_in_text('model, tok = FastLanguageModel.from_pretrained(model_name = "unsloth/Qwen2.5-1.5B-Instruct")')
    ['unsloth/Qwen2.5-1.5B-Instruct']
    """
    candidates = [m.group(1) for m in _ASSIGN_RE.finditer(text)]
    candidates += [m.group(1) for m in _FROM_PRETRAINED_RE.finditer(text)]
    candidates += [f"{m.group(1)}/{m.group(2)}" for m in _CACHE_RE.finditer(text)]
    candidates += [m.group(1) for m in _HUB_ID_RE.finditer(text) if m.group(1).split("/")[0].lower() not in _METRIC_PREFIXES]
    candidates += [m.group(1) for m in _UNSLOTH_PATCH_RE.finditer(text)]
    names: list[str] = []
    for name in candidates:
        name = name.strip()
        if name not in names and infer_model(name)[0] is not None:
            names.append(name)
    return names
