"""A griffe extension for the API reference: docstrings of the compiled modules, in Markdown.

griffe reads cowmap's source statically. The compiled modules (``cowmap._core``,
``cowmap._timers``, ...) have only their ``.pyi`` stubs there: the signatures with their types,
but few docstrings. Their real docstrings live in the ``.pyx`` sources and reach Python with the
built extension, so this extension imports each compiled module and gives every class,
function, method and property of its stub the docstring the compiled object carries (without
the signature line Cython embeds in some), keeping the stub's own where the compiled object
has none.

A class attribute bound to a compiled function (the states' async twins, such as
``async_value = _requests.async_value``) is shown as the method it is, with the function's
signature and docstring. An attribute without a docstring takes the ``#:`` comment lines just above it, if any (the code
documents attributes that way). Every docstring of the package is then made Markdown: reST roles
(``:class:`X```, ``:meth:`~a.b.c```) become code spans (``X``, ``c``), doctest examples become
``pycon`` code blocks, a paragraph's closing ``::`` (reST's literal block marker) becomes ``:``,
and a line that starts with ``>`` stays text.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")
_PROMPT = re.compile(r"^(\s*)>>>(?: |$)")


def _markdown(text: str) -> str:
    """``text`` with reST roles as code spans and doctest examples fenced as ``pycon``."""
    text = _ROLE.sub(_code_span, text)
    text = re.sub(r"(\S)::$", r"\1:", text, flags=re.M)  # reST's "text::" before a literal block
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = _PROMPT.match(lines[i])
        if not m:
            # a line that starts with ">" (">= 4 entries") is text, not a quote
            out.append(re.sub(r"^( {0,3})>", r"\1\\>", lines[i]))
            i += 1
            continue
        indent = m.group(1)
        block = []
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            block.append(lines[i][len(indent):])
            i += 1
        if out and out[-1].strip():
            out.append("")
        out += [indent + "```pycon", *(indent + b for b in block), indent + "```"]
        if i < len(lines) and lines[i].strip():
            out.append("")
    return "\n".join(out)


def _code_span(m: re.Match[str]) -> str:
    """A reST role as a code span: ``:meth:`~a.B.c``` shows ``c``, as Sphinx would."""
    target = m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2)
    return f"`{target}`"


def _signature_line(name: str) -> re.Pattern[str]:
    """The signature Cython's ``embedsignature`` puts first in a docstring."""
    return re.compile(r"^\s*(?:\w+\.)*" + re.escape(name) + r"\(.*?\)(?:\s*->\s*[^\n]*)?\s*(?:\n\s*\n|\Z)", re.S)


def _own_doc(obj: Any, name: str, owner: Any = None) -> str | None:
    """The docstring ``obj`` carries itself: not one inherited from ``object`` or its type."""
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    if owner is not None and doc == getattr(getattr(object, name, None), "__doc__", None):
        return None
    if not (inspect.isclass(obj) or callable(obj) or isinstance(obj, property) or inspect.isdatadescriptor(obj)):
        return None  # a constant: its doc is its type's
    doc = _signature_line(name).sub("", doc, count=1)
    return inspect.cleandoc(doc) or None


class CompiledDocstrings(griffe.Extension):
    """Fill the compiled modules' stubs with their docstrings; make every docstring Markdown."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "cowmap":
            return
        for module in _modules(pkg):
            if module.filepath and str(module.filepath).endswith(".pyi"):
                try:
                    runtime = importlib.import_module(module.path)
                except ImportError:
                    continue  # not built: the stubs' docstrings alone
                _fill(module, runtime)
        for obj in _objects(pkg):
            if obj.is_class:
                _bind_compiled_methods(obj, pkg)
        for obj in _objects(pkg):
            if obj.docstring is None and obj.is_attribute:
                _comment_docstring(obj)
            if obj.docstring is not None:
                obj.docstring.value = _markdown(obj.docstring.value)


def _bind_compiled_methods(cls: griffe.Object, pkg: griffe.Module) -> None:
    """Class attributes bound to a compiled function (``async_value = _requests.async_value``)
    become methods, with the function's signature and docstring."""
    for name, member in list(cls.members.items()):
        if member.is_alias or not member.is_attribute:
            continue
        m = re.fullmatch(r"(_\w+)\.(\w+)", str(getattr(member, "value", "")))
        module = pkg.members.get(m.group(1)) if m else None
        target = module.members.get(m.group(2)) if m and module is not None and not module.is_alias else None
        if target is None or target.is_alias or not target.is_function:
            continue
        method = griffe.Function(
            name, lineno=member.lineno, endlineno=member.endlineno, parameters=target.parameters,
            returns=target.returns, docstring=target.docstring,
        )
        cls.set_member(name, method)


@functools.cache
def _source_lines(path: str) -> list[str]:
    return Path(path).read_text(encoding="utf-8").splitlines()


def _comment_docstring(obj: griffe.Object) -> None:
    """An attribute's ``#:`` comment lines just above it (Sphinx's attribute docs) as its docstring."""
    if not obj.filepath or not obj.lineno or isinstance(obj.filepath, list):
        return
    lines = _source_lines(str(obj.filepath))
    i, found = obj.lineno - 2, []
    while i >= 0 and lines[i].strip().startswith("#:"):
        found.insert(0, lines[i].strip()[2:].strip())
        i -= 1
    if found:
        obj.docstring = griffe.Docstring("\n".join(found), parent=obj)


def _modules(module: griffe.Module) -> list[griffe.Module]:
    out = [module]
    for member in module.members.values():
        if not member.is_alias and member.is_module:
            out += _modules(member)  # type: ignore[arg-type]
    return out


def _objects(obj: griffe.Object) -> list[griffe.Object]:
    out = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            out += _objects(member)  # type: ignore[arg-type]
    return out


def _fill(obj: griffe.Object, runtime: Any) -> None:
    for name, member in obj.members.items():
        if member.is_alias:
            continue
        if inspect.isclass(runtime):
            value = inspect.getattr_static(runtime, name, None)  # (a property, not its value)
        else:
            value = getattr(runtime, name, None)
        if value is None:
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if member.is_class or member.is_function or member.is_attribute:
            doc = _own_doc(value, name, owner=runtime if inspect.isclass(runtime) else None)
            if doc is not None:
                member.docstring = griffe.Docstring(doc, parent=member)
        if member.is_class:
            _fill(member, value)  # type: ignore[arg-type]
