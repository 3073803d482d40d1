"""The shape of the two product files: lines within 100 characters, functions within 50
lines, and regression.py's table of sections naming its banners, in order."""

import ast
import pathlib
import re

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
