"""`delta pipeline ...`: commands on pipeline graphs (registered in the client's CLI)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from deltad.protocol import exitcodes

from .describe import describe
from .load import check_file
from .problems import GraphError


@click.group("pipeline")
def pipeline() -> None:
    """Pipelines: DOT graphs of LLM steps and human gates."""


@pipeline.command("check")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--strict", is_flag=True, help="Refuse a graph with warnings too (exit 2).")
def check_cmd(file: Path, strict: bool) -> None:
    """Check FILE.dot: list its nodes, edges and gates (exit 0, warnings on stderr), or every
    problem (exit 2)."""
    try:
        checked = check_file(file, strict=strict)
    except GraphError as e:
        for line in e.lines():
            click.echo(f"delta: error: {line}", err=True)
        for line in e.warning_lines():
            click.echo(f"delta: warning: {line}", err=True)
        sys.exit(exitcodes.USAGE)
    for line in checked.warning_lines():
        click.echo(f"delta: warning: {line}", err=True)
    click.echo(describe(checked.graph, str(file)))
