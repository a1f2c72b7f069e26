"""The documentation site builds strictly, documents every public name, and renders in a browser.

The site is built once (``mkdocs build --strict``, in a child forked from the test's process: a broken link, a
missing reference or a docstring that does not render fails it), then read three ways: its objects inventory against
the packages' ``__all__``, its pages' text against the docstrings, and headless Chromium (Debian's ``chromium``)
loading pages served on 127.0.0.1, with every local asset that the rendered DOM references fetched and the server's
log checked for 404s.
``make docs-check`` installs what these tests need; they skip, saying why, where it is missing.
"""

from __future__ import annotations

import functools
import html
import importlib
import inspect
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest

from tests.helpers import ForkedCommand

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rlstruct", "rlstruct.envs", "rlstruct.agents", "rlstruct.batchers", "rlstruct.algos",
            "rlstruct.algos.harness")
# Where each package's reference lives in the built site.
PAGES = {"rlstruct": "api/rlstruct/", "rlstruct.envs": "api/envs/", "rlstruct.agents": "api/agents/",
         "rlstruct.batchers": "api/batchers/", "rlstruct.algos": "api/algos/",
         "rlstruct.algos.harness": "api/harness/"}
# The pages a reader is checked to see: the start page, one algorithm page, one API page.
BROWSED = ("", "algorithms/ppo/", "api/batchers/")
BUILD_TIMEOUT_S = 300
CHROMIUM_TIMEOUT_S = 90

# One xdist worker builds the site, once: the build lays out the package's tree in the repository's build/docs-api,
# which a second build at the same time would pull from under the first.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_S + 4 * CHROMIUM_TIMEOUT_S),
              pytest.mark.xdist_group("docs")]

for _module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
    pytest.importorskip(_module, reason=f"the docs build needs {_module}: pip install -e '.[docs]' (make docs)")


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


needs_chromium = pytest.mark.skipif(
    _chromium() is None, reason="needs Debian's chromium (apt-get install -y chromium; make docs-check installs it)"
)


def _build_site(out: Path) -> int:
    """``mkdocs build --strict --site-dir out`` from the repository root, as ``make docs`` runs it: the forked child's
    body. Click ends it with ``SystemExit`` and the command's status."""
    from mkdocs.__main__ import cli

    os.chdir(ROOT)
    os.environ["NO_MKDOCS_2_WARNING"] = "1"
    cli.main(["build", "--strict", "--site-dir", str(out)], prog_name="mkdocs")
    return 0


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built in a child forked from this process. mkdocstrings reads each package's live ``__all__`` (the
    lazily exported algorithm modules): imported here first, they come with the fork, where a fresh interpreter would
    spend 3 CPU s importing torch and the packages again (and ``test_every_public_name_...`` imports them anyway)."""
    for package in PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            getattr(module, name)
    out = tmp_path_factory.mktemp("site")
    build = ForkedCommand([], tmp_path_factory.mktemp("build") / "mkdocs", call=functools.partial(_build_site, out))
    try:
        status = build.wait(BUILD_TIMEOUT_S)
    finally:
        build.kill()
    assert status == 0, f"mkdocs build --strict failed:\n{build.stdout}\n{build.stderr}"
    return out


def read_inventory(path: Path) -> dict[str, str]:
    """A Sphinx ``objects.inv`` (version 2) as ``{name: uri}``, the uri's ``$`` expanded to the name."""
    data = path.read_bytes()
    header_end = 0
    for _ in range(4):  # four text lines: version, project, version, compression note
        header_end = data.index(b"\n", header_end) + 1
    assert data.startswith(b"# Sphinx inventory version 2"), data[:header_end]
    entries = {}
    for line in zlib.decompress(data[header_end:]).decode().splitlines():
        match = re.match(r"(.+?)\s+(\S+:\S+)\s+(-?\d+)\s+(\S*)\s+(.*)", line)
        if match:
            name, uri = match.group(1), match.group(4)
            entries[name] = uri[:-1] + name if uri.endswith("$") else uri
    return entries


class _Text(HTMLParser):
    """The visible text of a page, scripts and styles left out."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def _words(text: str) -> str:
    return " ".join(re.sub(r"[`*]", "", html.unescape(text)).split())


def _squeezed(text: str) -> str:
    """``text`` without whitespace: Markdown and the highlighter add or drop spaces around code and tags."""
    return re.sub(r"\s", "", text)


def _page_text(page: Path) -> str:
    parser = _Text()
    parser.feed(page.read_text())
    return _words(" ".join(parser.parts))


def _own_doc(obj) -> str | None:
    """The first paragraph of ``obj``'s own docstring, as its words; None for objects without one (aliases)."""
    if not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)):
        return None
    doc = inspect.getdoc(obj)
    if not doc:
        return None
    first = doc.split("\n\n", 1)[0]
    # reST roles become code spans of the name on the page (``~`` keeps the last component): compare the words.
    first = re.sub(r":\w+:`(~?)([^`]+)`", lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2),
                   first)
    return _words(first)


@pytest.mark.long(reason="the first user of the site fixture pays the strict MkDocs build of every page: 20-27 CPU s")
def test_the_build_is_strict_and_has_every_section(site):
    for page in ("index.html", "getting-started/index.html", "concepts/acquisition/index.html",
                 "algorithms/sac/index.html", "backends/index.html", "gpu/index.html", "scaling/index.html",
                 "resume/index.html", "rlstructures/index.html", "benchmarks/learning/index.html",
                 "tutorials/01_data_structures/index.html", "api/rlstruct/index.html", "objects.inv"):
        assert (site / page).is_file(), f"the site has no {page}"


def test_tutorial_pages_are_the_scripts(site):
    scripts = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))
    assert scripts
    for script in scripts:
        page = site / "tutorials" / script.stem / "index.html"
        assert page.is_file(), f"no page for {script.name}"
        text = _page_text(page)
        # The docstring's first line is the title, and the code's last line is in a code block.
        title = _words(inspect.cleandoc(script.read_text().split('"""')[1]).splitlines()[0].replace("``", ""))
        assert title in text, (script.name, title)
        last_code = next(line for line in reversed(script.read_text().splitlines()) if line.strip())
        assert _squeezed(html.unescape(last_code)) in _squeezed(text), (script.name, last_code)
        assert "<pre" in page.read_text()


def test_every_public_name_is_in_the_reference_with_its_docstring(site):
    inventory = read_inventory(site / "objects.inv")
    missing, undocumented = [], []
    for package in PACKAGES:
        module = importlib.import_module(package)
        page_text = _squeezed(_page_text(site / PAGES[package] / "index.html") + (
            _page_text(site / "api/algorithm-modules/index.html") if package == "rlstruct.algos" else ""))
        for name in module.__all__:
            qualified = f"{package}.{name}"
            uri = inventory.get(qualified)
            # The algorithm modules that rlstruct.algos exports have a page of their own.
            pages = (PAGES[package], "api/algorithm-modules/") if package == "rlstruct.algos" else (PAGES[package],)
            if uri is None or not uri.startswith(pages):
                missing.append((qualified, uri))
                continue
            doc = _own_doc(getattr(module, name))
            if doc is not None and _squeezed(doc) not in page_text:
                undocumented.append((qualified, doc[:80]))
    assert not missing, f"public names missing from the reference (name, uri): {missing}"
    assert not undocumented, f"public names whose docstring is not on their reference page: {undocumented}"


def test_api_pages_show_no_raw_rest_or_quoted_doctests(site):
    for page in sorted((site / "api").glob("*/index.html")):
        text = page.read_text()
        raw_roles = re.findall(r":(?:class|func|meth|mod|attr|exc):\s*<code>|:(?:class|func|meth|mod):`", text)
        assert not raw_roles, f"{page.parent.name}: reST roles left as text: {raw_roles[:3]}"
        # Doctests are code blocks, never Markdown quotes (what a bare ``>>>`` line would become).
        assert "<blockquote>" not in text, page.parent.name
        assert "<pre" in text, page.parent.name


def test_the_inventory_reader_reads_what_it_is_given(tmp_path):
    body = b"rlstruct.DictTensor py:class 1 api/rlstruct/#$ -\nrlstruct.x py:function 1 api/x/#rlstruct.x -\n"
    path = tmp_path / "objects.inv"
    path.write_bytes(b"# Sphinx inventory version 2\n# Project: p\n# Version: 0\n# zlib\n" + zlib.compress(body))
    assert read_inventory(path) == {"rlstruct.DictTensor": "api/rlstruct/#rlstruct.DictTensor",
                                    "rlstruct.x": "api/x/#rlstruct.x"}


# ---------------------------------------------------------------------------------------------------------------
# In a browser


class _Assets(HTMLParser):
    """What a rendered page loads or links: scripts, stylesheets, images, icons; and its landmarks."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.tags: set[str] = set()
        self.classes: set[str] = set()
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        self.classes.update((a.get("class") or "").split())
        self._in_title = tag == "title"
        if tag in ("script", "img", "source") and a.get("src"):
            self.urls.append(a["src"])
        if tag == "link" and a.get("href") and set((a.get("rel") or "").split()) & {"stylesheet", "icon",
                                                                                       "preload", "modulepreload"}:
            self.urls.append(a["href"])

    def handle_endtag(self, tag):
        self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(site, tmp_path_factory):
    """The built site on http://127.0.0.1:PORT/, and the server's request log (one line per request)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "requests.log"
    with open(log, "w") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(site)],
            stdout=sink, stderr=subprocess.STDOUT,
        )
    try:
        base = f"http://127.0.0.1:{port}/"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base, timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.1)
        yield base, log
    finally:
        server.terminate()
        server.wait(timeout=10)


def _chromium_run(*args: str, out_dir: Path) -> subprocess.CompletedProcess:
    # --no-sandbox: the tests may run as root (a container, CI); a fresh profile keeps runs independent.
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={out_dir / 'profile'}",
           "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=CHROMIUM_TIMEOUT_S)


def _browse(served, path: str, out_dir: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """Headless Chromium with ``args`` on the served site's ``path``: its run, and the server's log lines of what it
    requested."""
    base, log = served
    start = len(log.read_text())
    proc = _chromium_run(*args, base + path, out_dir=out_dir)
    return proc, log.read_text()[start:]


@pytest.fixture(scope="module")
def start_page(served, tmp_path_factory) -> tuple[subprocess.CompletedProcess, str, Path]:
    """The start page's one Chromium run: its DOM (``--dump-dom``) and its screenshot in a 1280x900 window
    (``--screenshot``), both taken from the same load, where a run each would start the browser twice (1.3 CPU s
    each); the run, the server's log lines of what it requested, and the picture's path."""
    out = tmp_path_factory.mktemp("start-page")
    shot = out / "start-page.png"
    proc, requests = _browse(served, "", out, "--window-size=1280,900", f"--screenshot={shot}", "--dump-dom")
    return proc, requests, shot


@needs_chromium
@pytest.mark.parametrize("path", BROWSED, ids=["start", "algorithm", "api"])
def test_a_page_renders_in_chromium(served, path, tmp_path, request):
    base, _ = served
    url = base + path
    if path == "":
        proc, requests, _ = request.getfixturevalue("start_page")
    else:
        proc, requests = _browse(served, path, tmp_path, "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = _Assets()
    dom.feed(proc.stdout)
    # Rendered by Material: a title, the site's navigation, a code block, the search that its JS builds.
    assert "rlstruct" in dom.title, dom.title
    assert "md-nav" in dom.classes and "md-header" in dom.classes, sorted(dom.classes)[:40]
    assert "pre" in dom.tags and "code" in dom.tags, "no code block on the page"
    local = [urljoin(url, u) for u in dom.urls if urlparse(urljoin(url, u)).netloc == urlparse(base).netloc]
    assert any(u.endswith(".css") for u in local) and any(u.endswith(".js") for u in local), local
    broken = []
    for asset in local:
        try:
            urllib.request.urlopen(asset, timeout=10).close()
        except urllib.error.HTTPError as err:
            broken.append((asset, err.code))
    assert not broken, f"local assets that do not load: {broken}"
    # What the browser itself requested (JS-loaded files included): nothing answered 404.
    assert '"GET /' in requests, requests
    assert not re.search(r'" 404 ', requests), requests


@needs_chromium
def test_the_start_page_screenshot_is_a_picture(start_page):
    proc, _, shot = start_page
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000, len(data)
    # Width and height from the IHDR chunk: the window asked for.
    assert (int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")) == (1280, 900)
    target = os.environ.get("RLSTRUCT_DOCS_SCREENSHOT")
    if target:  # make docs-screenshot: keep it under docs/ for reviewers
        shutil.copyfile(shot, target)
