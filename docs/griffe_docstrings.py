"""Griffe extension: the package's reST habits in docstrings, rendered for mkdocstrings.

The docstrings are NumPy style and keep Sphinx roles and doctest directives, which read well
in ``help()`` and in the source. Before mkdocstrings renders them, this extension rewrites,
in every docstring of the package (the sources stay as they are):

* a Sphinx role (``:func:`forecast```, ``:attr:`title <path>```, ``:class:`~bayes_grpo.model.FittedModel```, ``:data:``,
  ``:attr:``, ``:meth:``, ``:mod:``, ``:exc:``, ``:obj:``, ``:const:``) into an autorefs
  cross-reference to the object it names, resolved in the docstring's scope: a link where the
  object has an API entry, plain code where it has none (``optional``: no broken link);
* an ``Example`` heading into ``Examples``, the NumPy section Griffe renders as code blocks;
* a doctest directive (``# doctest: +SKIP``) into nothing.

mkdocs.yml loads it with ``extensions: [docs/griffe_docstrings.py]``.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|class|data|attr|meth|mod|exc|obj|const):`(~?)([^`<>]+?)(?:\s*<([\w.]+)>)?`")
DOCTEST_DIRECTIVE = re.compile(r"\s*#\s*doctest:[^\n]*")
EXAMPLE_HEADING = re.compile(r"^(\s*)Example\n(\s*)-------$", flags=re.MULTILINE)


def resolve(name: str, scope: griffe.Object) -> str | None:
    """The full path of ``name`` as written in a docstring of ``scope``, or None when it names nothing known."""
    collection = scope.modules_collection
    head, _, rest = name.partition(".")
    candidates = [name] if head in collection.members else []
    try:
        candidates.append(scope.resolve(head) + (f".{rest}" if rest else ""))
    except griffe.NameResolutionError:
        pass
    candidates.append(f"{scope.package.path}.{name}")
    for path in candidates:
        try:
            found = collection.get_member(path)
        except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
            continue
        try:
            return found.final_target.path if found.is_alias else found.path
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return path
    return None


def render_roles(text: str, scope: griffe.Object) -> str:
    """``text`` with each Sphinx role replaced by an (optional) autorefs cross-reference."""

    def replace(match: re.Match[str]) -> str:
        short, written, target = match.group(1) == "~", match.group(2).strip(), match.group(3)
        name = target or written.removesuffix("()")
        title = f"<code>{html.escape(written if target else name.rsplit('.', 1)[-1] if short else written)}</code>"
        path = resolve(name, scope)
        return f'<autoref identifier="{path}" optional>{title}</autoref>' if path else title

    return ROLE.sub(replace, text)


def tidy(text: str, scope: griffe.Object) -> str:
    """A docstring as mkdocstrings should see it."""
    text = DOCTEST_DIRECTIVE.sub("", text)
    text = EXAMPLE_HEADING.sub(r"\1Examples\n\2--------", text)
    return render_roles(text, scope)


def walk(obj: griffe.Object) -> Iterator[griffe.Object]:
    """``obj`` and every object defined in it (aliases left out: they show their target's docstring)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from walk(member)


class SphinxDocstrings(griffe.Extension):
    """Rewrite every docstring of a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for obj in walk(pkg):
            if obj.docstring is not None:
                obj.docstring.value = tidy(obj.docstring.value, obj)
