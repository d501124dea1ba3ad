"""Reading log files as text: decoding with a diagnosis of encoding problems, and metadata sidecars."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

from bayes_grpo.errors import LogError

__all__ = ["decode", "read_sidecar", "read_text"]

# Control characters that never occur in a text log (tab, newline, carriage return and form feed excluded).
_CONTROL = {chr(c) for c in range(32)} - {"\t", "\n", "\r", "\x0c"}


def read_text(path: Path, encoding: str | None = None) -> str:
    """The file's text; UTF-8 (a BOM is dropped) unless ``encoding`` is given.

    Parameters
    ----------
    path : pathlib.Path
        The file.
    encoding : str, optional
        A Python codec name (``"latin-1"``, ``"cp1252"``, ``"utf-16"``, ...).

    Returns
    -------
    str
        The decoded text.

    Raises
    ------
    LogError
        When the bytes are not text in that encoding; the message names the
        byte, its position, what the file looks like (Latin-1/cp1252, UTF-16,
        binary) and the fix.
    """
    return decode(path.read_bytes(), path, encoding)


def decode(data: bytes, path: Path, encoding: str | None = None) -> str:
    """Decode ``data`` read from ``path``; see :func:`read_text`."""
    if encoding is not None:
        try:
            codecs.lookup(encoding)
        except LookupError as exc:
            raise LogError(f"{path}: unknown encoding {encoding!r}; use e.g. 'utf-8', 'latin-1' or 'cp1252'") from exc
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise LogError(
                f"{path}: not valid {encoding} ({exc.reason}: byte 0x{data[exc.start]:02x} at position {exc.start}); "
                "check the encoding= argument"
            ) from exc
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise LogError(_diagnose(data, exc, path)) from exc


def _diagnose(data: bytes, exc: UnicodeDecodeError, path: Path) -> str:
    """A one-line explanation of why ``data`` is not UTF-8 text, with the fix."""
    byte = data[exc.start]
    line = data.count(b"\n", 0, exc.start) + 1
    where = f"byte 0x{byte:02x} at position {exc.start}, line {line}"
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return f"{path}: not valid UTF-8 ({where}): it is UTF-16 text; pass encoding='utf-16' or re-save the file as UTF-8"
    if b"\x00" not in data:
        for guess in ("cp1252", "latin-1"):
            try:
                text = data.decode(guess)
            except UnicodeDecodeError:
                continue
            if not _CONTROL & set(text):
                line_start = data.rfind(b"\n", 0, exc.start) + 1
                line_end = data.find(b"\n", exc.start)
                line_end = len(data) if line_end < 0 else line_end
                start, end = max(line_start, exc.start - 15), min(line_end, exc.start + 15)
                sample = data[start:end].decode(guess).strip("\r")
                return (
                    f"{path}: not valid UTF-8 ({where}, {sample!r}): looks like Latin-1/cp1252 text; "
                    f"pass encoding={guess!r} (read_log/load_runs) or re-save the file as UTF-8"
                )
    return f"{path}: not a text file (not valid UTF-8: {exc.reason}, {where}); give a text log"


def read_sidecar(path: Path, encoding: str | None = None) -> dict:
    """The JSON object of a ``<log>.meta.json`` sidecar (RunMetadata fields and extras).

    Parameters
    ----------
    path : pathlib.Path
        The sidecar file.
    encoding : str, optional
        Text encoding; default UTF-8.

    Returns
    -------
    dict
        Its fields.

    Raises
    ------
    LogError
        When it is not a JSON object.
    """
    text = read_text(path, encoding)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LogError(f"{path}: metadata sidecar is not valid JSON ({exc}); fix or delete it") from exc
    if not isinstance(data, dict):
        raise LogError(f"{path}: metadata sidecar must be a JSON object of RunMetadata fields")
    return data
