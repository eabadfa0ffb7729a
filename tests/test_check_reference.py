"""docs/check_reference.py: the API reference's signatures show no private name and show defaults.

The checker runs on a built site (.ci/run, after the strict build); here it runs on two cuts of
the reference as mkdocstrings-python renders it (tests/data/reference/): one it must pass, one
holding each regression it exists to catch.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT / "docs" / "check_reference.py"
FIXTURES = Path(__file__).resolve().parent / "data" / "reference"


def load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_reference", CHECKER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Its dataclass looks its module up by name while the module runs.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def site_with(tmp_path: Path, page: str) -> Path:
    """A site directory whose API reference is ``page``, as mkdocs build lays it out."""
    site = tmp_path / "site"
    (site / "reference").mkdir(parents=True)
    (site / "reference" / "index.html").write_text(page, encoding="utf-8")
    return site


def check(site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECKER), str(site)], capture_output=True, text=True, timeout=60)


def test_a_reference_with_public_names_and_its_defaults_passes(tmp_path: Path) -> None:
    done = check(site_with(tmp_path, (FIXTURES / "passing.html").read_text(encoding="utf-8")))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == ("API reference OK: 9 signatures, headings and bases checked; no private name, "
                           "4 known defaults shown\n")
    assert done.stderr == ""


def test_private_names_and_missing_defaults_fail_with_one_line_each(tmp_path: Path) -> None:
    site = site_with(tmp_path, (FIXTURES / "failing.html").read_text(encoding="utf-8"))
    done = check(site)
    page = site / "reference" / "index.html"
    store = ("StatusStore( path: _PathArg, *, durable: bool = True, lock_timeout: float | None, "
             "metadata: Mapping[str, Any] | None = None, )")
    assert done.returncode == 1
    assert done.stdout.splitlines() == [
        f"{page}: trainstatus.StatusStore: private name _PathArg in its signature: {store}",
        # Shown as T, but its tooltip (and link) names the private TypeVar.
        f"{page}: trainstatus.StatusStore.get: private name _T in its signature: "
        "get(category: str | Enum, key: str | Enum, /, default: Any = None) -> T",
        f"{page}: trainstatus.TrainingStatusReadError: private name _Context in its bases: "
        "Bases: _Context, TrainingStatusError, OSError",
        f"{page}: trainstatus.StatusStore: lock_timeout=30.0 is not shown (lock_timeout appears without a "
        f"default) in: {store}",
        f"{page}: trainstatus.CheckpointList: no signature shown (mkdocs.yml: show_signature, merge_init_into_class)",
    ]
    assert done.stderr == ("5 problem(s) in the API reference: private names are for the source only, and every "
                           "signature shows its defaults\n")


def test_a_changed_default_is_named(tmp_path: Path) -> None:
    page = (FIXTURES / "passing.html").read_text(encoding="utf-8")
    changed = page.replace('<span class="mi">5</span>', '<span class="mi">3</span>')
    assert changed != page
    found, _ = load_checker().problems(changed)
    assert found == ["trainstatus.CheckpointList: keep=5 is not shown (keep appears with the default 3) in: "
                     "CheckpointList(store: StatusStore, category: str, *, keep: int | None = 3)"]


@pytest.mark.parametrize(("signature", "expected"), [
    ("f(a: Mapping[str, Any] | None = None, b: int = 5) -> dict[str, int]", {"a": "None", "b": "5"}),
    ("f(a, /, b=(1, 2), *, c: Callable[[int, str], None] = print, **kw)", {"b": "(1, 2)", "c": "print"}),
    ("f(\n    lock: str = \"flock\",\n    lock_timeout: float | None =   30.0,\n)",
     {"lock": '"flock"', "lock_timeout": "30.0"}),
    ("StatusStore", {}),
])
def test_parameters_split_at_the_commas_outside_brackets(signature: str, expected: dict[str, str]) -> None:
    assert load_checker().parameters(signature) == expected


def test_dunder_names_and_names_inside_words_are_not_private() -> None:
    private = load_checker().PRIVATE
    assert private.findall("f(version: str = __version__, my_name: int = 1, x=_secret, y=mod._Name)") == [
        "_secret", "_Name"]


def test_a_site_without_a_reference_is_a_usage_error(tmp_path: Path) -> None:
    done = check(tmp_path)
    assert done.returncode == 2
    assert done.stderr == (f"{tmp_path / 'reference' / 'index.html'}: cannot read the API reference (No such file "
                           f"or directory); build the manual first: python -m mkdocs build --strict --site-dir "
                           f"{tmp_path}\n")
    assert check_usage().returncode == 2


def check_usage() -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECKER)], capture_output=True, text=True, timeout=60)


needs_mkdocs = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                  reason="builds the manual: needs the docs extra")


@pytest.fixture(scope="module")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The manual as mkdocs.yml configures it, built from this checkout's src/ (once for this file)."""
    site = tmp_path_factory.mktemp("manual") / "site"
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert build.returncode == 0, build.stderr
    return site


@needs_mkdocs
def test_the_real_reference_passes(built_site: Path) -> None:
    done = check(built_site)
    assert done.returncode == 0, done.stdout + done.stderr


# -- the manual loads nothing from another host (mkdocs.yml: the build and the site stay offline) --

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}  # `mkdocs serve`'s address, as getting-started.md gives it


def external_references(site: Path) -> list[str]:
    """Every src= or href= of the site's pages, and url() or @import of its style sheets, that
    names a host other than this machine (a CDN's script, a font service, a link in the theme)."""
    from urllib.parse import urlsplit

    def external(url: str) -> bool:
        parts = urlsplit(url.strip())
        return bool(parts.netloc) and parts.hostname not in _LOOPBACK  # "//host/x" has no scheme

    found = []
    for page in sorted(site.rglob("*.html")):
        for attribute, url in re.findall(r"""\b(src|href)\s*=\s*["']([^"']*)["']""", page.read_text(encoding="utf-8")):
            if external(url):
                found.append(f"{page.relative_to(site)}: {attribute}={url}")
    for sheet in sorted(site.rglob("*.css")):
        text = sheet.read_text(encoding="utf-8", errors="replace")
        for url in re.findall(r"""url\(\s*["']?([^"')]*)|@import\s+["']([^"']*)""", text):
            target = url[0] or url[1]
            if external(target):
                found.append(f"{sheet.relative_to(site)}: {target}")
    return found


def test_the_offline_check_finds_a_script_from_a_cdn_and_leaves_local_links(tmp_path: Path) -> None:
    (tmp_path / "css").mkdir()
    (tmp_path / "index.html").write_text(
        '<script src="https://cdnjs.cloudflare.com/ajax/libs/highlight.js/11.8.0/highlight.min.js"></script>'
        '<link rel="stylesheet" href="css/theme.css"><a href="http://127.0.0.1:8000/">serve</a>'
        "<a href='//fonts.example/x'>font</a>", encoding="utf-8")
    (tmp_path / "css" / "theme.css").write_text(
        '@import "https://fonts.example/roboto.css"; .x { background: url(../img/a.png) }', encoding="utf-8")
    assert external_references(tmp_path) == [
        "index.html: src=https://cdnjs.cloudflare.com/ajax/libs/highlight.js/11.8.0/highlight.min.js",
        "index.html: href=//fonts.example/x",
        "css/theme.css: https://fonts.example/roboto.css",
    ]


@needs_mkdocs
def test_the_manual_loads_and_links_nothing_from_another_host(built_site: Path) -> None:
    """The readthedocs theme loads highlight.js from a CDN and links to its makers in its footer;
    mkdocs.yml turns the one off (code is coloured at build time) and overrides the other."""
    assert external_references(built_site) == []
    page = (built_site / "getting-started" / "index.html").read_text(encoding="utf-8")
    assert '<div class="highlight">' in page  # coloured all the same
    assert (built_site / "css" / "pygments.css").is_file()
