"""`report.md`: the ranked findings, per-finding effects, plots (as files) and tables.

Every cell is untrusted text (a commit subject may hold `|`, `*`, `<script>` or a newline), so
each is escaped: line breaks folded to spaces, control characters (a terminal escape in a
commit message) dropped, and exactly the characters that would act escaped, where they would
act: `<` and an entity's `&` as entities; `\\`, `` ` ``, `*`, `|`, `~` with a backslash; `_` only
at a word's edge (inside `verify_ms` it formats nothing); a link's `](` or `][`; a block marker
(`#`, `>`, a list item) at the start of the text. A table cell can therefore neither split the
table, nor format text, nor link, nor become HTML in a renderer that passes HTML through, and
the file still reads as typed in a terminal: `->`, `[+2.0, +3.1]`, `(#12693)` and `NCCL_PROTO`
stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from orchestrator.answer.headline import text_lines
from orchestrator.ui.report import tables as T
from orchestrator.ui.report.answer import causes_table, detail_lines
from orchestrator.ui.report.collect import RunData
from orchestrator.ui.report.plots import Plot
from orchestrator.util.safe_text import printable

SIM_HEADER = " · simulated node (modeled times, no GPU measured)"

_MD_ALWAYS = re.compile(r"([\\`*|~])")  # code, emphasis, a table's cell, strikethrough
_MD_EDGE_UNDERSCORE = re.compile(r"(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")  # emphasis can start
_MD_LINK = re.compile(r"\](?=[(\[])")  # `[text](url)`, `[text][ref]`: the link's second half
_MD_ENTITY = re.compile(r"&(?=#?[0-9A-Za-z]+;)")  # `&lt;` typed in a subject stays as typed
_MD_BLOCK_START = re.compile(r"^(?:[#>]|[-+] )")  # a heading, a quote, a list item
_MD_ORDERED_ITEM = re.compile(r"^(\d+)([.)] )")  # `1. `: its dot is what is escaped


def md_escape(text: object, line_start: bool = True) -> str:
    """`text` as Markdown shows it as typed; `line_start=False` for a table cell, where a `#`,
    a `>` or a list marker starts no block and needs no backslash."""
    s = " ".join(printable(text).split())
    s = _MD_ENTITY.sub("&amp;", s).replace("<", "&lt;")
    s = _MD_ALWAYS.sub(r"\\\1", s)
    s = _MD_EDGE_UNDERSCORE.sub(r"\\_", s)
    s = _MD_LINK.sub("]\\\\", s)
    if not line_start:
        return s
    s = _MD_ORDERED_ITEM.sub(r"\1\\\2", s)
    return ("\\" + s) if _MD_BLOCK_START.match(s) else s


def md_table(table: T.TextTable) -> str:
    if not table.rows:
        return f"_{md_escape(table.title)}: none._\n"
    lines = ["| " + " | ".join(md_escape(h) for h in table.headers) + " |",
             "|" + "|".join("---" for _ in table.headers) + "|"]
    lines += ["| " + " | ".join(md_escape(c, line_start=False) or " " for c in row) + " |"
              for row in table.rows]
    if table.note:
        lines += ["", f"_{md_escape(table.note)}_"]
    return "\n".join(lines) + "\n"


def _answer_md(data: RunData) -> list[str]:
    answer = data.ranked.get("answer")
    if not answer:
        return ["No findings." if not data.ranked.get("findings") else "No answer recorded.", ""]
    first, *labelled = text_lines(answer)
    out = [f"**Answer:** {md_escape(first.removeprefix('answer: '))}", ""]
    out += [f"- {md_escape(line.strip())}" for line in labelled]
    out += [""] if labelled else []
    table = causes_table(answer)
    if table.rows:
        out.append(md_table(table))
    out += [md_escape(line) + "  " for line in detail_lines(answer)]
    if answer.get("sentence"):
        out += ["", f"_In one sentence:_ {md_escape(answer['sentence'])}"]
    return out + [""]


def _kernel_evidence_md(answer: dict) -> list[str]:
    """Per named cause: the kernel families that moved between its two sides (device ms per
    pass, interval across restarts), then the kernels inside the moved families."""
    entries = answer.get("evidence") or []
    if not entries:
        return []
    out = ["## Kernel evidence", ""]
    for e in entries:
        out += [f"### {md_escape(e.get('cause', ''))}", "", md_escape(e.get("line", "")), ""]
        if e.get("before"):
            out += [f"Sides: {md_escape(e['before'])} -> {md_escape(e['after'])};"
                    f" profiled trials {md_escape(', '.join(map(str, e.get('trials', []))))}", ""]
        if e.get("table"):
            out += [*e["table"], ""]
    return out


def render_markdown(data: RunData, plots: Sequence[Plot], plot_dir: str = "plots") -> str:
    ranked = data.ranked
    causes, _, settings = T.split_findings(ranked)
    out = [f"# sleuth report: {md_escape(data.run_id)}{SIM_HEADER if data.simulated else ''}", "",
           *_answer_md(data),
           "## Run", "", md_table(T.run_table(data)), "## Experiments", "",
           md_table(T.experiments_table(ranked)), "## Causes", "", md_table(T.findings_table(ranked))]
    out += [f"Not tested: {md_escape(line)}" + "  " for line in T.untested_lines(ranked)]
    out.append("")
    for f in causes:
        out += [f"### #{f['rank']} {md_escape(f.get('kind', ''))} {md_escape(f.get('id', ''))}", "",
                md_escape(f.get("summary", "")), ""]
        if f.get("subject"):
            out += [f"Commit subject: {md_escape(f['subject'])}"
                    + (f" (author {md_escape(f['author'])})" if f.get("author") else ""), ""]
        out.append(md_table(T.effects_table(f)))
        evidence = ", ".join(str(t) for t in f.get("evidence", []))
        out += [f"Evidence trials: {md_escape(evidence or 'none')}", ""]
        for name in ("suspect_trials", "failed_trials", "interrupted_trials", "outlier_trials"):
            if f.get(name):
                what = {"suspect_trials": "excluded from effects",
                        "failed_trials": "never measured",
                        "interrupted_trials": "stopped and run again, not evidence",
                        "outlier_trials": "restarts left out of the bisect as outliers"}[name]
                out += [f"{name.replace('_', ' ').capitalize()} ({what}):"
                        f" {md_escape(', '.join(map(str, f[name])))}", ""]
    if not causes:
        out += ["No causes named.", ""]
    if settings:
        out += ["## Settings (sweep)", "", md_table(T.settings_table(ranked))]
    for table in T.release_tables(data):
        out += ["## Releases", "", md_table(table)]
    out += _kernel_evidence_md(ranked.get("answer") or {})
    out += ["## Plots", ""]
    for p in plots:
        out += [f"### {md_escape(p.title)}", "", f"![{md_escape(p.title)}]({plot_dir}/{p.name}.png)",
                "", md_escape(p.caption), ""]
    fps = T.fingerprint_tables(data)
    out += ["## Fingerprint differences", ""]
    out += [md_table(t) for t in fps] or ["No fingerprint differences recorded.\n"]
    out += ["## Candidates", "", md_table(T.candidates_table(data)),
            "## Trials", "", md_table(T.trials_table(data.rows))]
    return "\n".join(out)
