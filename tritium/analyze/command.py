"""``tritium analyze``: model_analyzer's search for one model, as one command."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tritium.analyze.search import NOT_MEASURED, Trial
from tritium.perf.command import fail, parse_shapes
from tritium.perf.errors import PerfError
from tritium.perf.settings import parse_int_range


def _delays(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected microseconds as a,b,c, got '{text}'") from None


class Progress:
    """A bar over the candidates, with the time left at the pace so far."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.console = Console(stderr=True)
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn(),
                            console=self.console)
        self.task = self.bar.add_task("candidates", total=None)

    def plan(self, total: int) -> None:
        self.bar.update(self.task, total=total)

    def trial(self, trial: Trial) -> None:
        point = max(trial.points, key=lambda p: p.throughput, default=None)
        if trial.error:
            result = trial.error
        elif point is None:
            result = NOT_MEASURED
        else:
            result = f"{point.throughput:.1f} infer/s, p99 {point.p99_ms:.1f} ms"
        self.bar.console.print(f"{trial.model} {trial.candidate.label}: {result}", highlight=False)
        self.bar.advance(self.task)

    def __enter__(self):
        self.bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()


@click.command("analyze")
@click.option("-m", "--model", required=True, help="The model to tune (an ensemble: its composing models).")
@click.option("-u", "--url", default=None,
              help="HOST:PORT (HTTP) of a server started with --model-control-mode=explicit; "
                   "without it, analyze starts its own tritium server on --model-repository.")
@click.option("--model-repository", default=None, type=click.Path(file_okay=False, exists=True),
              help="The repository holding MODEL (needed when analyze starts its own server).")
@click.option("--output", "output", required=True, type=click.Path(file_okay=False),
              help="Folder for report.html, summary.png and MODEL/config.pbtxt.")
@click.option("-i", "--protocol", type=click.Choice(["http", "grpc"]), default="http", show_default=True,
              help="Protocol of the measured requests.")
@click.option("--grpc-url", default=None, help="HOST:PORT of the gRPC endpoint (with -i grpc and -u).")
@click.option("--concurrency", default="1,8", show_default=True, help="Concurrency levels: a,b,c or START:END:STEP.")
@click.option("-b", "--batch-size", default=1, show_default=True, type=click.IntRange(min=1),
              help="Batch size of each request.")
@click.option("--shape", multiple=True, help="NAME:d1,d2 for inputs with variable dimensions.")
@click.option("--latency-budget", "--max-p99-latency", "max_p99_ms", default=None, type=click.FloatRange(min=0),
              help="Constraint: p99 latency at most this many ms.")
@click.option("--min-throughput", default=None, type=click.FloatRange(min=0),
              help="Constraint: at least this many inferences per second.")
@click.option("--max-memory", "max_memory_mb", default=None, type=click.FloatRange(min=0),
              help="Constraint: the model's instances use at most this many MB of memory.")
@click.option("--objective", type=click.Choice(["throughput", "latency"]), default="throughput", show_default=True,
              help="What the best candidate has most of (throughput) or least of (p99 latency).")
@click.option("--max-instance-count", default=4, show_default=True, type=click.IntRange(min=1),
              help="The most instances a candidate may have.")
@click.option("--max-batch-size", default=64, show_default=True, type=click.IntRange(min=1),
              help="Largest max_batch_size tried (models that batch).")
@click.option("--queue-delays", default="0,100,1000", show_default=True,
              help="max_queue_delay_microseconds values tried around the best setting.")
@click.option("--max-candidates", default=24, show_default=True, type=click.IntRange(min=1),
              help="Candidates measured at most, per tuned model.")
@click.option("-p", "--measurement-interval", default=1000.0, show_default=True, type=click.FloatRange(min=10),
              help="Milliseconds per measurement window.")
@click.option("-r", "--max-trials", default=5, show_default=True, type=click.IntRange(min=3),
              help="Measurement windows tried per level before it is declared unsettled.")
@click.option("-s", "--stability-percentage", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="How far apart (percent) windows may be for a level to count as settled.")
def analyze_command(model, url, model_repository, output, protocol, grpc_url, concurrency, batch_size, shape,
                    max_p99_ms, min_throughput, max_memory_mb, objective, max_instance_count, max_batch_size, queue_delays,
                    max_candidates, measurement_interval, max_trials, stability_percentage) -> None:
    """Find MODEL's best instance count, batching and kind under the constraints, by measuring."""
    from tritium.analyze.control import ModelControl, OwnServer
    from tritium.analyze.report import Outcome, summary_table, write_outputs
    from tritium.analyze.runner import Analysis, SearchBounds, perf_settings
    from tritium.analyze.search import Constraints
    from tritium.analyze.space import config_text
    from tritium.hosts import detect_gpus

    try:
        levels = parse_int_range(concurrency)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--concurrency") from None
    if url is None and model_repository is None:
        raise click.UsageError("give -u for a running server, or --model-repository for analyze to start one")
    if url and protocol == "grpc" and not grpc_url:
        raise click.UsageError("-i grpc with -u needs --grpc-url HOST:PORT")
    limits = Constraints(max_p99_ms, min_throughput, max_memory_mb)
    bounds = SearchBounds(max_instance_count, max_batch_size, _delays(queue_delays), max_candidates,
                          gpus=bool(detect_gpus()))
    server = None
    control = None
    try:
        if url is None:
            server = OwnServer(model_repository, [model])
            url, grpc_url = server.url, f"127.0.0.1:{server.grpc_port}"
        control = ModelControl(url)
        measured_config = control.check(model)   # before the progress bar: a failure is one line
        measured_url = grpc_url if protocol == "grpc" else url
        perf = perf_settings(model, measured_url, protocol, levels, measurement_interval, max_trials,
                             stability_percentage, batch_size, parse_shapes(shape))
        with Progress() as progress:
            analysis = Analysis(control, perf, bounds, limits, objective, progress.trial, progress.plan)
            trials, best = analysis.run(measured_config)
    except PerfError as exc:
        fail(exc)
    except Exception as exc:  # a failure nobody foresaw still reads as one line
        from tritium.perf.client import server_message

        fail(PerfError(f"{type(exc).__name__}: {server_message(exc)}"))
    finally:
        if control is not None:
            control.close()
        if server is not None:
            server.stop()
    outcome = Outcome(model, tuple(trials), best, limits, objective, tuple(levels))
    configs = {name: config_text(trial.config) for name, trial in best.items()
               if not trial.violations(limits)}
    report = write_outputs(outcome, Path(output), configs)
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=140)   # a file or a pipe: rows on one line each
    console.print(summary_table(outcome))
    if not configs:
        click.echo(f"error: no candidate met the constraints; see {report}", err=True)
        sys.exit(1)
    for name in configs:
        click.echo(f"best for {name}: {best[name].candidate.label} -> {Path(output) / name / 'config.pbtxt'}")
    click.echo(f"report: {report}")
