"""Jupyter notebooks (``.ipynb``): the progress table or printed log dicts in cell outputs, the model in the code.

Unsloth / TRL notebooks render the training progress as an HTML table in the
output of the ``trainer.train()`` cell; plain TRL prints log dicts. The code
cells name the model (``FastLanguageModel.from_pretrained(model_name = "unsloth/Qwen2.5-1.5B-Instruct")``),
which gives the family and size, recorded with provenance ``"notebook"``.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd

from bayes_grpo.errors import LogError
from bayes_grpo.logs.console import banner_meta, join_tables, model_meta, parse_console, table_frame
from bayes_grpo.logs.families import model_names_in_text
from bayes_grpo.logs.files import read_text

__all__ = ["read_notebook"]

LABEL = "notebook"


def read_notebook(path: Path, encoding: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Raw table and found metadata of a notebook: HTML progress tables, else printed dicts / text tables.

    Parameters
    ----------
    path : pathlib.Path
        The ``.ipynb`` file.
    encoding : str, optional
        Text encoding (notebooks are UTF-8 JSON; give it only for odd files).

    Returns
    -------
    tuple of (pandas.DataFrame, dict)
        The raw table and the metadata found (planned steps, model name, family, size).

    Raises
    ------
    LogError
        When the file is not a notebook or holds no training log.
    """
    notebook = json.loads(read_text(path, encoding))
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        raise LogError(f"{path}: not a Jupyter notebook (no 'cells' list)")
    html_parts, text_parts, code_parts = [], [], []
    for cell in cells:
        if not isinstance(cell, dict):
            continue
        if cell.get("cell_type") == "code" and cell.get("source"):
            code_parts.append(_joined(cell["source"]))
        for output in cell.get("outputs") or []:
            if not isinstance(output, dict):
                continue
            data = output.get("data") or {}
            html = data.get("text/html") if isinstance(data, dict) else None
            if html:
                html_parts.append(_joined(html))
            for text in (output.get("text"), data.get("text/plain") if isinstance(data, dict) and not html else None):
                if text:
                    text_parts.append(_joined(text))
    frames = [f for f in (table_frame(t) for part in html_parts for t in _html_tables(part)) if f is not None]
    text = "\n".join(text_parts)
    if frames:
        frame, found = join_tables(frames, str(path)), banner_meta(text, LABEL)
    else:
        frame, found = parse_console(text, path, LABEL)
    return frame, _with_code_model(found, "\n".join(code_parts))


def _with_code_model(found: dict, code: str) -> dict:
    """The model named in the code cells wins over one seen in the outputs (both are the notebook's)."""
    model = model_meta(model_names_in_text(code))
    if not model:
        return found
    merged = {k: v for k, v in found.items() if k != "provenance"}
    if model.get("family") != merged.get("family"):
        merged.pop("params_b", None)
    merged.update(model)
    provenance = {**(found.get("provenance") or {}), **{k: LABEL for k in model}}
    return {**merged, "provenance": {k: v for k, v in provenance.items() if k in merged}}


def _joined(value: str | list) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


class _TableParser(HTMLParser):
    """Collect the cells of every <table> in an HTML fragment."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            if self._row:
                self.tables[-1].append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _html_tables(html: str) -> list[list[list[str]]]:
    parser = _TableParser()
    parser.feed(html)
    parser.close()
    return parser.tables
