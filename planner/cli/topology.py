"""`planner topology list|show|validate`: browse the shipped clusters, see the links groups get, check a file."""

from pathlib import Path

import typer

from planner.cli.common import emit_text, guarded

topology_app = typer.Typer(
    name="topology",
    help=(
        "Cluster topologies: devices, fabrics and the bandwidth a process group sees.\n\n"
        "Examples:\n\n"
        "  planner topology list\n\n"
        "  planner topology show dgx-h100 --nodes 4\n\n"
        "  planner topology show my-cluster.yaml --json\n\n"
        "  planner topology validate my-cluster.yaml"
    ),
    no_args_is_help=True,
)


@topology_app.command("list")
@guarded
def list_command(
    json_output: bool = typer.Option(False, "--json", help="Print JSON (one object per preset) instead of a table."),
) -> None:
    """List the shipped presets: device, memory, peak bf16, intra-node fabric and per-GPU NIC share.

    Example: planner topology list --json
    """
    from planner import api
    from planner.io import canonical_json

    rows = api.topology_rows()
    if json_output:
        emit_text(canonical_json(rows), None)
        return
    from rich.table import Table

    from planner.report import console, print_table

    from rich import box

    table = Table(title="Topology presets", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    headers = ("name", "device", "gpn", "GiB", "bf16 TF/s", "intra", "GB/s", "inter", "NIC GB/s/GPU")
    for header in headers:
        table.add_column(header, justify="left" if header in ("name", "device", "intra", "inter") else "right", no_wrap=header == "name", overflow="fold")
    keys = ("name", "device", "gpus_per_node", "memory_GiB", "peak_bf16_tflops", "intra_kind", "intra_bandwidth_GBps", "inter_kind", "nic_share_GBps")
    for row in rows:
        table.add_row(*(f"{row[key]:.4g}" if isinstance(row[key], float) else str(row[key]) for key in keys))
    print_table(console(), table)


@topology_app.command("show")
@guarded
def show_command(
    ref: str = typer.Argument(..., metavar="NAME_OR_PATH", help="A preset name or a topology YAML/JSON file."),
    nodes: int | None = typer.Option(None, "--nodes", "-n", help="Scale the cluster to this many nodes."),
    json_output: bool = typer.Option(False, "--json", help="Print the resolved topology and the group links as JSON."),
) -> None:
    """Show a topology: device, fabrics, and the bandwidth TP groups inside a node and DP groups across nodes see.

    Example: planner topology show dgx-h100 --nodes 4
    """
    from planner import api
    from planner.io import canonical_json

    report = api.topology_report(ref, nodes=nodes)
    if json_output:
        emit_text(canonical_json(report), None)
        return
    _render_show(report)


def _render_show(report: dict) -> None:
    from rich import box
    from rich.table import Table

    from planner.report import console, print_table

    topo = report["topology"]
    out = console()
    fields = Table(title=f"Topology {topo['name']} ({report['num_gpus']} GPUs)", title_justify="left", show_header=False)
    fields.add_column("field", no_wrap=True)
    fields.add_column("value")
    for key in ("description", "gpus_per_node", "num_nodes"):
        fields.add_row(key, str(topo[key]))
    for section in ("device", "intra_node", "inter_node"):
        fields.add_row(section, ", ".join(f"{k}={v}" for k, v in topo[section].items()))
    fields.add_row("source", topo["source"])
    print_table(out, fields)
    groups = Table(title="Links of typical process groups (tp innermost)", title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("group", "size", "nodes", "ranks/node", "slowest link GB/s", "latency us"):
        groups.add_column(header, justify="left" if header == "group" else "right", no_wrap=True)
    for row in report["groups"]:
        bandwidth = "-" if row["bandwidth_GBps"] is None else f"{row['bandwidth_GBps']:g}"
        groups.add_row(row["group"], str(row["size"]), str(row["num_nodes"]), str(row["ranks_per_node"]), bandwidth, f"{row['latency_s'] * 1e6:g}")
    out.print(groups)


@topology_app.command("validate")
@guarded
def validate_command(
    path: Path = typer.Argument(..., metavar="FILE", help="A topology YAML/JSON file."),
) -> None:
    """Check a topology file against the schema: exit 0 when valid, 2 with the field, value and fix otherwise.

    Example: planner topology validate my-cluster.yaml
    """
    from planner.errors import BadInputError
    from planner.io import load_file
    from planner.schemas.topology import Topology

    try:
        topology = load_file(Topology, path)
    except BadInputError as exc:
        raise BadInputError(
            f"{exc}; fix: correct the field named above (see `planner topology show dgx-h100 --json` for a complete, valid topology)"
        ) from None
    emit_text(f"{path}: valid topology {topology.name!r} ({topology.num_nodes} x {topology.gpus_per_node} {topology.device.name})\n", None)


def register(app: typer.Typer) -> None:
    """Add `planner topology` to the main app."""
    app.add_typer(topology_app, name="topology")
