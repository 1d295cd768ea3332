"""bench.report's page and charts, and the result store (bench.history, diff's lookup), on the committed real
result of the CPU twin and a slower copy of it (its concurrency-2 levels halved, served with --max-num-seqs 1:
what a planted slowdown looks like; the measured one is benchmarks/bench_noise.py's job)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sparkforge.errors import RunError
from sparkforge.run.bench.charts import charts, page
from sparkforge.run.bench.compare import compare_docs
from sparkforge.run.bench.results import load_result
from sparkforge.run.bench.store import history, image_key, latest_pair, of_image, save

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "real"
BASE = RESULTS / "bench-cpu-twin-default.json"
ARENA = RESULTS / "bench-cpu-twin-spark-arena-v2.json"
REPO = Path(__file__).parents[2]


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.rows: list[list[str]] = []
        self._row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append(dict(attrs).get("src") or "")
        if tag == "tr":
            self._row = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and data.strip():
            self._row.append(data.strip())


PLANTED = Path("planted-maxseqs1.json")


def _docs() -> list[tuple[Path, dict]]:
    base = load_result(BASE)
    slower = json.loads(json.dumps(base))
    argv = slower["identity"]["serve"]["argv"]
    argv[argv.index("--max-num-seqs") + 1] = "1"
    slower["identity"]["date"] = "2026-12-31T00:00:00+00:00"  # later, for the store's order
    for check in slower["checks"]:
        if check["details"]["concurrency"] == 2:
            for repeat in check["details"]["repeats"]:
                repeat["output_tok_s"] /= 2
            values = [r["output_tok_s"] for r in check["details"]["repeats"]]
            check["details"]["summary"]["output_tok_s"] = {
                "median": sum(values) / len(values),
                "min": min(values),
                "max": max(values),
            }
    return [(BASE, base), (PLANTED, slower)]


def test_the_page_holds_both_charts_the_identities_and_the_comparison(tmp_path: Path) -> None:
    docs = _docs()
    pngs = charts(docs)
    assert set(pngs) == {"by-concurrency", "by-depth"}
    comparison = compare_docs(docs[0][1], docs[1][1], ("base", "planted"), 10, allow_different=True)
    html = page(docs, pngs, comparison)
    parsed = _Page()
    parsed.feed(html)
    assert len(parsed.images) == 2
    for src in parsed.images:
        assert base64.b64decode(src.removeprefix("data:image/png;base64,"))[:8] == b"\x89PNG\r\n\x1a\n"
    files = [row[0] for row in parsed.rows if row and row[0].endswith(".json")]
    assert files == [BASE.name, PLANTED.name]
    verdicts = {row[0]: row[1] for row in parsed.rows if len(row) >= 3 and ":" in row[0]}
    assert verdicts["c2-d0:output_tok_s"] == "failed"  # the planted slowdown, in the table
    row = next(r for r in parsed.rows if r and r[0] == "c2-d0:output_tok_s")
    # with its verdict, ratio, interval, smallest detectable slowdown and repeat counts
    assert row[2] == "regressed" and float(row[3]) < 0.9 and "(95%)" in row[4] and row[5].startswith(">= ")
    low, high = (float(x) for x in row[4].split(" ")[0].split(".."))
    assert low <= float(row[3]) <= high < 0.9 and row[6] == "3/3"
    assert "serve argv" in html  # the allowed difference is listed on the page
    path = tmp_path / "report.html"
    path.write_text(html)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium:  # a real browser renders it: the DOM it built holds both images
        dom = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri()],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        assert dom.count("data:image/png;base64,") == 2 and "c2-d0:output_tok_s" in dom


def test_charts_refuse_mixed_suites_and_single_levels(tmp_path: Path) -> None:
    docs = _docs()
    other = json.loads(json.dumps(docs[1][1]))
    other["suite"]["name"] = "quick"
    with pytest.raises(RunError, match="different suites"):
        charts([docs[0], (PLANTED, other)])
    one = json.loads(json.dumps(docs[0][1]))
    one["checks"] = one["checks"][:1]
    with pytest.raises(RunError, match="measured one level only"):
        charts([(BASE, one)])


def test_the_store_keeps_results_by_image_and_lists_a_recipes_history(tmp_path: Path) -> None:
    docs = _docs()
    for _, doc in docs:
        save(doc, json.dumps(doc), tmp_path)
    key = image_key(docs[0][1]["identity"]["image"])
    assert key.startswith("sha256-") and len(list((tmp_path / key).glob("*.json"))) == 2
    (tmp_path / key / "broken.json").write_text("{")
    found, unreadable = history(docs[0][1]["identity"]["recipe"], None, tmp_path)
    assert [s.doc["identity"]["date"] for s in found] == sorted(d["identity"]["date"] for _, d in docs)
    assert len(unreadable) == 1 and "broken.json" in unreadable[0]
    latest = of_image({docs[0][1]["identity"]["image"]["id"]}, tmp_path)[-1]
    assert latest.doc["identity"]["date"] == max(d["identity"]["date"] for _, d in docs)
    assert of_image({"sha256:" + "0" * 64}, tmp_path) == []


def test_diff_without_bench_files_pairs_the_newest_results_of_one_suite_by_image_digest(
    tmp_path: Path,
) -> None:
    default, arena = (json.loads(p.read_text()) for p in (BASE, ARENA))
    x, y = "sha256:" + "1" * 64, "sha256:" + "2" * 64  # image X known by its registry digest, Y by its ID
    written = {}
    for name, doc, image, date in (("x-default", default, {"id": "sha256:" + "9" * 64, "digests": [f"r/x@{x}"]},
                                    "2026-12-01T10:00:00+00:00"), ("x-arena", arena, {"id": x}, "2026-12-01T12:00:00+00:00"),
                                   ("y-arena", arena, {"id": y}, "2026-12-01T09:00:00+00:00"),
                                   ("y-default", default, {"id": y}, "2026-12-01T11:00:00+00:00")):  # fmt: skip
        doc = json.loads(json.dumps(doc))
        doc["identity"].update(image=image, date=date)
        written[name] = save(doc, json.dumps(doc), tmp_path)
    pair = latest_pair({f"r/x@{x}"}, {y}, tmp_path)  # Y's newest is a default result: X's default one
    assert pair is not None and [s.path for s in pair] == [written["x-default"], written["y-default"]]
    pair = latest_pair({y}, {x}, tmp_path)  # X's newest is llama-benchy's: Y's llama-benchy result
    assert pair is not None and [s.path for s in pair] == [written["y-arena"], written["x-arena"]]
    pair = latest_pair(
        {y}, {y}, tmp_path
    )  # one image against itself: its two newest of one suite? none twice
    assert pair is None
    assert latest_pair({x}, {"sha256:" + "0" * 64}, tmp_path) is None


def test_history_and_report_tasks_answer_in_one_paragraph(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True
        )

    out = run(
        "bench.history", "--recipe", "tests/recipes/ci-cpu-twin.yaml", "--store", str(tmp_path / "empty")
    )
    assert (
        out.returncode == 1
        and "no stored result of recipe ci-cpu-twin" in out.stderr
        and "fix:" in out.stderr
    )
    out = run("bench.report", str(BASE))
    assert out.returncode == 1 and "nothing to write; fix: pass --html" in out.stderr
    out = run("bench.compare", str(BASE), str(BASE), "--threshold", "nan")
    assert (
        out.returncode == 1
        and "--threshold 'nan' is not a number above 0" in out.stderr
        and "Traceback" not in out.stderr
    )
