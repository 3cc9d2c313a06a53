"""The report in the terminal: rich tables of the run, its experiments and ranked findings.

Cells are wrapped in `rich.text.Text`, so a commit subject like `[bold]x[/]` or `<script>` is
printed as typed, whatever markup setting the console has, and control characters (terminal
escapes in a commit message) are dropped first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.answer.headline import text_lines
from orchestrator.ui.report import tables as T
from orchestrator.ui.report.answer import causes_table, detail_lines
from orchestrator.ui.report.collect import RunData
from orchestrator.util.safe_text import printable

# Columns of the findings table worth their terminal width (the rest is in the files): an
# 80-column terminal holds these. Summaries follow the table as lines of their own.
_TERMINAL_FINDING_COLUMNS = ("rank", "id", "P(cause)", "effect [95% CI]", "phase")
MAX_TERMINAL_ROWS = 40


def rich_table(table: T.TextTable, columns: Sequence[str] | None = None,
               max_rows: int | None = None) -> Table:
    keep = [i for i, h in enumerate(table.headers) if columns is None or h in columns]
    out = Table(title=Text(printable(table.title)), title_justify="left")
    for i in keep:
        out.add_column(Text(printable(table.headers[i])), overflow="fold")
    rows = table.rows if max_rows is None else table.rows[:max_rows]
    for row in rows:
        out.add_row(*[Text(printable(row[i])) for i in keep])
    if max_rows is not None and len(table.rows) > max_rows:
        out.caption = Text(f"{len(table.rows) - max_rows} more rows in the report files")
    return out


def print_answer(console: Console, answer: Mapping | None) -> None:
    """The answer as a run ends with it and a report opens with it."""
    if not answer:
        return
    for line in text_lines(answer):  # the first line, then one labelled line each
        console.print(Text(printable(line)))
    table = causes_table(answer)
    if table.rows:
        console.print(rich_table(table, ("cause", table.headers[1], "share", "P(cause)")))
    for line in detail_lines(answer):
        console.print(Text(printable(line)))


def print_report(console: Console, data: RunData, paths: Sequence[Path] = ()) -> None:
    if data.simulated:
        console.print(Text(f"run {data.run_id} · simulated node (modeled times, no GPU"
                           " measured)"))
    print_answer(console, data.ranked.get("answer"))
    console.print(rich_table(T.run_table(data)))
    console.print(rich_table(T.experiments_table(data.ranked),
                             ("experiment", "verdict", "findings", "total change")))
    causes = T.split_findings(data.ranked)[0]
    console.print(rich_table(T.findings_table(data.ranked), _TERMINAL_FINDING_COLUMNS,
                             max_rows=MAX_TERMINAL_ROWS))
    for f in causes[:MAX_TERMINAL_ROWS]:
        console.print(Text(printable(f"  #{f.get('rank')} {f.get('summary', '')}")))
    for line in T.untested_lines(data.ranked):
        console.print(Text(printable(f"not tested: {line}")))
    settings = T.settings_table(data.ranked)
    if settings.rows:
        console.print(rich_table(settings, ("setting", "effect [95% CI]", "P(better)"),
                                 max_rows=MAX_TERMINAL_ROWS))
    for f in causes[:1]:
        console.print(rich_table(T.effects_table(f), ("metric", "change [95% CI]", "before",
                                                      "after", "trials")))
    for fp in T.fingerprint_tables(data):
        console.print(rich_table(fp, ("category", "field", "before", "after", "controllable"),
                                 max_rows=MAX_TERMINAL_ROWS))
    console.print(rich_table(T.candidates_table(data), ("candidate", "measured", "failed",
                                                        "mean", "sd"),
                             max_rows=MAX_TERMINAL_ROWS))
    for path in paths:
        console.print(Text(f"report: {path}"))
