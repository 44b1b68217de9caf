"""``tritium repo check``: one row per model, saying what would load and why not."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tritium.model_config_proto import model_config_pb2

from tritium.repo.autoscale import autoscale_policy
from tritium.repo.errors import ModelLoadError
from tritium.repo.model import ModelDefinition
from tritium.repo.repository import ModelEntry, RepositoryScan


@dataclass(frozen=True)
class CheckRow:
    name: str
    backend: str
    versions: list[int]
    max_batch_size: int | None
    scheduler: str
    instance_groups: str
    ok: bool
    error: str | None
    path: str


def check_rows(scan: RepositoryScan) -> list[CheckRow]:
    return [_row(entry) for _, entry in sorted(scan.models.items())]


def _row(entry: ModelEntry) -> CheckRow:
    path = ", ".join(str(p) for p in entry.paths)
    definition = entry.definition
    if definition is None or entry.error is not None:
        return CheckRow(entry.name, "-", [], None, "-", "-", False, entry.error, path)
    version_errors = _version_errors(definition)
    config = definition.config
    return CheckRow(
        name=entry.name,
        backend=_backend(config),
        versions=list(definition.loadable_versions),
        max_batch_size=config.max_batch_size,
        scheduler=_scheduler(definition),
        instance_groups=_groups(config),
        ok=not version_errors,
        error="; ".join(version_errors) or None,
        path=path,
    )


def _version_errors(definition: ModelDefinition) -> list[str]:
    # With several versions, say which one each error is about (when it does not already).
    several = len(definition.versions) > 1
    return [f"version {v.version}: {v.error}" if several and not v.error.startswith("version ") else v.error
            for v in definition.versions if v.error]


def _backend(config) -> str:
    if config.platform and config.backend:
        return f"{config.backend}/{config.platform}"
    return config.platform or config.backend


def _scheduler(definition: ModelDefinition) -> str:
    config = definition.config
    choice = config.WhichOneof("scheduling_choice")
    if choice == "dynamic_batching":
        batching = config.dynamic_batching
        preferred = ",".join(str(s) for s in batching.preferred_batch_size)
        return f"dynamic(delay={batching.max_queue_delay_microseconds}us,preferred=[{preferred}])"
    if choice == "sequence_batching":
        return f"sequence({config.sequence_batching.WhichOneof('strategy_choice') or 'direct'})"
    if choice == "ensemble_scheduling":
        return f"ensemble({len(config.ensemble_scheduling.step)} steps)"
    return "default"


def _groups(config) -> str:
    if len(config.instance_group) == 0:
        return "-"
    try:
        policy = autoscale_policy(config)
    except ModelLoadError:   # a model whose versions failed before its autoscale setting was read
        policy = None
    if policy is not None:  # the broker places min..max instances, not the groups' counts
        kind = model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind)
        return f"{policy.min_instances}-{policy.max_instances}x{kind.removeprefix('KIND_')}(autoscale)"
    parts = []
    for group in config.instance_group:
        kind = model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind).removeprefix("KIND_")
        gpus = f"@gpu{','.join(str(g) for g in group.gpus)}" if len(group.gpus) else ""
        parts.append(f"{group.count}x{kind}{gpus}")
    return " ".join(parts)


def render_table(rows: list[CheckRow], repository_errors: tuple[str, ...]) -> str:
    header = ("MODEL", "BACKEND", "VERSIONS", "MAX_BATCH", "SCHEDULER", "INSTANCES", "STATUS")
    table = [header]
    for row in rows:
        table.append((
            row.name, row.backend, ",".join(str(v) for v in row.versions) or "-",
            "-" if row.max_batch_size is None else str(row.max_batch_size),
            row.scheduler, row.instance_groups, "OK" if row.ok else "FAIL"))
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in table]
    failures = [row for row in rows if not row.ok]
    if failures or repository_errors:
        lines.append("")
    for error in repository_errors:
        lines.append(f"error: {error}")
    for row in failures:
        lines.append(f"{row.name}: {(row.error or '').rstrip()}")   # (a Python error ends its frames with a newline)
    return "\n".join(lines)


def rows_as_json(rows: list[CheckRow], repository_errors: tuple[str, ...]) -> dict:
    return {"models": [asdict(r) for r in rows], "repository_errors": list(repository_errors),
            "ok": not repository_errors and all(r.ok for r in rows)}
