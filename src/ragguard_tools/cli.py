"""The ``ragguard`` command: ``ragguard demo``, ``bench``, ``doctor``, ``top`` and ``version``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from ragguard._errors import ConfigError
from ragguard._extras import install_hint
from ragguard._validate import for_cli, shown

# The command-line option of each options field a command sets: its errors name what the user typed.
DEMO_FLAGS = {
    "duration_s": "--duration", "concurrency": "--concurrency", "scenario": "--scenario",
    "redis_url": "--redis", "out_dir": "--out", "seed": "--seed", "status_port": "--status-port",
}
BENCH_FLAGS = {
    "steps": "--steps", "steady_s": "--steady", "rounds": "--rounds", "block_ms": "--block-ms",
    "rtt_ms": "--rtt-ms", "out_dir": "--out", "seed": "--seed", "seeds": "--seeds",
    "changes_only": "--changes-only", "contenders": "--contenders",
}


def _refuse(command: str, exc: ConfigError, flags: dict[str, str]) -> NoReturn:
    """Print a bad option's error naming the option as typed; exit 2."""
    typer.secho(f"ragguard {command}: {for_cli(exc, flags)}", fg="red", err=True)
    raise typer.Exit(2) from None


app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    # Typer's Rich help (0.28 and later) prints a type beside every flag ("--quick <bool>", even
    # "--help <bool>"); the plain help prints flags as flags and options with their metavar.
    rich_markup_mode=None,
    # Click's child contexts inherit help_option_names: -h works on every command.
    context_settings={"show_default": True, "help_option_names": ["-h", "--help"]},
    help="ragguard: resilience middleware for RAG pipelines.",
)

EVENTS_FILE = "ragguard-events.jsonl"  # ragguard.monitors.DEFAULT_EVENTS_FILE, without importing it
DEMO_EVENTS_FILE = "ragguard-report/events.jsonl"  # ragguard_tools.doctor.DEMO_EVENTS_FILE, likewise


def quiet_grpc_core() -> None:
    """Keep gRPC's C core to errors (``GRPC_VERBOSITY=ERROR``) unless the user chose a level.

    The core reads the variable once, when ``grpc`` is first imported, so this runs before the
    demo and the bench import it; their backends' child process inherits it. Without it the core
    logs connection teardown at INFO level (``chttp2_transport.cc ... Got goaway``) amid the output.
    """
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


def _version(value: bool) -> None:
    if value:
        from ragguard import __version__

        typer.echo(f"ragguard {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_version, show_default=False,
            help="Print ragguard's version and exit.",
        ),
    ] = False,
) -> None:
    """ragguard: resilience middleware for RAG pipelines."""


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
            help="A ragguard.chaos scenario YAML: the faults and when they strike. Phase times are "
            "shares of each run, stretched over --duration (the file's duration_s is not used). "
            "Start from the built-in one: ragguard demo --print-scenario > my.yaml",
        ),
    ] = None,
    print_scenario: Annotated[
        bool,
        typer.Option(
            "--print-scenario", show_default="off",
            help="Print the built-in scenario YAML to stdout and exit (nothing runs).",
        ),
    ] = False,
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
    status_port: Annotated[
        int | None,
        typer.Option(
            "--status-port", metavar="PORT", show_default="none",
            help="Serve the guarded run's status on 127.0.0.1:PORT/status, for `ragguard top "
            "http://127.0.0.1:PORT/status`, from start-up to exit (before that run: no stages, and a "
            "note saying nothing is guarded yet).",
        ),
    ] = None,
) -> None:
    """Run a real RAG service under chaos twice, unguarded and guarded, and compare them.

    Exit status: 0 done, 2 a bad option or scenario.
    """
    if print_scenario:
        from importlib import resources

        scenario_yaml = resources.files("ragguard.chaos").joinpath("scenarios/default.yaml")
        typer.echo(scenario_yaml.read_text(encoding="utf-8"), nl=False)
        raise typer.Exit(0)
    quiet_grpc_core()
    try:
        from .demo import cli_main
    except ImportError as exc:  # the demo's optional dependencies are missing
        typer.echo(f"the demo needs its extras: {install_hint('demo')}; missing: {exc}", err=True)
        raise typer.Exit(2) from exc
    try:
        code = cli_main(
            duration_s=duration,
            concurrency=concurrency,
            scenario=scenario,
            redis_url=redis,
            quick=quick,
            out_dir=out,
            seed=seed,
            status_port=status_port,
        )
    except ConfigError as exc:
        _refuse("demo", exc, DEMO_FLAGS)
    raise typer.Exit(code)


@app.command(short_help="Stepped load, four contenders: unguarded to ragguard adaptive.")
def bench(
    quick: Annotated[
        bool, typer.Option("--quick", show_default="off", help="A CI run, about a minute: 4 steps, 1 round.")
    ] = False,
    steps: Annotated[
        str | None,
        typer.Option(
            metavar="LIST", show_default="0.4,0.6,0.8,1,1.25,1.5,2,2.5,3; with --quick 0.5,1,1.5,3",
            help="Offered loads as multiples of the dependency's capacity, joined by commas.",
        ),
    ] = None,
    steady: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS", show_default="6, or 1.2 with --quick",
            help="Measured seconds per contender and step.",
        ),
    ] = None,
    rounds: Annotated[
        int | None,
        typer.Option(
            metavar="N", show_default="2, or 1 with --quick", help="Rounds per step (medians are reported)."
        ),
    ] = None,
    block_ms: Annotated[
        float,
        typer.Option(
            metavar="MS", help="Dependency bottleneck per embedding call (capacity ~ 1000/MS calls a second)."
        ),
    ] = 15.0,
    rtt_ms: Annotated[float, typer.Option(metavar="MS", help="Dependency's unloaded latency.")] = 60.0,
    no_halving: Annotated[
        bool,
        typer.Option("--no-halving", show_default="off", help="Skip the capacity changes (halved, back)."),
    ] = False,
    changes_only: Annotated[
        bool,
        typer.Option(
            "--changes-only", show_default="off",
            help="Run only the capacity changes (no steps), once per seed of --seeds.",
        ),
    ] = False,
    seeds: Annotated[
        str | None,
        typer.Option(
            metavar="LIST", show_default="--seed", help="Seeds joined by commas (with --changes-only)."
        ),
    ] = None,
    contenders: Annotated[
        str | None,
        typer.Option(
            metavar="LIST", show_default="all; ragguard-adaptive with --changes-only",
            help="Contenders joined by commas: unguarded, hand-composed, ragguard-static, ragguard-adaptive.",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option(metavar="DIR", help="Folder for bench.json and bench.png.")
    ] = Path("ragguard-bench"),
    seed: Annotated[
        int, typer.Option(metavar="N", help="Seeds the load, the faults and the Guards.")
    ] = 7,
) -> None:
    """Stepped load on the demo's real service: unguarded, hand-composed, ragguard static and adaptive.

    Exit status: 0 done, 2 a bad option.
    """
    quiet_grpc_core()
    try:
        from .bench import cli_main as bench_main
    except ImportError as exc:  # the demo's optional dependencies are missing
        typer.echo(f"the bench needs the demo extras: {install_hint('demo')}; missing: {exc}", err=True)
        raise typer.Exit(2) from exc
    parsed: tuple[float, ...] | None = None
    if steps is not None:
        try:
            parsed = tuple(float(x) for x in steps.split(",") if x.strip())
        except ValueError:
            said = f"ragguard bench: --steps must be numbers joined by commas, got {shown(steps)}"
            typer.secho(said, fg="red", err=True)
            raise typer.Exit(2) from None
    seed_list: tuple[int, ...] | None = None
    if seeds is not None:
        try:
            seed_list = tuple(int(x) for x in seeds.split(",") if x.strip())
        except ValueError:
            said = f"ragguard bench: --seeds must be integers joined by commas, got {shown(seeds)}"
            typer.secho(said, fg="red", err=True)
            raise typer.Exit(2) from None
    refusal = None
    if seed_list is not None and not changes_only:
        refusal = "--seeds needs --changes-only"
    elif changes_only and no_halving:
        refusal = "--changes-only runs the capacity changes: not with --no-halving"
    if refusal is not None:
        typer.secho(f"ragguard bench: {refusal}", fg="red", err=True)
        raise typer.Exit(2)
    names = None if contenders is None else tuple(x.strip() for x in contenders.split(",") if x.strip())
    try:
        code = bench_main(
            quick=quick, steps=parsed, steady_s=steady, rounds=rounds, block_ms=block_ms, rtt_ms=rtt_ms,
            halving=not no_halving, out_dir=out, seed=seed, changes_only=changes_only, seeds=seed_list,
            contenders=names,
        )
    except ConfigError as exc:
        _refuse("bench", exc, BENCH_FLAGS)
    raise typer.Exit(code)


@app.command(short_help="Explain breaker trips, quota refusals, fallbacks, stalls.")
def doctor(
    events: Annotated[
        Path | None,
        typer.Option(
            "--events", "-e", metavar="FILE", envvar="RAGGUARD_EVENTS_FILE",
            show_default=f"{EVENTS_FILE}, else {DEMO_EVENTS_FILE} when only that exists",
            help="A JSON-lines event log, as ragguard.monitors.record_events(path) writes it "
            "(ragguard demo writes one into its --out folder).",
        ),
    ] = None,
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
    """Explain recent events: breaker trips, quota refusals, fallbacks, failovers, loop stalls, pool trouble.

    Exit status: 0 nothing found, 1 findings, 2 the file cannot be read or a line of it is not a record.
    """
    from .doctor import doctor_main

    argv: list[str] = ["--grace-s", repr(grace_s)]
    if events is not None:
        argv += ["--events", str(events)]
    if json_output:
        argv.append("--json")
    raise typer.Exit(doctor_main(argv))


@app.command(short_help="Live view of a running service's status: breakers, limits, tenants.")
def top(
    url: Annotated[
        str,
        typer.Argument(
            metavar="URL", show_default=False,
            help="The service's status endpoint, e.g. http://127.0.0.1:8000/health (a StatusEndpoint, "
            "ragguard_tools.status.serve, or ragguard demo --status-port).",
        ),
    ],
    interval: Annotated[
        float, typer.Option("--interval", "-n", metavar="SECONDS", help="Seconds between two polls.")
    ] = 1.0,
    once: Annotated[
        bool,
        typer.Option(
            "--once", show_default="off",
            help="Poll twice, --interval apart, print one frame (its rates between the two) and exit "
            "(for scripts).",
        ),
    ] = False,
) -> None:
    """Show a running service's breakers (state, time left open), adaptive limits, tenants' slots,
    and fallbacks, sheds and refusals per second, redrawn in place until Ctrl-C (or SIGTERM). In a
    pipe or a log, each frame is printed as plain text as it comes.

    Exit status: 0 done, 1 --once got no status (the reason on stderr), 2 a bad option.
    """
    problem = None
    if not url.startswith(("http://", "https://")):
        problem = f"URL must start with http:// or https://, got {shown(url)}"
    elif not 0.1 <= interval <= 3600:
        problem = f"--interval must be 0.1..3600 seconds, got {interval!r}"
    if problem is not None:
        typer.secho(f"ragguard top: {problem}", fg="red", err=True)
        raise typer.Exit(2)
    from rich.console import Console

    from .top import Top

    raise typer.Exit(Top(url, interval_s=interval).run(Console(), once=once))


@app.command()
def version() -> None:
    """Print ragguard's version."""
    from ragguard import __version__

    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
