"""``tritium perf``: perf_analyzer's command line over tritium's measuring engine."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import click
import orjson

from tritium.perf.errors import PerfError
from tritium.perf.settings import (LoadLevel, Measurement, PerfSettings, Sequences, parse_float_range,
                                   parse_int_range)

if TYPE_CHECKING:
    from rich.status import Status   # rich is imported by Progress, when a command runs


def parse_shapes(values) -> dict[str, list[int]]:
    shapes = {}
    for value in values:
        name, _, dims = value.partition(":")
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d]
        except ValueError:
            raise click.BadParameter(f"--shape takes NAME:d1,d2,... got '{value}'") from None
    return shapes


def _levels(concurrency_range: str | None, request_rate_range: str | None) -> tuple[LoadLevel, ...]:
    if concurrency_range and request_rate_range:
        raise click.UsageError("give --concurrency-range or --request-rate-range, not both")
    try:
        if request_rate_range:
            return tuple(LoadLevel(request_rate=r) for r in parse_float_range(request_rate_range))
        values = parse_int_range(concurrency_range or "1")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not values or min(values) < 1:
        raise click.BadParameter("concurrency levels must be 1 or more", param_hint="--concurrency-range")
    return tuple(LoadLevel(concurrency=c) for c in values)


def _sequence_ids(text: str | None) -> tuple[int, int]:
    if not text:
        return 1, 2**32 - 1
    start, _, end = text.partition(":")
    try:
        return int(start), int(end) if end else 2**32 - 1
    except ValueError:
        raise click.BadParameter(f"expected START:END, got '{text}'", param_hint="--sequence-id-range") from None


def perf_options(command):
    """perf_analyzer's flag names; tritium's earlier forms stay as aliases."""
    options = [
        click.option("-m", "--model", required=True, help="Model to measure."),
        click.option("-x", "--model-version", default="", help="Model version (default: the server's choice)."),
        click.option("-u", "--url", default=None, help="HOST:PORT (default localhost:8000 for HTTP, :8001 for gRPC)."),
        click.option("-i", "--protocol", type=click.Choice(["http", "grpc"], case_sensitive=False), default="http",
                     show_default=True, help="The protocol requests are sent with."),
        click.option("-b", "--batch-size", default=1, show_default=True, type=click.IntRange(min=1),
                     help="Batch size of each request."),
        click.option("--concurrency-range", "--concurrency", "concurrency_range", default=None,
                     help="START:END:STEP (STEP may be xN to multiply) or a,b,c; default 1."),
        click.option("--request-rate-range", default=None, help="START:END:STEP requests per second, or a,b,c."),
        click.option("--request-distribution", type=click.Choice(["constant", "poisson"]), default="constant",
                     show_default=True, help="Request-rate mode: how requests are spaced in time."),
        click.option("--shared-memory", type=click.Choice(["none", "system"]), default="none", show_default=True,
                     help="Send the inputs through system shared memory (the server must share this host)."),
        click.option("--input-data", default="random", show_default=True,
                     help="random, zero, or a JSON data file in perf_analyzer's layout."),
        click.option("--shape", multiple=True, help="NAME:d1,d2 for inputs with variable dimensions."),
        click.option("--string-length", default=128, show_default=True, type=click.IntRange(min=1),
                     help="Length of the generated strings of BYTES inputs."),
        click.option("--input-tensor-format", "--tensor-format", "tensor_format",
                     type=click.Choice(["binary", "json"]), default="binary", show_default=True,
                     help="How tensors travel: Triton's binary extension or JSON."),
        click.option("-p", "--measurement-interval", default=5000.0, show_default=True, type=click.FloatRange(min=1),
                     help="Milliseconds per measurement window."),
        click.option("--measurement-mode", type=click.Choice(["time_windows", "count_windows"]),
                     default="time_windows", show_default=True, help="Windows of a fixed time or of a fixed request count."),
        click.option("--measurement-request-count", default=50, show_default=True, type=click.IntRange(min=1),
                     help="count_windows: requests per window."),
        click.option("-s", "--stability-percentage", default=10.0, show_default=True, type=click.FloatRange(min=0),
                     help="How far apart (percent) three windows may be for a level to count as settled."),
        click.option("-r", "--max-trials", default=10, show_default=True, type=click.IntRange(min=1),
                     help="Windows tried per level before it is declared unsettled."),
        click.option("--percentile", default=None, type=click.IntRange(1, 99),
                     help="Judge stability on this latency percentile instead of the average."),
        click.option("--duration", default=None, type=click.FloatRange(min=0.01),
                     help="tritium: measure each level for this many seconds, in one window."),
        click.option("--requests", default=None, type=click.IntRange(min=1),
                     help="tritium: measure each level over this many requests, in one window."),
        click.option("--warmup", default=0.0, show_default=True, type=click.FloatRange(min=0),
                     help="Seconds of unmeasured load at the start of each level."),
        click.option("--sequence-length", default=20, show_default=True, type=click.IntRange(min=1),
                     help="Sequence models: requests per sequence."),
        click.option("--sequence-length-variation", default=20.0, show_default=True, type=click.FloatRange(min=0),
                     help="Sequence models: how much (percent) a sequence's length may vary."),
        click.option("--sequence-id-range", default=None, help="START:END of the sequence ids used."),
        click.option("--num-of-sequences", default=4, show_default=True, type=click.IntRange(min=1),
                     help="Request-rate mode: sequences kept going at once."),
        # perf_analyzer's threading flags: accepted so its command lines run unchanged; one event
        # loop sends every request here
        click.option("-a", "--async", "async_mode", is_flag=True, hidden=True),
        click.option("--sync", "sync_mode", is_flag=True, hidden=True),
        click.option("--max-threads", default=None, type=int, hidden=True),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def settings_from(params: dict) -> PerfSettings:
    """PerfSettings from the parsed flags of :func:`perf_options`."""
    protocol = params["protocol"].lower()
    url = params["url"] or ("localhost:8001" if protocol == "grpc" else "localhost:8000")
    single_window = params["duration"] is not None or params["requests"] is not None
    measurement = Measurement(
        interval_ms=params["duration"] * 1000 if params["duration"] else params["measurement_interval"],
        request_count=params["requests"] or params["measurement_request_count"],
        count_windows=params["requests"] is not None or params["measurement_mode"] == "count_windows",
        stability_percent=params["stability_percentage"],
        max_trials=1 if single_window else params["max_trials"], stable_windows=1 if single_window else 3,
        percentile=params["percentile"], warmup_s=params["warmup"])
    id_start, id_end = _sequence_ids(params["sequence_id_range"])
    if params["tensor_format"] == "json" and protocol == "grpc":
        raise click.UsageError("--input-tensor-format json is for HTTP only")
    return PerfSettings(
        model=params["model"], url=url, protocol=protocol, version=params["model_version"],
        batch_size=params["batch_size"], levels=_levels(params["concurrency_range"], params["request_rate_range"]),
        distribution=params["request_distribution"], shared_memory=params["shared_memory"],
        input_data=params["input_data"], shapes=parse_shapes(params["shape"]), string_length=params["string_length"],
        binary_tensors=params["tensor_format"] == "binary", measurement=measurement,
        sequences=Sequences(id_start, id_end, params["sequence_length"], params["sequence_length_variation"],
                            params["num_of_sequences"]))


def fail(error: PerfError) -> NoReturn:
    click.echo(f"error: {error.message}", err=True)
    sys.exit(error.exit_code)


class Progress:
    """One live line per level on stderr while it is measured, kept once the level is done."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, quiet=quiet)
        self.status: Status | None = None   # the live line of the level being measured

    def window(self, level, index, window) -> None:
        text = (f"{level}: window {index}, {window.throughput:.1f} req/s, "
                f"p99 {window.latency_ns(99) / 1e6:.2f} ms")
        if self.status is None:
            self.status = self.console.status(text)
            self.status.start()
        else:
            self.status.update(text)

    def level(self, report) -> None:
        self.close()
        kind = "request rate" if report.request_rate else "concurrency"
        note = "" if report.stable else " (not stable)"
        self.console.print(f"{kind} {report.level_name}: {report.inferences_per_s:.1f} infer/s, "
                           f"p50 {report.p50_us / 1000:.2f} ms, p99 {report.p99_us / 1000:.2f} ms, "
                           f"{report.windows} window(s){note}", highlight=False)

    def close(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


@click.command("perf")
@perf_options
@click.option("-f", "--csv", "csv_path", default=None, help="Write perf_analyzer's CSV here.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON instead of the table.")
@click.option("--plot", "plot_path", default=None, help="Draw throughput against latency, and latencies, to this PNG.")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def perf_command(csv_path, as_json, plot_path, quiet, **params) -> None:
    """Measure throughput and latency of MODEL at each concurrency or request rate (perf_analyzer's flags)."""
    from tritium.perf.report import render, write_csv
    from tritium.perf.sweep import run_sweep

    settings = settings_from(params)
    progress = Progress(quiet)
    try:
        reports = run_sweep(settings, progress.window, progress.level)
    except PerfError as exc:
        progress.close()
        fail(exc)
    except KeyboardInterrupt:
        progress.close()
        fail(PerfError("interrupted", 130))
    except Exception as exc:  # a failure nobody foresaw still reads as one line
        progress.close()
        fail(PerfError(f"{type(exc).__name__}: {exc}"))
    if csv_path:
        write_csv(csv_path, reports)
    if plot_path:
        from tritium.perf.plot import plot_levels

        plot_levels(plot_path, settings.model, reports)
    if as_json:
        click.echo(orjson.dumps([r.as_dict() for r in reports], option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(render(reports))
