"""The order make test hands its files to the workers (tests/schedule.py): files it has no figure for first, then
the longest first, a file's tests together and in their order."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from schedule import DURATIONS, file_seconds, longest_files_first


def _items(*ids: str) -> list:  # noqa: ANN401 - what the hook reads of a pytest.Item: its node id
    return [SimpleNamespace(nodeid=i) for i in ids]


def test_the_longest_files_run_first_unknown_ones_before_them_and_a_files_tests_stay_together() -> None:
    items = _items("tests/a.py::x", "tests/b.py::x", "tests/a.py::y", "tests/c.py::x", "tests/new.py::x",
                   "tests/b.py::y", "tests/d.py::x")
    longest_files_first(items, {"tests/a.py": 3.0, "tests/b.py": 40.0, "tests/c.py": 12.5, "tests/d.py": 3.0})
    assert [i.nodeid for i in items] == ["tests/new.py::x", "tests/b.py::x", "tests/b.py::y", "tests/c.py::x",
                                         "tests/a.py::x", "tests/a.py::y", "tests/d.py::x"]


def test_the_table_is_read_as_figures_and_a_bad_one_orders_nothing(tmp_path: Path) -> None:
    table = tmp_path / "durations.json"
    table.write_text(json.dumps({"tests/a.py": 2, "tests/b.py": "long", "tests/c.py": 1.5}))
    assert file_seconds(table) == {"tests/a.py": 2.0, "tests/c.py": 1.5}
    table.write_text("[1, 2]")
    assert file_seconds(table) == {}
    assert file_seconds(tmp_path / "missing.json") == {}


def test_the_shipped_table_names_the_suites_long_files() -> None:
    seconds = file_seconds(DURATIONS)
    assert seconds and all(name.startswith("tests/") and name.endswith(".py") for name in seconds)
    assert all((DURATIONS.parent.parent / name).is_file() for name in sorted(seconds, key=seconds.get)[-10:])
