#!/usr/bin/env python3
"""Check the built API reference: ``python docs/check_reference.py SITE_DIR``.

mkdocstrings renders what the source says, so two regressions pass a strict build unnoticed:

- a private name (``_Name``, ``_PathArg``, ``trainstatus._store``...) in a signature or in a
  class's bases, which a user can neither import nor rely on (they import every name from
  ``trainstatus``), and
- a constructor or method shown without its parameters' defaults (``lock_timeout=30.0``), when
  an option of mkdocs.yml stops merging ``__init__`` into the class or showing signatures.

Reads ``SITE_DIR/reference/index.html`` (``mkdocs build --site-dir SITE_DIR``), prints each
problem on a line and exits 1; exits 0 with a one-line summary when there is none. Standard
library only, so it runs in any environment that built the site.
"""

from __future__ import annotations

import html.parser
import os
import re
import sys
from dataclasses import dataclass, field

# Defaults a reader must find in the reference: (the object's anchor, parameter, default as the
# signature shows it). One per kind of signature: a class's merged constructor, a method.
KNOWN_DEFAULTS = (
    ("trainstatus.StatusStore", "lock_timeout", "30.0"),
    ("trainstatus.StatusStore", "durable", "True"),
    ("trainstatus.CheckpointList", "keep", "5"),
    ("trainstatus.StatusStore.get", "default", "None"),
)

# An identifier that starts with one underscore and is not inside another word: ``_Name``,
# ``_T``, the ``_store`` of ``trainstatus._store.X``. Not a dunder: ``__version__`` is public.
PRIVATE = re.compile(r"(?<!\w)_[^\W_]\w*")


@dataclass
class Region:
    """The text of one signature, heading or bases line, and the object it belongs to."""

    kind: str  # "signature", "heading" or "bases"
    anchor: str  # the heading's id: trainstatus.StatusStore.get
    text: list[str] = field(default_factory=list)
    # Where a name links to or what its tooltip says: the last dotted part is the name itself.
    titles: list[str] = field(default_factory=list)


class _Reference(html.parser.HTMLParser):
    """Collects the regions of the page that hold signatures and bases."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.regions: list[Region] = []
        self.anchor = ""
        self.open: list[tuple[Region, str, int]] = []  # (region, its tag, depth of that tag)
        self.depth: dict[str, int] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        classes = values.get("class", "").split()
        self.depth[tag] = self.depth.get(tag, 0) + 1
        kind = None
        if re.fullmatch(r"h[1-6]", tag) and "doc-heading" in classes:
            self.anchor, kind = values.get("id", ""), "heading"
        elif tag == "div" and "doc-signature" in classes:
            kind = "signature"
        elif tag == "p" and "doc-class-bases" in classes:
            kind = "bases"
        if kind is not None and not self.open:
            region = Region(kind, self.anchor)
            self.regions.append(region)
            self.open.append((region, tag, self.depth[tag]))
        if self.open and values.get("title"):
            self.open[-1][0].titles.append(values["title"].strip())

    def handle_endtag(self, tag: str) -> None:
        if self.open and self.open[-1][1] == tag and self.open[-1][2] == self.depth.get(tag):
            self.open.pop()
        self.depth[tag] = self.depth.get(tag, 1) - 1

    def handle_data(self, data: str) -> None:
        if self.open:
            self.open[-1][0].text.append(data)


def parameters(signature: str) -> dict[str, str]:
    """``name -> default`` of the parameters in ``signature``'s outermost parentheses (split at
    the commas outside brackets), for those that have a default."""
    start = signature.find("(")
    if start < 0:
        return {}
    parts, depth, current = [], 0, ""
    for char in signature[start + 1:]:
        if char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    defaults = {}
    for part in parts:
        name, equals, default = part.partition("=")
        if equals:
            defaults[name.split(":")[0].strip()] = " ".join(default.split())
    return defaults


def problems(page: str) -> tuple[list[str], int]:
    """The problems found in the reference page's HTML, and how many regions were checked."""
    parser = _Reference()
    parser.feed(page)
    parser.close()
    found = []
    for region in parser.regions:
        text = "".join(region.text)
        names = PRIVATE.findall(text)
        for title in region.titles:  # "StatusStore (trainstatus._store.StatusStore)": StatusStore
            dotted = re.findall(r"[\w.]+", title)
            name = dotted[-1].rpartition(".")[2] if dotted else ""
            if PRIVATE.fullmatch(name):
                names.append(name)
        for name in dict.fromkeys(names):
            found.append(f"{region.anchor or 'the page'}: private name {name} in its {region.kind}: "
                         f"{' '.join(text.split())[:160]}")
    signatures: dict[str, str] = {}
    for region in parser.regions:
        if region.kind in ("signature", "heading"):
            text = "".join(region.text)
            if "(" in text:
                signatures.setdefault(region.anchor, text)
    for anchor, name, default in KNOWN_DEFAULTS:
        if anchor not in signatures:
            found.append(f"{anchor}: no signature shown (mkdocs.yml: show_signature, merge_init_into_class)")
            continue
        shown = parameters(signatures[anchor]).get(name)
        if shown != default:
            what = "without a default" if shown is None else f"with the default {shown}"
            found.append(f"{anchor}: {name}={default} is not shown ({name} appears {what}) in: "
                         f"{' '.join(signatures[anchor].split())[:160]}")
    return found, len(parser.regions)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python docs/check_reference.py SITE_DIR (the --site-dir of mkdocs build)", file=sys.stderr)
        return 2
    path = os.path.join(argv[0], "reference", "index.html")
    try:
        with open(path, encoding="utf-8") as f:
            page = f.read()
    except OSError as exc:
        print(f"{path}: cannot read the API reference ({exc.strerror}); build the manual first: "
              f"python -m mkdocs build --strict --site-dir {argv[0]}", file=sys.stderr)
        return 2
    found, checked = problems(page)
    for problem in found:
        print(f"{path}: {problem}")
    if found:
        print(f"{len(found)} problem(s) in the API reference: private names are for the source only, and "
              "every signature shows its defaults", file=sys.stderr)
        return 1
    print(f"API reference OK: {checked} signatures, headings and bases checked; no private name, "
          f"{len(KNOWN_DEFAULTS)} known defaults shown")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
