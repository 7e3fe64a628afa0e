"""Reading a report page, and opening it in real headless Chromium, for the tests of the
HTML reports (tests/conformance/report/, and the CLI's --report in tests/conformance/frontends/);
imported as `browser` (pytest's pythonpath holds tests/).

Chromium is required, not optional: without it the browser tests fail and say how to
install it (Debian's `chromium`, `apt-get install -y chromium`)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from html.parser import HTMLParser
from pathlib import Path

import attrs
import pytest

BROWSER_SECONDS = 90

# -- reading a page ---------------------------------------------------------------------


@attrs.define
class Element:
    tag: str
    attrs: dict[str, str]
    parents: tuple[Element, ...]
    text: str = ""  # its text, its descendants' included

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def inside(self, other: Element) -> bool:
        return any(p is other for p in self.parents)


class Dom(HTMLParser):
    """Every element of a page, with its attributes, text and ancestors."""

    VOID = frozenset({"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "source", "wbr"})

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self._open: list[Element] = []
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attributes: list[tuple[str, str | None]]) -> None:
        element = Element(tag, {k: v or "" for k, v in attributes}, tuple(self._open))
        self.elements.append(element)
        if tag not in self.VOID:
            self._open.append(element)

    def handle_startendtag(self, tag: str, attributes: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, {k: v or "" for k, v in attributes}, tuple(self._open)))

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self._open) - 1, -1, -1):
            if self._open[index].tag == tag:
                del self._open[index:]
                return

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element.text += data

    def find(self, tag: str | None = None, css: str | None = None, within: Element | None = None) -> list[Element]:
        return [
            e
            for e in self.elements
            if (tag is None or e.tag == tag)
            and (css is None or css in e.classes())
            and (within is None or e.inside(within))
        ]

    def by_id(self, element_id: str) -> Element:
        found = [e for e in self.elements if e.attrs.get("id") == element_id]
        assert len(found) == 1, f"expected one element #{element_id}, found {len(found)}"
        return found[0]


def fetches(dom: Dom) -> list[str]:
    """Whatever the page would load from elsewhere: a src, a stylesheet link, an address."""
    found = []
    for e in dom.elements:
        if e.tag in ("script", "img", "iframe", "link", "object", "embed") and ("src" in e.attrs or "href" in e.attrs):
            found.append(f"<{e.tag} {e.attrs}>")
        for name, value in e.attrs.items():
            if "://" in value and not (name == "xmlns" and value == "http://www.w3.org/2000/svg"):
                found.append(f"<{e.tag} {name}={value!r}>")
    return found


def page(path: Path) -> Dom:
    dom = Dom(path.read_text(encoding="utf-8"))
    assert fetches(dom) == [], "a report must be self-contained"
    return dom


# -- the browser --------------------------------------------------------------------------


def chromium() -> str:
    """Debian's chromium, which the browser tests need and never skip without."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "headless Chromium is needed to test the HTML reports and is not installed: "
            "run `apt-get install -y chromium` (Debian, as root), then run the tests again"
        )
    return found


def _browser(path: Path, profile: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
        f"--user-data-dir={profile}", *arguments, path.resolve().as_uri(),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=BROWSER_SECONDS, check=False)
    assert done.returncode == 0, f"chromium exited with {done.returncode}: {done.stderr[-2000:]}"
    return done


def rendered(path: Path, tmp_path: Path) -> Dom:
    """The page's DOM as Chromium has it once the page loaded and its script ran."""
    return Dom(_browser(path, tmp_path / "profile-dom", "--dump-dom").stdout)


def screenshot(path: Path, tmp_path: Path, size: str = "1400,2000") -> Path:
    png = tmp_path / (path.stem + ".png")
    _browser(path, tmp_path / "profile-shot", f"--screenshot={png}", f"--window-size={size}")
    assert png.is_file(), "chromium wrote no screenshot"
    return png


def colours(png: Path) -> dict[tuple[int, ...], int]:
    """How many pixels of each colour a PNG (8-bit RGB or RGBA, as Chromium writes them) has."""
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat, header = 8, b"", b""
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        at += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour_type in (2, 6), (depth, colour_type)
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    counts: dict[tuple[int, ...], int] = {}
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        if y % 4 == 0:  # every fourth row is plenty to tell a drawing from a blank
            for x in range(0, stride, channels * 2):
                pixel = tuple(line[x : x + 3])
                counts[pixel] = counts.get(pixel, 0) + 1
        previous = line
    return counts


def assert_not_blank(png: Path) -> None:
    counts = colours(png)
    total = sum(counts.values())
    commonest = max(counts.values())
    assert len(counts) >= 20, f"the screenshot has only {len(counts)} colours: it looks blank"
    assert commonest < 0.97 * total, "the screenshot is almost all one colour"
