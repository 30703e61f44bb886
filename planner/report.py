"""Rendering for humans: rich tables. The only module that imports rich."""

from rich import box
from rich.console import Console
from rich.table import Table


def console(*, stderr: bool = False) -> Console:
    """A console for CLI output (stderr for errors and progress)."""
    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _plain(cell: object) -> str:
    """A cell's text without markup or styles, on one line."""
    from rich.text import Text

    text = Text.from_markup(cell) if isinstance(cell, str) else cell if isinstance(cell, Text) else Text(str(cell))
    return " ".join(text.plain.split())


def table_fits(out: Console, table: Table) -> bool:
    """Whether the table's natural width (every cell on one line) fits the console (terminal width; $COLUMNS or
    80 when captured)."""
    from rich.measure import Measurement

    return Measurement.get(out, out.options.update_width(1 << 16), table).maximum <= out.width


def plain_records(table: Table, width: int) -> list[str]:
    """The table as text that never breaks a word nor elides one: per row, its first cell, then one indented
    `header: value` line per other column, wrapped at spaces to `width` (a word longer than the line stays whole)."""
    import textwrap

    headers = [_plain(column.header) for column in table.columns]
    columns = [[_plain(cell) for cell in column.cells] for column in table.columns]
    lines = textwrap.wrap(_plain(table.title), width, break_long_words=False, break_on_hyphens=False) if table.title else []
    for row in zip(*columns):
        if not table.show_header or len(row) == 1:
            label, value = row[0], " ".join(row[1:])
            lines += textwrap.wrap(f"{label}: {value}", width, subsequent_indent="    ", break_long_words=False,
                                   break_on_hyphens=False) or [label]
            continue
        heading = row[0] if headers[0] in ("", "name") else f"{headers[0]}: {row[0]}"
        lines += textwrap.wrap(heading, width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)
        for header, value in zip(headers[1:], row[1:]):
            lines += textwrap.wrap(f"{header}: {value}", width, initial_indent="  ", subsequent_indent="      ",
                                   break_long_words=False, break_on_hyphens=False)
    if table.caption:
        lines += textwrap.wrap(_plain(table.caption), width, break_long_words=False, break_on_hyphens=False)
    return lines


def print_wrapped(out: Console, text: str, *, indent: str = "", hang: str = "    ") -> None:
    """A line of prose wrapped at spaces to the console's width (no markup read), continuation lines indented by
    `hang`: a terminal's own wrap breaks words, and a captured file gets lines of 80 columns (or $COLUMNS)."""
    import textwrap

    for line in textwrap.wrap(text, max(out.width, 40), initial_indent=indent, subsequent_indent=indent + hang,
                              break_long_words=False, break_on_hyphens=False) or [""]:
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def print_table(out: Console, table: Table) -> None:
    """Print a table: the rich table where it fits the console's width, else plain_records (at 80 columns or
    captured to a file, a wide table would wrap mid-word or shrink cells to '…')."""
    if table_fits(out, table):
        out.print(table)
        return
    for line in plain_records(table, max(out.width, 40)):
        out.print(line, markup=False, highlight=False, soft_wrap=True)
    out.print()


# --- planner models (list / show) ---------------------------------------------------------------


def _billions(count: int | None) -> str:
    if count is None:
        return "-"
    billions = count / 1e9
    return f"{billions:,.1f}B" if billions >= 100 else f"{billions:,.2f}B"


def models_table(rows: list[dict]) -> Table:
    """`planner models list`: one row per model (rows from planner.models.summary.model_row)."""
    table = Table(title="Model presets", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    table.add_column("name", no_wrap=True)
    for header in ("params", "active", "layers", "hidden", "heads/kv", "experts/k", "seq_len"):
        table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        moe = f"{row['num_experts']}/{row['top_k']}" if row.get("num_experts") else "-"
        table.add_row(
            row["name"], _billions(row["total_params"]), _billions(row["active_params"]), str(row["num_layers"]),
            str(row["hidden_size"]), f"{row['num_attention_heads']}/{row['num_kv_heads']}", moe, str(row["seq_len"]),
        )
    return table


def model_detail_tables(report: dict) -> list[Table]:
    """`planner models show`: the spec's fields and the parameter breakdown (from planner.models.summary.model_report)."""
    spec, params = report["spec"], report["params"]
    fields = Table(title=f"Model {spec['name']}", title_justify="left", show_header=False)
    fields.add_column("field")
    fields.add_column("value")
    for key, value in spec.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        fields.add_row(key, "-" if value is None else str(value))
    counts = Table(title="Parameters", title_justify="left")
    counts.add_column("part", no_wrap=True)
    counts.add_column("count", justify="right")
    counts.add_column("billions", justify="right")
    for key, value in params.items():
        is_count = not key.endswith("_layers")  # dense_layers, moe_layers, linear_mixer_layers, mamba_mixer_layers
        counts.add_row(key, f"{value:,}", _billions(value) if is_count else "")
    return [fields, counts]


# What each `pruned` key of a plan means, for readers of `planner plan`; other keys are validity rules
# ("layers_not_divisible_by_pp_vpp") and read as their words.
PRUNED_MEANING = {
    "time_lower_bound": "provably slower than the plans kept (step-time lower bound)",
    "memory_lower_bound": "provably over GPU memory (memory lower bound)",
    "does_not_fit": "evaluated and over GPU memory",
    "search_time_limit": "not reached within the time limit",
}


def describe_pruned(pruned: dict[str, int]) -> str:
    """`pruned` as words: '20,104 provably slower than ...; 21,780 layers not divisible by pp vpp'."""
    return "; ".join(f"{count:,} {PRUNED_MEANING.get(key, key.replace('_', ' '))}" for key, count in sorted(pruned.items()))


def describe_axis_order(axis_order) -> str:
    """The rank layout in words: the last axis varies fastest between consecutive ranks."""
    return (f"rank order {'>'.join(axis_order)} (outermost to innermost: consecutive ranks differ in "
            f"{axis_order[-1]} first{', which keeps TP inside a node' if axis_order[-1] == 'tp' else ''})")
