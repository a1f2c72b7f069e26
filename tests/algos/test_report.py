"""``rlstruct report``: one HTML page that opens from disk, rendered in headless Chromium (Debian's ``chromium``, as
tests/project/test_docs.py runs it) and read back as the browser shows it."""

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

pytest.importorskip("scipy.stats", reason="rlstruct report needs scipy: pip install 'rlstruct[stats]'")
pytest.importorskip("matplotlib", reason="rlstruct report draws with matplotlib: pip install 'rlstruct[plot]'")

from rlstruct.algos._train import cli  # noqa: E402

from .test_compare import _runs, _two_groups  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_TIMEOUT_S = 90


class _Page(HTMLParser):
    """What a page holds: its text by section, its tags, every URL an element would load."""

    def __init__(self):
        super().__init__()
        self.text, self.tags, self.urls, self.ids = [], [], [], set()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name == "id":
                self.ids.add(value)
            if name in ("src", "href", "xlink:href") and value and not value.startswith("#"):
                self.urls.append(value)

    def handle_data(self, data):
        if data.strip():
            self.text.append(data.strip())


def _report(tmp_path, capsys):
    _two_groups(tmp_path)
    _runs(tmp_path / "a" / "late", [1.0])  # not a run of group a: a folder inside it that holds a run
    (tmp_path / "b" / "seed-2" / "summary.json").write_text(json.dumps({"eval_return": None, "stop_reason":
                                                                        "diverged"}))
    page = tmp_path / "report.html"
    assert cli.main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--reference", "ppo-cartpole",
                     "--allow-missing", "--resamples", "200", "--output", str(page)]) == 0
    assert capsys.readouterr().out.strip() == f"report: {page}"
    return page


def test_the_report_is_one_self_contained_page(tmp_path, capsys):
    page = _report(tmp_path, capsys)
    html = page.read_text()
    parsed = _Page()
    parsed.feed(html)
    # nothing to fetch: no script, no stylesheet link, no image file, no URL but the SVG namespaces
    assert "script" not in parsed.tags and "link" not in parsed.tags and "img" not in parsed.tags
    assert not parsed.urls, parsed.urls
    assert set(re.findall(r"https?://[^\"' )]+", html)) == {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}
    assert {"curves", "profiles"} <= parsed.ids and parsed.tags.count("svg") == 2
    text = " ".join(parsed.text)
    assert "IQM of 3 runs" in text and "ref:ppo-cartpole" in text and "left out: diverged" in text
    assert "rlstruct train ppo --env CartPole-v1 --seed 0 --logdir" in text


def test_the_report_refuses_a_bad_output_in_one_line(tmp_path, capsys):
    _two_groups(tmp_path)
    assert cli.main(["report", str(tmp_path / "a"), "--output", str(tmp_path / "r.pdf")]) == 2
    assert capsys.readouterr().err.strip() == (f"rlstruct report: error: --output must name an .html file, got "
                                               f"'{tmp_path / 'r.pdf'}'; pass e.g. report.html")
    assert cli.main(["report", str(tmp_path / "a"), "--output", str(tmp_path / "no" / "r.html")]) == 2
    assert "--output must be in an existing folder" in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def _chromium(*args, out_dir):
    # --no-sandbox: the tests may run as root (a container, CI); a fresh profile keeps runs independent.
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           "--hide-scrollbars", f"--user-data-dir={out_dir / 'profile'}", "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium; make docs-check "
                                             "installs it)")
def test_the_report_renders_in_chromium_with_its_curves_and_tables(tmp_path, capsys):
    page = _report(tmp_path, capsys)
    url = page.as_uri()
    proc = _chromium("--dump-dom", url, out_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Page()
    dom.feed(proc.stdout)
    # What the browser built from the file: both figures as SVG, the tables, the runs and their states
    assert {"curves", "profiles"} <= dom.ids and dom.tags.count("svg") == 2 and dom.tags.count("table") >= 5
    text = " ".join(dom.text)
    for shown in ("Learning curves", "Aggregate statistics", "Per env", "AUC (IQM)", "P(a > b)", "finished",
                  "left out: diverged", "recorded runs 'ppo-cartpole'", "ppo-cartpole/seed-2"):
        assert shown in text, shown
    # What it drew: a screenshot of the page's top shows the curves' lines in matplotlib's first two colours
    shot = tmp_path / "report.png"
    proc = _chromium("--window-size=1000,900", f"--screenshot={shot}", url, out_dir=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    from matplotlib.image import imread

    pixels = (imread(shot)[..., :3] * 255).round()
    for colour in ((31, 119, 180), (255, 127, 14)):  # C0 blue, C1 orange
        near = (abs(pixels - colour).max(axis=-1) <= 12).sum()
        assert near > 50, (colour, near)
