"""The ``tritium`` command: one subcommand per process role, plus tools."""

from __future__ import annotations

import sys

import click
import orjson

from tritium import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tritium")
def main() -> None:
    """tritium: a Triton-compatible inference server."""


def _bool_flag(value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise click.BadParameter(f"expected true or false, got '{value}'")


@main.group("repo")
def repo_group() -> None:
    """Inspect model repositories."""


@repo_group.command("check")
@click.argument("repositories", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--model-config-name", default=None, help="Use <model>/configs/NAME.pbtxt when present.")
@click.option("--disable-auto-complete-config", is_flag=True, help="Do not complete configs from model files.")
@click.option("--strict-model-config", default="false", help="Deprecated Triton alias: true disables auto-complete.")
def repo_check(repositories, as_json, model_config_name, disable_auto_complete_config,
               strict_model_config) -> None:
    """Show every model of REPOSITORIES as tritium would load it; exit 1 if any fails."""
    from repo import ModelRepository, RepositoryOptions
    from repo.check import check_rows, render_table, rows_as_json
    from tritium.hosts import detect_gpus

    options = RepositoryOptions(
        model_config_name=model_config_name,
        auto_complete=not (disable_auto_complete_config or _bool_flag(strict_model_config)),
        gpus=detect_gpus(),
    )
    scan = ModelRepository(repositories, options).load_all()
    rows = check_rows(scan)
    if as_json:
        sys.stdout.write(orjson.dumps(rows_as_json(rows, scan.errors), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        click.echo(render_table(rows, scan.errors))
    failed = scan.errors or any(not row.ok for row in rows)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
