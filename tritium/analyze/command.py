import click


@click.command("analyze")
def analyze_command() -> None:
    """placeholder"""
