"""The report in the terminal: rich tables of the run, its experiments and ranked findings.

Cells are wrapped in `rich.text.Text`, so a commit subject like `[bold]x[/]` or `<script>` is
printed as typed, whatever markup setting the console has, and control characters (terminal
escapes in a commit message) are dropped first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.report import tables as T
from orchestrator.report.collect import RunData
from orchestrator.safe_text import printable

# Columns of the findings table worth their terminal width (the rest is in the files).
# Summaries follow the table as lines of their own: in a column they wrap into a narrow tower.
_TERMINAL_FINDING_COLUMNS = ("rank", "kind", "id", "experiment", "P(cause)", "effect [95% CI]",
                             "phase", "accept len", "cuda graph share", "trials", "flags")
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


def print_report(console: Console, data: RunData, paths: Sequence[Path] = ()) -> None:
    console.print(rich_table(T.run_table(data)))
    console.print(rich_table(T.experiments_table(data.ranked)))
    console.print(rich_table(T.findings_table(data.ranked), _TERMINAL_FINDING_COLUMNS,
                             max_rows=MAX_TERMINAL_ROWS))
    for f in data.ranked.get("findings", [])[:MAX_TERMINAL_ROWS]:
        console.print(Text(printable(f"  #{f.get('rank')} {f.get('summary', '')}")))
    top = data.ranked.get("findings", [])[:1]
    for f in top:
        console.print(rich_table(T.effects_table(f)))
    for fp in T.fingerprint_tables(data):
        console.print(rich_table(fp, max_rows=MAX_TERMINAL_ROWS))
    console.print(rich_table(T.candidates_table(data), max_rows=MAX_TERMINAL_ROWS))
    for path in paths:
        console.print(Text(f"report: {path}"))
