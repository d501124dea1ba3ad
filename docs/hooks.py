"""MkDocs hook: put the example notebooks of ``notebooks/`` on the site as ``notebooks/<name>.ipynb``.

The notebooks stay where the tests run them (``notebooks/``); mkdocs-jupyter renders them
without executing them. This hook runs before mkdocs-jupyter's own ``on_files``.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent


@event_priority(100)
def on_files(files: Files, config) -> Files:
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(File(f"notebooks/{notebook.name}", str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
