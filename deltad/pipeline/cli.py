"""`delta pipeline ...`: commands on pipeline graphs (registered in the client's CLI)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from deltad.protocol import exitcodes

from .describe import describe
from .load import load_pipeline
from .problems import GraphError


@click.group("pipeline")
def pipeline() -> None:
    """Pipelines: DOT graphs of LLM steps and human gates."""


@pipeline.command("check")
@click.argument("file", type=click.Path(path_type=Path))
def check_cmd(file: Path) -> None:
    """Check FILE.dot: list its nodes, edges and gates (exit 0), or every problem (exit 2)."""
    try:
        graph = load_pipeline(file)
    except GraphError as e:
        for line in e.lines():
            click.echo(f"delta: error: {line}", err=True)
        sys.exit(exitcodes.USAGE)
    click.echo(describe(graph, str(file)))
