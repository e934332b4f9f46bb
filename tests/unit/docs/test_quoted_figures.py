"""Every benchmark figure the docs quote is in the benchmark JSON kept next to them.

``docs/benchmarks/<bench>.json`` is what ``python -m bench.<bench>`` printed in the run the docs
describe (``docs/benchmarks/RUN.md`` says when, where and at which commit). A figure quotes it by
naming its source right after it, in a code span: ``0.25 (`scheduling_throughput:
ratio_extender_to_plain_unthrottled`)``; in the table of docs/benchmarks.md the last column names
the source of the row's bold figure and, after ``floor:``, of its floor. A source is
``bench: path`` where the path walks the JSON: ``a.b`` keys, ``[3]`` an index, ``[nodes=5000]`` the
list element whose ``nodes`` is 5000. The figure must equal the value rounded to the figure's own
decimals (``1.37`` quotes 1.3712; thousands separators are allowed). So prose cannot quote a run the
JSON does not hold, and a new run that moves a figure fails here until the prose follows.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "docs" / "benchmarks"
QUOTING = [REPO / "docs" / "benchmarks.md", REPO / "README.md", REPO / "docs" / "architecture.md"]
SOURCE = r"`([a-z_]+):\s+([^`\s]+)`"
INLINE = re.compile(r"(\d[\d,]*(?:\.\d+)?)[^\d(`|]{0,12}\(" + SOURCE + r"\)")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]|\[([a-z_]+)=([^\]]+)\]")


def resolve(document: Any, path: str) -> Any:
    """The value at ``path`` (``a.b[2].c``, ``results[nodes=5000].p99_ms``) in ``document``."""
    value = document
    for key, index, field, wanted in STEP.findall(path):
        if key:
            value = value[key]
        elif index:
            value = value[int(index)]
        else:
            matches = [item for item in value if str(item.get(field)) == wanted]
            if len(matches) != 1:
                raise KeyError(f"{path}: {len(matches)} elements with {field}={wanted}")
            value = matches[0]
    return value


def quoted(text: str, value: Any) -> bool:
    """Whether the figure ``text`` quotes ``value`` (rounded to the figure's decimals)."""
    figure = Decimal(text.replace(",", ""))
    exponent = figure.as_tuple().exponent
    decimals = -exponent if isinstance(exponent, int) else 0
    return bool(Decimal(str(value)).quantize(Decimal(1).scaleb(-decimals)) == figure)


def load(bench: str) -> Any:
    path = RESULTS / f"{bench}.json"
    assert path.exists(), f"no {path.relative_to(REPO)}: run python -m bench.{bench} > {path.relative_to(REPO)}"
    return json.loads(path.read_text())


def table_quotes(text: str) -> list[tuple[str, str, str]]:
    """(figure, bench, path) of each row of a figures table whose last cell names its sources: the
    row's bold figure, and the floor (the cell before the sources) when they name one."""
    found = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not re.search(SOURCE, cells[-1]):
            continue
        sources = cells[-1].split("floor:")
        bold = re.search(r"\*\*(\d[\d,]*(?:\.\d+)?)", line)
        assert bold, f"a row with a source but no bold figure: {line}"
        bench, path = re.findall(SOURCE, sources[0])[0]
        found.append((bold.group(1), bench, path))
        if len(sources) > 1:
            floor_bench, floor_path = re.findall(SOURCE, sources[1])[0]
            number = NUMBER.search(cells[-2])  # the floor column comes just before the sources
            assert number, f"a floor source but no floor figure: {line}"
            found.append((number.group(0), floor_bench, floor_path))
    return found


def every_quote() -> list[tuple[str, str, str, str]]:
    found = []
    for doc in QUOTING:
        text = doc.read_text()
        found += [(doc.name, figure, bench, path) for figure, bench, path in INLINE.findall(text)]
        found += [(doc.name, figure, bench, path) for figure, bench, path in table_quotes(text)]
    return found


def test_the_docs_quote_the_benchmark_json() -> None:
    quotes = every_quote()
    assert len(quotes) >= 8, quotes  # the figures table alone has more
    wrong = []
    for doc, figure, bench, path in quotes:
        value = resolve(load(bench), path)
        if not quoted(figure, value):
            wrong.append(f"{doc}: {figure} quotes {bench}: {path}, which is {value}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("figure", "value", "ok"), [
    ("0.25", 0.2471, True), ("0.25", 0.2449, False), ("303,353", 303353, True), ("44.9", 44.94, True),
    ("1.37", 1.3712, True), ("4.3", 4.35, False),
])
def test_a_figure_quotes_its_value_rounded_to_its_own_decimals(figure: str, value: float, ok: bool) -> None:
    assert quoted(figure, value) is ok


def test_a_path_walks_keys_indexes_and_selected_elements() -> None:
    document = {"results": [{"nodes": 100, "warm": {"p99_ms": 0.5}}, {"nodes": 5000, "warm": {"p99_ms": 0.79}}]}
    assert resolve(document, "results[nodes=5000].warm.p99_ms") == 0.79
    assert resolve(document, "results[0].nodes") == 100
    with pytest.raises(KeyError):
        resolve(document, "results[nodes=7].warm")


def test_a_figure_the_json_does_not_hold_fails(tmp_path: Path) -> None:
    text = "ours reached 0.31 (`scheduling_throughput: ratio_extender_to_plain_unthrottled`) here"
    ((figure, bench, path),) = INLINE.findall(text)
    assert (figure, bench, path) == ("0.31", "scheduling_throughput", "ratio_extender_to_plain_unthrottled")
    assert not quoted(figure, 0.25)
