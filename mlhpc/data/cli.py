"""``mlhpc data``: synthesise, check, convert and prepare a workload's datasets. Each command
parses, calls one library function (`mlhpc.data.embedded`, `check`, `convert`), prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import click

from mlhpc.errors import ConfigError, one_line_errors
from mlhpc.text import echo

FORMAT_HELP = "A table for people, JSON for scripts."
_friendly = one_line_errors()


@click.group("data")
def data_group() -> None:
    """Datasets: synthesise, check, convert, prepare."""


@data_group.command("synth")
@click.argument("workload_name")
@click.option("--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Dataset folder to write (train/ and validation/ inside).")
@click.option("--config", "config_path", type=click.Path(path_type=Path), default=None,
              help="Take the synth section from this config.")
@click.option("--seed", type=int, default=None,
              help="Seed of the synthesis (default: the config's data.synth_seed, 0 without --config).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a synth value, e.g. --set synth.cube_size=32.")
@click.option("--fraction", type=float, default=None, metavar="F",
              help="Write the fraction F (0 < F <= 1) of the synth section's sample counts "
                   "(a reference config's: of the reference data set).")
@click.option("--workers", type=int, default=None, metavar="N",
              help="Synthesis processes per rank (default: the rank's share of its node's CPUs).")
@_friendly
def synth_command(workload_name: str, out_dir: Path, config_path: Path | None, seed: int | None,
                  overrides: tuple[str, ...], fraction: float | None, workers: int | None) -> None:
    """Write WORKLOAD's embedded synthetic dataset in the official on-disk layout. Under srun,
    torchrun or mpiexec the ranks share the work, each writing its own files of one data set."""
    from mlhpc import config as cfg
    from mlhpc.data import synthjob
    from mlhpc.data.synthteam import QuietRankError
    from mlhpc.progress import SynthLines

    tree = cfg.read_yaml(config_path) if config_path else {"train": {"global_batch_size": 1, "max_epochs": 1}}
    tree["workload"] = workload_name
    config = cfg.from_dict(tree, source=str(config_path or "<defaults>"), overrides=overrides)
    # what, how big, where before writing; then progress. The synth section's defaults are a
    # workload's full-size data: said, when no --config gave other sizes.
    note = None if config_path else (f"mlhpc: no --config: {workload_name}'s synth defaults (full-size samples)"
                                     f"{' and the --set values' if overrides else ''}")
    made: list[SynthLines] = []

    def lines(is_main: bool) -> SynthLines:
        made.append(SynthLines(sys.stderr, note=note if is_main else None))
        return made[-1]

    request = synthjob.SynthRequest(seed=config.data.synth_seed if seed is None else seed,
                                    fraction=fraction, workers=workers)
    try:  # atomic: a hidden sibling folder renamed into place, marked complete (mlhpc.data.embedded)
        wrote = synthjob.synth_job(config, out_dir, request, lines)
    except QuietRankError:  # rank 0 says it
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C: one line and 128 + SIGINT, as a run exits
        for each in made:
            each.close()
        echo(f"mlhpc: interrupted (SIGINT): {out_dir} not completed; nothing half-written is in "
             "its place", err=True)
        sys.exit(130)
    finally:
        for each in made:
            each.close()
    if wrote is None:  # another rank said it
        return
    if wrote:
        echo(f"wrote {workload_name} data to {out_dir.resolve()}")
    else:
        echo(f"{out_dir}: already a complete {workload_name} dataset with these settings")


def _with_progress(call: Callable[[Any], Any]) -> Any:
    """``call(progress)`` with the terminal's progress lines (`mlhpc.progress.DataProgress`),
    closed however it ends."""
    from mlhpc.progress import DataProgress

    progress = DataProgress()
    try:
        return call(progress)
    finally:
        progress.close()


@data_group.command("check")
@click.argument("workload_name")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--full", is_flag=True, help="Read every sample and check its values too.")
@click.option("--form", default="auto", show_default=True,
              help="The form of the files (auto: detected from their names).")
@click.option("--workers", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Processes reading files in parallel.")
@click.option("--format", "fmt", default="table", show_default=True, metavar="[table|json]",
              help=FORMAT_HELP + " (A form of the files here, as `mlhpc list` shows them, is read as "
                   "--form.)")
@_friendly
def check_command(workload_name: str, path: Path, full: bool, form: str, workers: int,
                  fmt: str) -> None:
    """Check a dataset folder (its split folders): form, samples, shapes, bytes, bad files.

    \b
    quick (default): the folder is a complete dataset (no unfinished mlhpc
      output), every split holds files of one form; per file, what costs no
      more than its headers and record framing: it opens in its format, sample
      count, stored shape and dtype, record framing and stored checksums of
      the framing (uncompressed TFRecord length CRCs, HDF5 and npy headers
      and the file size each implies, LMDB entry counts); no file listed twice.
    --full: also every sample decoded and its values checked (data CRCs,
      finite values, counts >= 0, valid labels).
    Exit status 2 when a file is bad; each bad file is named.
    """
    from mlhpc.data import check as data_check
    from mlhpc.workload import get

    workload = get(workload_name)
    fmt, form = _output_and_form(fmt, form, workload)
    report = _with_progress(lambda progress: data_check.check(workload, path, full=full, fmt=form,
                                                              workers=workers, on_progress=progress))
    if fmt == "json":
        echo(json.dumps(report.to_dict(), indent=2))
    else:
        echo(f"{path}: {workload_name} data in form {report.format}"
                   f"{' (every sample read)' if full else ''}")
        for name, split in report.splits.items():
            shape = "x".join(str(d) for d in split.sample_shape or ())
            echo(f"  {name}: {split.files} files, {split.samples} samples of {shape} "
                       f"{split.dtype}, {split.bytes / 1e9:.3f} GB, {len(split.bad)} bad")
    bad = [line for split in report.splits.values() for line in split.bad]
    for line in bad:
        echo(f"bad: {line}", err=True)
    if bad:
        echo(f"mlhpc: error: {len(bad)} bad file(s) in {path}", err=True)
        sys.exit(2)


def _output_and_form(fmt: str, form: str, workload: Any) -> tuple[str, str]:
    """``(table | json, form of the files)`` from `data check`'s ``--format`` and ``--form``;
    ``--format FORM`` (its meaning before ``--form``) is still read as the files' form.

    Raises:
        ConfigError: ``--format`` is neither, or ``--form`` is not one of the workload's forms.
    """
    from mlhpc.hints import did_you_mean

    forms = ("auto", *(workload.data_tools.formats if workload.data_tools is not None else ()))
    if fmt not in ("table", "json"):
        if fmt not in forms or form != "auto":
            raise ConfigError(f"--format {fmt!r}: expected table or json"
                              f"{did_you_mean(fmt, ('table', 'json', *forms))}")
        echo(f"mlhpc: --format {fmt} read as --form {fmt} (--format picks table or json)",
                   err=True)
        fmt, form = "table", fmt
    if form not in forms:
        raise ConfigError(f"--form {form!r}: expected one of {', '.join(forms)}"
                          f"{did_you_mean(form, forms)}")
    return fmt, form


@data_group.command("convert")
@click.argument("workload_name")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--to", "to", required=True, help="Form to write (one of the workload's, as `mlhpc list` shows them).")
@click.option("--format", "fmt", default="auto", show_default=True,
              help="The form of SRC (auto: detected from the file names).")
@click.option("--workers", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Processes converting files in parallel.")
@_friendly
def convert_command(workload_name: str, src: Path, dst: Path, to: str, fmt: str,
                    workers: int) -> None:
    """Convert a dataset losslessly to another form (resumable; writes DST/manifest.json)."""
    from mlhpc.data import convert as data_convert
    from mlhpc.workload import get

    workload = get(workload_name)
    result = _with_progress(lambda progress: data_convert.convert(
        workload, src, dst, to, data_convert.ConvertOptions(fmt=fmt, workers=workers, on_progress=progress)))
    echo(_summary("converted", result))


class _PrepareCommand(click.Command):
    """``data prepare``, whose help ends with each registered workload's own options."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from mlhpc.workload import get, names, prepare_options

        rows = []
        for name in names():
            try:
                tools = get(name).data_tools
            except ConfigError:  # a broken entry point: `mlhpc list` says why
                continue
            for option in prepare_options(tools) if tools is not None else []:
                rows.append((f"{name}: {option['name']}",
                             f"{option['description']} (default {option['default']})"))
        with formatter.section("Options of each workload (--option KEY=VALUE)"):
            formatter.write_dl(rows or [("(none)", "no registered workload declares one")])


@data_group.command("prepare", cls=_PrepareCommand)
@click.argument("workload_name")
@click.argument("raw_dir", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--to", "to", default=None,
              help="Form to write (one the workload's data convert writes; default: its first).")
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="One of the workload's own prepare options, listed below (repeatable).")
@click.option("--workers", type=click.IntRange(1, 256), default=1, show_default=True,
              help="Processes preparing files in parallel.")
@_friendly
def prepare_command(workload_name: str, raw_dir: Path, dst: Path, to: str,
                    options: tuple[str, ...], workers: int) -> None:
    """Make raw files into training samples, as the reference's preparation step does."""
    from mlhpc.data import convert as data_convert
    from mlhpc.workload import get

    workload = get(workload_name)
    result = _with_progress(lambda progress: data_convert.prepare(
        workload, raw_dir, dst, to, data_convert.ConvertOptions(workers=workers, on_progress=progress,
                                                                prepare_options=options)))
    echo(_summary("prepared", result))


def _summary(verb: str, result: Any) -> str:
    skipped = f" ({result.skipped_files} already done)" if result.skipped_files else ""
    return (f"{verb} {result.source_files} files{skipped} -> {result.dest} ({result.to}): "
            f"{result.samples} samples, {result.bytes_read / 1e9:.3f} GB read, "
            f"{result.bytes_written / 1e9:.3f} GB written, {result.seconds:.1f} s, "
            f"{result.gb_per_s:.3f} GB/s")
