"""rich's Table, whose cells fold onto more lines on a narrow terminal instead of cutting values short."""

from __future__ import annotations

from typing import Any

from rich import table

__all__ = ["Table"]


class Table(table.Table):
    """A ``rich.table.Table`` that never shows a value cut to "…": at 80 columns its cells wrap."""

    def __rich_console__(self, console: Any, options: Any) -> Any:
        for column in self.columns:
            column.overflow = "fold"
        yield from super().__rich_console__(console, options)
