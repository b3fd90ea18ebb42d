"""benchmarks/report.py: the result lines benchmarks print become one Markdown table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import report  # noqa: E402
import results  # noqa: E402


def test_a_result_line_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    results.emit("tick | SQLite", "504 ms", "insert 157 ms", "3.2×", "<= 3×", False)
    (line,) = capsys.readouterr().out.splitlines()
    assert results.parse(line) == {
        "figure": "tick | SQLite",
        "value": "504 ms",
        "baseline": "insert 157 ms",
        "ratio": "3.2×",
        "target": "<= 3×",
        "met": False,
    }
    assert results.parse("tick 504 ms") is None


def test_the_table_has_a_row_per_result_and_escapes_pipes() -> None:
    met = {"figure": "a|b", "value": "1", "baseline": "2", "ratio": "0.5×", "target": "t"}
    table = report.table([("one", met | {"met": True}), ("two", met | {"met": None})])
    lines = table.splitlines()
    assert lines[0].startswith("| benchmark | figure |") and len(lines) == 4
    assert lines[2] == "| one | a\\|b | 1 | 2 | 0.5× | t | yes |"
    assert lines[3].endswith("| t |  |")


def test_a_benchmark_that_prints_no_result_gets_a_row_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "silent.py").write_text("print('nothing to report')\n")
    (tmp_path / "failing.py").write_text("raise SystemExit(3)\n")
    monkeypatch.setattr(report, "HERE", tmp_path)
    monkeypatch.setattr(report, "BENCHMARKS", ("silent", "failing"))
    out = tmp_path / "report.md"
    monkeypatch.setattr(sys, "argv", ["report.py", "--out", str(out)])
    report.main()
    text = out.read_text()
    assert "| silent | (printed no bench-result line; see its output above) |" in text
    assert "| failing | (exited 3; see its output above) |" in text


@pytest.mark.parametrize("name", report.BENCHMARKS)
def test_every_benchmark_of_make_bench_starts(name: str) -> None:
    """Each benchmark make bench runs imports and parses its options (`--help`): a name one
    of them imports from another must still be there (mypy does not read benchmarks/)."""
    script = report.HERE / f"{name}.py"
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


OTHER_SCRIPTS = sorted(
    path.stem
    for path in report.HERE.glob("*.py")
    if "argparse" in path.read_text() and path.stem not in report.BENCHMARKS
)


@pytest.mark.parametrize("name", OTHER_SCRIPTS)
def test_every_other_benchmark_script_starts(name: str) -> None:
    """The benchmarks make bench leaves out (profiles, --against runs, the Ray head restart)
    start too: they import from the others as well."""
    test_every_benchmark_of_make_bench_starts(name)


def test_the_other_scripts_are_found() -> None:
    assert {"dataset_materialise", "tree_reads", "report"} <= set(OTHER_SCRIPTS)
