"""The ``ragguard`` command: ``ragguard demo``, ``bench``, ``doctor`` and ``version``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    # Typer's Rich help (0.28 and later) prints a type beside every flag ("--quick <bool>", even
    # "--help <bool>"); the plain help prints flags as flags and options with their metavar.
    rich_markup_mode=None,
    context_settings={"show_default": True},
    help="ragguard: resilience middleware for RAG pipelines.",
)

EVENTS_FILE = "ragguard-events.jsonl"  # ragguard.monitors.DEFAULT_EVENTS_FILE, without importing it


@app.command(short_help="Run a RAG service under chaos, unguarded vs guarded.")
def demo(
    duration: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS", show_default="40, or 9 with --quick",
            help="Seconds of load in each of the two runs (unguarded, then guarded).",
        ),
    ] = None,
    concurrency: Annotated[
        int, typer.Option(metavar="N", help="Requests the load generator keeps in flight at most.")
    ] = 64,
    scenario: Annotated[
        Path | None,
        typer.Option(
            metavar="FILE", show_default="built-in",
            help="A ragguard.chaos scenario YAML: the faults and when they strike (the built-in one is "
            "ragguard/chaos/scenarios/default.yaml).",
        ),
    ] = None,
    redis: Annotated[
        str | None,
        typer.Option(
            "--redis", metavar="URL", show_default="none",
            help="Keep the guarded run's tenant quotas and breakers in this Redis, shared by every "
            "demo replica pointed at it (none: in memory).",
        ),
    ] = None,
    quick: Annotated[
        bool,
        typer.Option("--quick", show_default="off", help="A short run: 9 s of load per run, 30 s in all."),
    ] = False,
    out: Annotated[
        Path, typer.Option(metavar="DIR", help="Folder for report.json, latency.png and events.jsonl.")
    ] = Path("ragguard-report"),
    seed: Annotated[
        int, typer.Option(metavar="N", help="Seeds the arrival plan, the questions asked and the faults.")
    ] = 7,
) -> None:
    """Run a real RAG service under chaos twice, unguarded and guarded, and compare them.

    Exit status: 0 done, 2 a bad option or scenario.
    """
    try:
        from .demo import cli_main
    except ImportError as exc:  # the demo's optional dependencies are missing
        typer.echo(f"the demo needs its extras: pip install 'ragguard[demo]' ({exc})", err=True)
        raise typer.Exit(2) from exc
    code = cli_main(
        duration_s=duration,
        concurrency=concurrency,
        scenario=scenario,
        redis_url=redis,
        quick=quick,
        out_dir=out,
        seed=seed,
    )
    raise typer.Exit(code)


@app.command()
def bench(
    quick: Annotated[bool, typer.Option("--quick", help="A CI run, under 60 s.")] = False,
    steps: Annotated[
        str | None, typer.Option(help="Offered loads as multiples of capacity, e.g. '0.5,1,2,3'.")
    ] = None,
    steady: Annotated[float | None, typer.Option(help="Measured seconds per contender and step.")] = None,
    rounds: Annotated[int | None, typer.Option(help="Rounds per step (medians are reported).")] = None,
    block_ms: Annotated[
        float, typer.Option(help="Dependency bottleneck per embedding call, ms (capacity ~ 1000/block_ms).")
    ] = 15.0,
    rtt_ms: Annotated[float, typer.Option(help="Dependency's unloaded latency, ms.")] = 60.0,
    halving: Annotated[bool, typer.Option(help="Run the capacity-halving scenario.")] = True,
    out: Annotated[Path, typer.Option(help="Folder for bench.json and bench.png.")] = Path("ragguard-bench"),
    seed: Annotated[int, typer.Option(help="Seed of the load, the faults and the Guards.")] = 7,
) -> None:
    """Stepped load on the demo's real service: unguarded, hand-composed, ragguard static and adaptive."""
    try:
        from .bench import cli_main as bench_main
    except ImportError as exc:  # the demo's optional dependencies are missing
        typer.echo(f"the bench needs the demo extras: pip install 'ragguard[demo]' ({exc})", err=True)
        raise typer.Exit(2) from exc
    parsed: tuple[float, ...] | None = None
    if steps is not None:
        try:
            parsed = tuple(float(x) for x in steps.split(",") if x.strip())
        except ValueError:
            shown = steps[:60]
            typer.echo(f"ragguard bench: --steps must be numbers joined by commas, got {shown!r}", err=True)
            raise typer.Exit(2) from None
    code = bench_main(
        quick=quick, steps=parsed, steady_s=steady, rounds=rounds, block_ms=block_ms, rtt_ms=rtt_ms,
        halving=halving, out_dir=out, seed=seed,
    )
    raise typer.Exit(code)


@app.command(short_help="Explain breaker trips, quota refusals, fallbacks, stalls.")
def doctor(
    events: Annotated[
        Path,
        typer.Option(
            "--events", "-e", metavar="FILE", envvar="RAGGUARD_EVENTS_FILE",
            help="A JSON-lines event log, as ragguard.monitors.record_events(path) writes it.",
        ),
    ] = Path(EVENTS_FILE),
    json_output: Annotated[
        bool, typer.Option("--json", show_default="off", help="Print the diagnosis as JSON.")
    ] = False,
    grace_s: Annotated[
        float,
        typer.Option(
            "--grace-s", metavar="SECONDS",
            help="Seconds after a loop stall a breaker opening is still blamed on it.",
        ),
    ] = 1.0,
) -> None:
    """Explain recent events: breaker trips, quota refusals, fallbacks, loop stalls, pool trouble.

    Exit status: 0 nothing found, 1 findings, 2 the file cannot be read or a line of it is not a record.
    """
    from .monitors import doctor_main

    argv: list[str] = ["--events", str(events), "--grace-s", repr(grace_s)]
    if json_output:
        argv.append("--json")
    raise typer.Exit(doctor_main(argv))


@app.command()
def version() -> None:
    """Print ragguard's version."""
    from . import __version__

    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
