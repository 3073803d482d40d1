"""The shape of the two product files: lines within 100 characters, functions within 50
lines, and regression.py's table of sections naming its banners, in order."""

import ast
import pathlib
import re
import symtable

import pytest

HERE = pathlib.Path(__file__).parent
FILES = ("regression.py", "compare_runs.py")
BANNER = re.compile(r"^# (?:=|-){20,} (.+)$")


def source(name):
    return (HERE / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", FILES)
def test_every_line_is_at_most_100_characters(name):
    long = [n for n, line in enumerate(source(name).splitlines(), 1) if len(line) > 100]
    assert long == [], f"{name}: lines over 100 characters: {long[:10]}"


@pytest.mark.parametrize("name", FILES)
def test_no_function_is_longer_than_50_lines(name):
    tree = ast.parse(source(name))
    long = [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > 50]
    assert long == [], f"{name}: functions over 50 lines: {long}"


def test_the_table_of_sections_names_every_banner_in_order():
    text = source("regression.py")
    banners = [match.group(1) for line in text.splitlines() if (match := BANNER.match(line))]
    doc = ast.get_docstring(ast.parse(text))
    table = doc.split("Sections (", 1)[1].split("\n", 1)[1]
    listed = [re.split(r"\s{2,}", line.strip())[0] for line in table.splitlines() if line.strip()]
    assert listed == banners and len(banners) > 20


TABLES = {"CHECKS", "PROVIDERS", "CHECK_TABLE", "BEHAVIORS", "MODES", "REPORTS"}


def _globals_read(table, found):
    """The module-level names a function or class (and everything nested in it) reads."""
    found.update(symbol.get_name() for symbol in table.get_symbols()
                 if symbol.is_referenced() and symbol.is_global())
    for child in table.get_children():
        _globals_read(child, found)
    return found


def back_references(text):
    """[(room, definition, later room, name)] of each top-level function or class that reads a
    name defined under a later banner, other than through a table."""
    tree, lines = ast.parse(text), text.splitlines()
    banners = [n for n, line in enumerate(lines, 1) if BANNER.match(line)]
    room = lambda lineno: sum(1 for at in banners if at < lineno)  # noqa: E731
    home = {}
    for node in tree.body:
        targets = [node] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else \
            getattr(node, "targets", [getattr(node, "target", None)])
        for target in filter(None, targets):
            names = [target.name] if hasattr(target, "name") else \
                [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
            for name in names:
                home.setdefault(name, room(node.lineno))
    tables = {(t.get_name(), t.get_lineno()): t
              for t in symtable.symtable(text, "regression.py", "exec").get_children()}
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            reads = _globals_read(tables[(node.name, node.lineno)], set()) - TABLES
            found += [(room(node.lineno), node.name, home[name], name) for name in sorted(reads)
                      if home.get(name, 0) > room(node.lineno)]
    return found


def test_no_room_reads_a_later_one_but_through_a_table():
    assert back_references(source("regression.py")) == []


def test_a_reference_into_a_later_room_is_found():
    text = ("# " + "=" * 30 + " first\ndef early():\n    return late()\n\n\n"
            "# " + "=" * 30 + " second\ndef late():\n    return CHECKS\n\n\nCHECKS = {}\n")
    assert back_references(text) == [(1, "early", 2, "late")]
