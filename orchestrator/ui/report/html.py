"""`report.html`: one self-contained page (plots embedded as base64 PNG, inline CSS, no script).

Why no script at all: the page is a record of a run that people mail around and open from disk;
it needs nothing dynamic, and a page without script cannot run what an untrusted commit subject
smuggles in. Two layers make sure of it: every text goes through `html.escape`, and a
Content-Security-Policy allows only inline styles and `data:` images, so even a missed escape
could not load or execute anything (a browser would refuse and log it as an error).
"""

from __future__ import annotations

import base64
import html
import time
from collections.abc import Sequence

from orchestrator.answer.headline import text_lines
from orchestrator.ui.report import tables as T
from orchestrator.ui.report.answer import causes_table, detail_lines
from orchestrator.ui.report.collect import RunData
from orchestrator.ui.report.plots import Plot
from orchestrator.util.safe_text import printable

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1280px;
       padding: 0 16px; color: #212121; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0 4px; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; }
tr.top td { background: #fff8e1; }
.note { color: #616161; font-size: 12px; margin: 0 0 12px; }
figure { margin: 16px 0 28px; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #616161; font-size: 12px; }
pre { background: #f5f5f5; padding: 8px; overflow-x: auto; font-size: 12px; }
.verdict-found { color: #2e7d32; } .verdict-other { color: #c62828; }
#answer { background: #f1f8e9; border: 1px solid #c5e1a5; padding: 8px 14px; margin: 12px 0; }
p.answer { font-size: 15px; margin: 6px 0 8px; } p.detail { margin: 2px 0; font-size: 13px; }
.sim { color: #6a1b9a; font-size: 15px; font-weight: normal; }
"""


def esc(text: object) -> str:
    return html.escape(printable(text), quote=True)


def html_table(table: T.TextTable, highlight_first: bool = False) -> str:
    if not table.rows:
        return f'<p class="note" id="{esc(table.key)}">{esc(table.title)}: none.</p>'
    head = "".join(f"<th>{esc(h)}</th>" for h in table.headers)
    body = []
    for i, row in enumerate(table.rows):
        cls = ' class="top"' if highlight_first and i == 0 else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    note = f'<p class="note">{esc(table.note)}</p>' if table.note else ""
    return (f'<table id="{esc(table.key)}"><caption hidden>{esc(table.title)}</caption>'
            f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{note}")


def _figure(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    return (f'<figure id="plot-{esc(plot.name)}"><h3>{esc(plot.title)}</h3>'
            f'<img alt="{esc(plot.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{esc(plot.caption)}</figcaption></figure>")


def _finding_section(f: dict) -> str:
    parts = [f'<section class="finding" id="finding-{esc(f.get("rank"))}">',
             f"<h3>#{esc(f.get('rank'))} {esc(f.get('kind', ''))} <code>{esc(f.get('id', ''))}</code></h3>",
             f"<p>{esc(f.get('summary', ''))}</p>"]
    if f.get("subject"):
        author = f" by {esc(f['author'])}" if f.get("author") else ""
        parts.append(f'<p>Commit subject: <span class="subject">{esc(f["subject"])}</span>{author}</p>')
    parts.append(html_table(T.effects_table(f)))
    evidence = ", ".join(str(t) for t in f.get("evidence", [])) or "none"
    parts.append(f"<p>Evidence trials: {esc(evidence)}</p>")
    if f.get("suspect_trials"):
        parts.append(f"<p>Suspect trials (excluded from effects): "
                     f"{esc(', '.join(map(str, f['suspect_trials'])))}</p>")
    if f.get("failed_trials"):
        parts.append(f"<p>Failed trials (never measured): "
                     f"{esc(', '.join(map(str, f['failed_trials'])))}</p>")
    if f.get("interrupted_trials"):
        parts.append(f"<p>Interrupted trials (stopped and run again, not evidence): "
                     f"{esc(', '.join(map(str, f['interrupted_trials'])))}</p>")
    parts.append("</section>")
    return "".join(parts)


def _answer_section(data: RunData) -> list[str]:
    answer = data.ranked.get("answer")
    if not answer:
        return []
    table = causes_table(answer)
    first, *labelled = text_lines(answer)
    return ['<section id="answer">',
            f'<p class="answer"><strong>Answer:</strong>'
            f' {esc(first.removeprefix("answer: "))}</p>',
            *[f'<p class="detail">{esc(line.strip())}</p>' for line in labelled],
            html_table(table) if table.rows else "",
            *[f'<p class="detail">{esc(line)}</p>' for line in detail_lines(answer)],
            (f'<p class="detail"><em>In one sentence:</em> {esc(answer["sentence"])}</p>'
             if answer.get("sentence") else ""),
            "</section>"]


def _kernel_section(answer: dict) -> list[str]:
    from orchestrator.ui.report.kernel_report import kernel_tables

    tables = kernel_tables(answer.get("evidence") or [])
    if not tables:
        return []
    out = ["<h2>Kernel evidence</h2>"]
    for t in tables:
        out += [f"<h3>{esc(t.title)}</h3>", f'<p class="detail">{esc(t.note)}</p>', html_table(t)]
    return out


def render_html(data: RunData, plots: Sequence[Plot]) -> str:
    ranked = data.ranked
    verdict = str(ranked.get("verdict", ""))
    vclass = "verdict-found" if verdict in ("found", "explained") else "verdict-other"
    fps = T.fingerprint_tables(data)
    causes, _, settings = T.split_findings(ranked)
    sim = (' <span class="sim">&middot; simulated node (modeled times, no GPU measured)</span>'
           if data.simulated else "")
    body = [
        f"<h1>sleuth report: {esc(data.run_id)}{sim}</h1>",
        *_answer_section(data),
        f'<p>Verdict: <strong class="{vclass}">{esc(verdict)}</strong> &middot; generated '
        f"{esc(time.strftime('%Y-%m-%d %H:%M:%S'))}</p>",
        html_table(T.run_table(data)),
        "<h2>Experiments</h2>", html_table(T.experiments_table(ranked)),
        "<h2>Causes</h2>", html_table(T.findings_table(ranked), highlight_first=True),
        *[f'<p class="note">Not tested: {esc(line)}</p>' for line in T.untested_lines(ranked)],
        *[_finding_section(f) for f in causes],
        *(["<h2>Settings (sweep)</h2>", html_table(T.settings_table(ranked))] if settings else []),
        *[part for t in T.release_tables(data) for part in ("<h2>Releases</h2>", html_table(t))],
        *_kernel_section(ranked.get("answer") or {}),
        "<h2>Plots</h2>",
        *([_figure(p) for p in plots] or ['<p class="note">No measured trials to plot.</p>']),
        "<h2>Fingerprint differences</h2>",
        *([html_table(t) for t in fps]
          or ['<p class="note">No fingerprint differences recorded.</p>']),
        "<h2>Candidates</h2>", html_table(T.candidates_table(data)),
        "<h2>Trials</h2>", html_table(T.trials_table(data.rows)),
        "<h2>Configuration</h2>", f"<pre>{esc(data.config_yaml)}</pre>",
    ]
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<link rel="icon" href="data:,">'
        f"<title>sleuth report {esc(data.run_id)}</title><style>{_CSS}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )
