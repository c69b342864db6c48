"""One self-contained HTML page: inline CSS, plotly.js inlined once, pictures as base64 data URIs.

Nothing on the page loads from the network, so it opens offline and can be mailed or archived.
Each section is ``<section id=...>`` with an ``<h2>``; each plotly chart sits in a
``<div class="figure" data-figure=NAME>`` (the tests look for these).
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field

import plotly.graph_objects as go

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f3b57;color:white;padding:14px 24px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;opacity:.85;font-size:13px}nav{padding:8px 24px;background:#e8edf2;font-size:14px}
nav a{margin-right:16px;color:#1f3b57}main{padding:0 24px 40px}
section{background:white;margin:18px 0;padding:12px 18px;border:1px solid #ddd;border-radius:6px}
h2{font-size:18px;margin:6px 0 10px}h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;font-size:13px;margin:6px 0 10px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f0f3f6}
td:first-child,th:first-child{text-align:left}.note{color:#8a5a00;font-size:13px}
.kpis{display:flex;flex-wrap:wrap;gap:10px}.kpi{border:1px solid #ddd;border-radius:6px;padding:6px 12px}
.kpi b{display:block;font-size:18px}.kpi span{font-size:12px;color:#555}img{max-width:100%}
.bad{color:#c62828;font-weight:bold}
"""


def fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table_html(cols: list[str], rows: list[list], *, empty: str = "none", cls: str = "") -> str:
    if not rows:
        return f'<p class="note">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _cell(value) -> str:
    text = html.escape(fmt(value))
    return f'<td class="bad">{text}</td>' if text == "NO" else f"<td>{text}</td>"


def png_html(name: str, data: bytes) -> str:
    b64 = base64.b64encode(data).decode("ascii")
    return f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{b64}"><figcaption>' \
           f"{html.escape(name)}</figcaption></figure>"


@dataclass
class Page:
    title: str
    subtitle: str = ""
    sections: list[tuple[str, str, list[str]]] = field(default_factory=list)  # (id, title, html parts)
    figures: list[str] = field(default_factory=list)
    _js_done: bool = False

    def section(self, sid: str, title: str) -> list[str]:
        parts: list[str] = []
        self.sections.append((sid, title, parts))
        return parts

    def figure(self, name: str, fig: go.Figure) -> str:
        """The chart's HTML; the first one carries plotly.js inline, the others reuse it."""
        self.figures.append(name)
        body = fig.to_html(full_html=False, include_plotlyjs=not self._js_done, include_mathjax=False,
                           config={"displaylogo": False, "responsive": True}, div_id=f"fig-{len(self.figures)}")
        self._js_done = True
        return f'<div class="figure" data-figure="{html.escape(name)}">{body}</div>'

    def render(self) -> str:
        nav = "".join(f'<a href="#{sid}">{html.escape(title)}</a>' for sid, title, _ in self.sections)
        body = "".join(f'<section id="{sid}"><h2>{html.escape(title)}</h2>{"".join(parts)}</section>'
                       for sid, title, parts in self.sections)
        return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}</title>'
                f"<style>{CSS}</style></head><body><header><h1>{html.escape(self.title)}</h1>"
                f"<p>{html.escape(self.subtitle)}</p></header><nav>{nav}</nav><main>{body}</main></body></html>")
