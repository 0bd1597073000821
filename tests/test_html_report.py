"""The self-contained HTML report, read as a user reads it: in a real browser (Debian's
headless ``chromium``, skipped where it is absent; ``.ci/run`` installs it), on the default
protocol's shape (every shots value beside "all", five seeds), two models with saved
predictions."""

import html
import json
import re
import shutil
import subprocess

import numpy as np
import pytest
from test_concept_accuracy import _default_shape_predictions

from imagenet_cog import Results
from imagenet_cog._grid import DOMAINS, SEEDS, SHOTS

CHROMIUM = next(
    (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
    None,
)
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless chromium (Debian: apt-get install chromium)"
)
#: The verdict banner's background (report.css: --bad-bg).
BANNER_RGB = (253, 236, 234)


def _write_runs(root, models=("alpha", "beta")):
    """Runs of the default protocol's shape, each with saved predictions (30 concepts per
    level), as ``evaluate`` lays them out."""
    for k, name in enumerate(models):
        run = root / name
        bound = {}  # each cell's predictions file and its sha256, as its record names them
        _default_shape_predictions(run, per_level=30, written=bound)
        cells = [
            {
                "model": name,
                "domain": d,
                "shots": n,
                "seed": s,
                "top1": 60.0 - 10 * k - 4 * i - 3 * (8 - j) + 0.2 * q,
            }
            for i, d in enumerate(DOMAINS)
            for j, n in enumerate(SHOTS)
            for q, s in enumerate(SEEDS)
        ]
        for cell in cells:
            cell.update(bound[(cell["domain"], cell["shots"], cell["seed"])])
        (run / "runs.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cells))
    return [root / m for m in models]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """``imagenet-cog report alpha beta --html report.html --compare alpha,beta``."""
    from imagenet_cog.cli import main

    root = tmp_path_factory.mktemp("html")
    runs = _write_runs(root)
    out = root / "report.html"
    argv = ["report", *map(str, runs), "--html", str(out), "--compare", "alpha,beta"]
    assert main(argv) in (0, None)
    return out


def test_the_command_writes_one_file_and_says_its_size(tmp_path, capsys):
    from imagenet_cog.cli import main

    runs = _write_runs(tmp_path)
    out = tmp_path / "r.html"
    assert main(["report", *map(str, runs), "--html", str(out)]) in (0, None)
    err = capsys.readouterr().err
    assert re.search(rf"wrote {re.escape(str(out))} \(\d+\.\d MB, self-contained\)", err)
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_nothing_is_fetched_and_everything_is_inline(report):
    page = report.read_text()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r"<(link|img|iframe|object|embed)\b", page)
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"url\((?!#|data:)", page)
    assert not re.search(r"@import", page)
    hrefs = re.findall(r'href="([^"]*)"', page)
    assert hrefs and all(h.startswith("#") for h in hrefs), hrefs


def test_the_answer_comes_first_then_the_verdict(report):
    page = report.read_text()
    order = [page.index(f'<section id="{s}"') for s in ("answer", "verdict", "figures")]
    assert order == sorted(order)
    answer = page[order[0] : order[1]]
    assert "Your 2 models among 33 models (all training images; rank 1 = best)" in answer
    assert "(32)*/33" in answer and "relative change" in answer
    assert "NOT COMPARABLE with the paper: alpha, beta" in page[order[1] : order[2]]


def test_readable_without_its_script(report):
    page = report.read_text()
    # Every concept, every table and every figure is in the page itself.
    assert page.count('<tr data-level="') == 5 * 30
    assert page.count("<svg") == 4
    for domain in ("in1k", "l1", "l5"):
        assert f'id="table-{domain}"' in page
    assert "<pre>alpha vs beta, top-1 (points), N=All: one-sided test" in page
    assert 'id="provenance"' in page


def test_the_page_reads_again_nothing_that_results_loaded(tmp_path):
    # Results.load reads each run's config.json and runs.jsonl; the page is made from what it
    # read (its provenance, the levels of its concepts): with those files gone after loading,
    # the page is the same. Only the saved predictions, which Results does not load, are read.
    from helpers import write_run_folder

    from imagenet_cog import load_levels
    from imagenet_cog._runfolder import read_records

    official = load_levels("official").checksum
    runs = _write_runs(tmp_path)
    for run in runs:
        records = [r for _, r in read_records(run / "runs.jsonl")]
        config = {"model": run.name, "levels": "official", "levels_sha256": official}
        write_run_folder(run, config, records)
    results = Results.load(runs[0]).merge(Results.load(runs[1]))

    def page():  # but the times it was made
        made = re.sub(r"on \d{4}-\d\d-\d\d \d\d:\d\d UTC", "", results.to_html())
        return re.sub(r"<dc:date>[^<]*</dc:date>", "", made)

    made = page()
    assert made.count('<tr data-level="') == 5 * 30
    assert made.count("config.json sha256 (checked by verify)</dt><dd>none") == 0
    assert made.count("40 cells, 40 with their own sha256") == 0  # 6 domains x 9 shots x 5
    assert made.count("270 cells, 270 with their own sha256") == 2
    for run in runs:
        (run / "config.json").unlink()
        (run / "runs.jsonl").unlink()
    assert page() == made


def test_every_name_is_escaped(tmp_path):
    cells = [
        {"model": '<img src=x onerror="alert(1)">', "domain": d, "shots": "all", "top1": 50.0}
        for d in DOMAINS
    ]
    page = Results(cells).to_html()
    assert "<img" not in page and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in page


# ------------------------------------------------------------------ in the browser
_CAPTURE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) { window.__errors.push(String(e.message)); });
(function () {
  var original = console.error;
  console.error = function () {
    window.__errors.push(Array.prototype.join.call(arguments, " "));
    original.apply(console, arguments);
  };
})();
</script>"""

_PROBE = """<script>
(function () {
  function visible() {
    return Array.prototype.filter.call(
      document.querySelectorAll("#concepts-table tbody tr"), function (r) { return !r.hidden; });
  }
  function column(i) {
    return visible().slice(0, 8).map(function (r) { return r.cells[i].getAttribute("data-sort"); });
  }
  var out = {errors: window.__errors,
             resources: performance.getEntriesByType("resource").map(function (e) { return e.name; })};
  var search = document.getElementById("concept-search");
  search.value = "WNID";
  search.dispatchEvent(new Event("input"));
  out.found = visible().map(function (r) { return r.cells[0].textContent; });
  out.count = document.getElementById("concept-count").textContent;
  search.value = "";
  search.dispatchEvent(new Event("input"));
  var level = document.getElementById("concept-level");
  level.value = "L3";
  level.dispatchEvent(new Event("change"));
  out.levels = visible().map(function (r) { return r.getAttribute("data-level"); });
  level.value = "";
  level.dispatchEvent(new Event("change"));
  out.before = column(5);
  var head = document.querySelectorAll("#concepts-table thead th")[5];
  head.click();
  out.ascending = column(5);
  head.click();
  out.descending = column(5);
  out.sorted = head.getAttribute("aria-sort");
  var b = document.getElementById("model-b");
  b.value = "0";
  b.dispatchEvent(new Event("change"));
  out.selfDifference = visible().slice(0, 5).map(function (r) {
    return r.querySelector("td.diff").textContent; });
  out.figures = Array.prototype.map.call(document.querySelectorAll("#figures svg"), function (s) {
    var box = s.getBoundingClientRect();
    return [box.width, box.height, s.querySelectorAll("path").length];
  });
  out.bannerTop = document.querySelector(".verdict.bad").getBoundingClientRect().top;
  var pre = document.createElement("pre");
  pre.id = "probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def _chromium(*args):
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        # Any host name fails to resolve: a request to the network could not succeed unseen.
        "--host-resolver-rules=MAP * ~NOTFOUND",
        "--window-size=1280,800",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)


@pytest.fixture(scope="module")
def probed(report, tmp_path_factory):
    """What the page does in the browser: the report with a probe that records its errors and
    requests, then searches, filters, sorts and measures, as a user's clicks would."""
    if CHROMIUM is None:
        pytest.skip("no headless chromium")
    page = report.read_text()
    wnid = re.search(r'<tr data-level="L2"[^>]*><td class="text">(n\d{8})<', page)[1]
    page = page.replace("<head>", "<head>\n" + _CAPTURE, 1)
    page = page.replace("</body>", _PROBE.replace("WNID", wnid) + "\n</body>", 1)
    copy = tmp_path_factory.mktemp("probe") / "probed.html"
    copy.write_text(page)
    run = _chromium("--virtual-time-budget=10000", "--dump-dom", copy.as_uri())
    found = re.search(r'<pre id="probe">(.*?)</pre>', run.stdout, re.DOTALL)
    assert found, run.stderr[-3000:]
    return wnid, json.loads(html.unescape(found[1]))


@needs_browser
def test_the_page_loads_with_no_error_and_no_request(probed):
    _, out = probed
    assert out["errors"] == []
    assert out["resources"] == []


@needs_browser
def test_the_search_finds_a_concept_by_wnid_and_the_level_filter_keeps_its_level(probed):
    wnid, out = probed
    assert out["found"] == [wnid] and out["count"] == "1 of 150 concepts"
    assert len(out["levels"]) == 30 and set(out["levels"]) == {"L3"}


@needs_browser
def test_sorting_reorders_the_rows(probed):
    _, out = probed
    ascending = [float(x) for x in out["ascending"]]
    descending = [float(x) for x in out["descending"]]
    assert ascending == sorted(ascending) and descending == sorted(descending, reverse=True)
    assert out["before"] != out["ascending"] and out["sorted"] == "descending"
    # A model minus itself is 0 everywhere.
    assert set(out["selfDifference"]) == {"0.0"}


@needs_browser
def test_the_figures_render(probed):
    _, out = probed
    assert len(out["figures"]) == 4
    for width, height, paths in out["figures"]:
        assert width > 300 and height > 150 and paths > 50


@needs_browser
def test_the_verdict_banner_is_in_the_first_screen(report, tmp_path):
    from PIL import Image

    shot = tmp_path / "first.png"
    run = _chromium(f"--screenshot={shot}", report.as_uri())
    assert shot.is_file(), run.stderr[-2000:]
    px = np.asarray(Image.open(shot).convert("RGB"))
    assert px.shape[:2] == (800, 1280)
    banner = np.all(px == BANNER_RGB, axis=-1)
    assert banner.sum() > 20_000, banner.sum()  # a band of the page's width
    rows = np.nonzero(banner.any(axis=1))[0]
    assert rows.max() < 800


@needs_browser
def test_the_concept_explorer_screenshot_shows_the_table(report, tmp_path):
    from PIL import Image

    # The explorer alone on the first screen: the other sections hidden by one rule.
    page = report.read_text().replace(
        "</head>", "<style>section:not(#concepts){display:none}</style></head>", 1
    )
    copy = tmp_path / "explorer.html"
    copy.write_text(page)
    shot = tmp_path / "explorer.png"
    _chromium(f"--screenshot={shot}", copy.as_uri())
    px = np.asarray(Image.open(shot).convert("L"))
    # Text and rules over most of the screen, not a blank page.
    inked_rows = (px < 160).any(axis=1).mean()
    assert inked_rows > 0.5, inked_rows
