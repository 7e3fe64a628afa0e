"""One self-contained HTML page: the frame every report shares.

A page carries its own style sheet and script inline and names no other
file, font or address, so it opens from a CI artifact, a mail attachment or
a folder with no network. Every value that reaches the page goes through
`escape`; nothing a run recorded is ever written into the markup as is.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Iterable
from pathlib import Path

import attrs

STYLE = """
:root { --ink: #1d2330; --faint: #667085; --rule: #d0d5dd; --paper: #ffffff; --shade: #f4f6f9;
  --bad: #b42318; --bad-bg: #fde7e4; --good: #067647; --good-bg: #dcfae6; --warn: #b54708; --warn-bg: #fef0c7;
  --claim: #2e5aac; --renew: #0e7c86; --finish: #067647; --reap: #c4320a; --clock: #6941c6; --other: #667085; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--ink);
  background: var(--paper); }
header { padding: 18px 28px 12px; border-bottom: 1px solid var(--rule); background: var(--shade); }
header h1 { margin: 0 0 4px; font-size: 20px; }
header .subject { color: var(--faint); }
main { padding: 8px 28px 40px; max-width: 1600px; }
h2 { font-size: 16px; margin: 26px 0 8px; border-bottom: 1px solid var(--rule); padding-bottom: 4px; }
h3 { font-size: 14px; margin: 16px 0 6px; }
code, pre, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
pre { background: var(--shade); border: 1px solid var(--rule); padding: 10px 12px; overflow-x: auto;
  white-space: pre; border-radius: 4px; }
.verdict { display: inline-block; padding: 2px 10px; border-radius: 12px; font-weight: 600; margin-top: 6px; }
.verdict.bad { background: var(--bad-bg); color: var(--bad); }
.verdict.good { background: var(--good-bg); color: var(--good); }
.verdict.warn { background: var(--warn-bg); color: var(--warn); }
.explanation { font-size: 16px; margin: 14px 0; padding: 10px 14px; border-left: 4px solid var(--bad);
  background: var(--bad-bg); }
.facts { display: flex; flex-wrap: wrap; gap: 6px 22px; margin: 10px 0; color: var(--faint); }
.facts b { color: var(--ink); font-weight: 600; }
table { border-collapse: collapse; margin: 6px 0 12px; }
th, td { border: 1px solid var(--rule); padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: var(--shade); font-weight: 600; }
td.differs { background: var(--bad-bg); color: var(--bad); font-weight: 600; }
td.changed { background: var(--warn-bg); }
td.absent { color: var(--faint); font-style: italic; }
tr.killed-no td { background: var(--bad-bg); }
.badge { display: inline-block; min-width: 52px; text-align: center; padding: 0 6px; border-radius: 3px;
  font-size: 12px; font-weight: 600; background: var(--shade); color: var(--faint); }
.badge.bad { background: var(--bad-bg); color: var(--bad); }
.badge.good { background: var(--good-bg); color: var(--good); }
.badge.warn { background: var(--warn-bg); color: var(--warn); }
details.step { border: 1px solid var(--rule); border-radius: 4px; margin: 4px 0; }
details.step > summary { cursor: pointer; padding: 4px 8px; list-style-position: inside; }
details.step.diverged { border-color: var(--bad); }
details.step.diverged > summary { background: var(--bad-bg); }
details.step.unsent > summary { color: var(--faint); }
details.step .body { padding: 4px 12px 8px; }
.failing-step { border: 1px solid var(--bad); border-radius: 4px; margin: 8px 0; padding: 0 12px 8px; }
.failing-step > .head { background: var(--bad-bg); margin: 0 -12px 8px; padding: 4px 8px; }
.outcomes td:first-child { color: var(--faint); }
.scroll { overflow-x: auto; border: 1px solid var(--rule); border-radius: 4px; padding: 6px 0; }
svg.timeline { display: block; font: 11px system-ui, sans-serif; }
svg.timeline .lane-label { fill: var(--ink); font-weight: 600; }
svg.timeline .lane-kind { fill: var(--faint); font-size: 10px; }
svg.timeline .op { stroke-width: 1; rx: 3; }
svg.timeline .op-label { fill: #fff; pointer-events: none; }
svg.timeline .op.refused { fill-opacity: 0.35; }
svg.timeline .op.indeterminate { fill: url(#hatch); stroke-dasharray: 3 2; }
svg.timeline .op.needed { stroke: var(--ink); stroke-width: 2; }
svg.timeline .op.failing { stroke: var(--bad); stroke-width: 3; }
svg.timeline .op.faded { opacity: 0.35; }
svg.timeline .order { fill: var(--ink); font-weight: 700; font-size: 10px; }
svg.timeline .lease { fill: var(--claim); fill-opacity: 0.22; stroke: var(--claim); }
svg.timeline .lease.expired { fill-opacity: 0.08; stroke-dasharray: 4 3; }
svg.timeline .lease-label { fill: var(--claim); font-size: 10px; }
svg.timeline .generation rect { fill: #fff; stroke: var(--faint); }
svg.timeline .generation text { fill: var(--ink); font-size: 10px; }
svg.timeline .reap line { stroke: var(--reap); stroke-width: 2; }
svg.timeline .reap text { fill: var(--reap); font-size: 10px; font-weight: 600; }
svg.timeline .settle text { font-size: 12px; font-weight: 700; }
svg.timeline .clock-move { stroke: var(--clock); stroke-dasharray: 5 3; stroke-width: 1.5; }
svg.timeline .clock-label { fill: var(--clock); font-size: 10px; font-weight: 600; }
svg.timeline .barrier { stroke: var(--rule); stroke-width: 1; }
svg.timeline .epoch-label { fill: var(--faint); font-size: 10px; }
svg.timeline .epoch-failed { fill: var(--bad-bg); fill-opacity: 0.6; }
svg.timeline .lane-rule { stroke: var(--shade); }
svg.timeline [data-detail] { cursor: pointer; }
#detail { position: fixed; right: 16px; bottom: 16px; max-width: 520px; background: var(--paper);
  border: 1px solid var(--ink); border-radius: 4px; padding: 8px 10px; box-shadow: 0 2px 8px rgba(0,0,0,.2);
  white-space: pre-wrap; display: none; font-size: 12.5px; }
ol.order li.failing { color: var(--bad); font-weight: 600; }
.legend { display: flex; flex-wrap: wrap; gap: 4px 16px; color: var(--faint); font-size: 12px; margin: 4px 0; }
.legend i { display: inline-block; width: 12px; height: 10px; margin-right: 4px; vertical-align: middle; }
footer { color: var(--faint); font-size: 12px; padding: 10px 28px; border-top: 1px solid var(--rule); }
"""

# Hovering anything that carries a `data-detail` shows it in one fixed box; a click keeps it.
SCRIPT = """
(function () {
  var box = document.getElementById('detail');
  if (!box) { return; }
  var kept = null;
  function show(el) { box.textContent = el.getAttribute('data-detail'); box.style.display = 'block'; }
  document.querySelectorAll('[data-detail]').forEach(function (el) {
    el.addEventListener('mouseenter', function () { if (!kept) { show(el); } });
    el.addEventListener('mouseleave', function () { if (!kept) { box.style.display = 'none'; } });
    el.addEventListener('click', function (e) { kept = kept === el ? null : el; show(el); e.stopPropagation(); });
  });
  document.addEventListener('click', function () { kept = null; box.style.display = 'none'; });
  // A timeline wider than its box opens scrolled to what failed (data-focus-x, set by the page's maker).
  document.querySelectorAll('.scroll > svg[data-focus-x]').forEach(function (svg) {
    var box = svg.parentElement, x = Number(svg.getAttribute('data-focus-x'));
    if (box.scrollWidth > box.clientWidth) { box.scrollLeft = Math.max(0, x - box.clientWidth / 2); }
    svg.setAttribute('data-in-view', Math.round(box.scrollLeft) + ' ' + Math.round(box.scrollLeft + box.clientWidth));
  });
  document.documentElement.setAttribute('data-script', 'ran');
})();
"""


def escape(text: object) -> str:
    """`text` as HTML character data or an attribute value (quotes included)."""
    return html.escape(str(text), quote=True)


@attrs.frozen
class Section:
    """A titled part of a page; `body` is markup already escaped by its maker."""

    title: str
    body: str
    id: str = ""


def section(title: str, body: str, id: str = "") -> Section:
    return Section(title, body, id)


def preformatted(text: str, css_class: str = "") -> str:
    return f'<pre class="{escape(css_class)}">{escape(text)}</pre>' if css_class else f"<pre>{escape(text)}</pre>"


def facts(pairs: Iterable[tuple[str, object]]) -> str:
    """A line of labelled figures: `label value` pairs."""
    return '<div class="facts">' + "".join(f"<span>{escape(k)} <b>{escape(v)}</b></span>" for k, v in pairs) + "</div>"


def verdict_badge(text: str, tone: str) -> str:
    """The verdict as a pill; `tone` is "good", "bad" or "warn"."""
    return f'<div class="verdict {escape(tone)}" id="verdict">{escape(text)}</div>'


def render(title: str, subject: str, verdict: str, sections: Iterable[Section], kind: str) -> str:
    """The whole page. `kind` names the report (counterexample, stress, replay, kill-matrix) for readers and tests."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # Nothing is fetched: no scripts, styles, images or frames from anywhere but this page.
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">",
        f'<meta name="generator" content="leaseproof report: {escape(kind)}">',
        f"<title>{escape(title)}</title>",
        f"<style>{STYLE}</style></head>",
        f'<body data-report="{escape(kind)}">',
        f'<header><h1>{escape(title)}</h1><div class="subject">{escape(subject)}</div>{verdict}</header>',
        "<main>",
    ]
    for part in sections:
        anchor = f' id="{escape(part.id)}"' if part.id else ""
        parts.append(f"<section{anchor}><h2>{escape(part.title)}</h2>{part.body}</section>")
    written = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    parts += [
        "</main>",
        f"<footer>written by leaseproof at {escape(written)};"
        " this page is self-contained and needs no network</footer>",
        '<div id="detail"></div>',
        f"<script>{SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts)


def write(directory: Path | str, filename: str, page: str) -> Path:
    """Write `page` as `directory/filename` (the directory is made if missing); the file's path."""
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(page, encoding="utf-8")
    return path
