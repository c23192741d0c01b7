"""The README's statements hold (issue 26, point 3): its first commands are the documented ones,
the `mlhpc report` command it gives works on the published logs shipped in tests/data, the
determinism it claims (same machine, torch build, thread count and seed: bit-identical metrics)
holds on a tiny run, and it links the generated config reference."""

from __future__ import annotations

import re

import pytest
import subprocess
import sys
from pathlib import Path

from test_run_e2e import events, tiny_args, tiny_data  # noqa: F401 (fixture)

BIN = Path(sys.executable).parent


def _blocks(readme: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", readme, flags=re.S)


def test_first_two_commands_are_setup_run_and_tests(repo):
    blocks = _blocks((repo / "README.md").read_text())
    assert blocks[0].strip() == ('python3 -m venv .venv && .venv/bin/pip install torch==2.13.0 && '
                                 '.venv/bin/pip install -e ".[test]" && '
                                 '.venv/bin/mlhpc run configs/cosmoflow-mini.yaml')
    assert blocks[1].strip() == ".venv/bin/python -m pytest"
    assert (repo / "configs" / "cosmoflow-mini.yaml").is_file()


def test_the_report_command_the_readme_gives_works(repo, tmp_path):
    block = next(b for b in _blocks((repo / "README.md").read_text()) if "mlhpc report" in b)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()]
    unpack = next(line for line in lines if "tar -xJf" in line)
    report = next(line for line in lines if line.startswith("mlhpc report published/"))
    archive = unpack.split("tar -xJf ", 1)[1].split()[0]
    assert (repo / archive).is_file(), archive  # the archive the README names is in the repo
    # run as written, from a copy of the repository's relevant path in a scratch folder
    (tmp_path / Path(archive).parent).mkdir(parents=True)
    (tmp_path / archive).symlink_to(repo / archive)
    subprocess.run(["bash", "-c", unpack], cwd=tmp_path, check=True, timeout=120)
    proc = subprocess.run([str(BIN / "mlhpc"), *report.split()[1:]], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cosmoflow" in proc.stdout and "deepcam" in proc.stdout


def test_same_machine_same_seed_gives_bit_identical_metrics(repo, tmp_path, tiny_data):
    series = []
    for name in ("a", "b"):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "mlhpc",
                               *tiny_args(repo, tiny_data, out, "--set", "train.target=0.0",
                                          "--set", "train.max_epochs=2")],
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert proc.returncode == 1, proc.stderr[-2000:]
        series.append([e["value"] for e in events(out / "result_0.txt") if e["key"] == "eval_error"])
    assert len(series[0]) == 2 and series[0] == series[1]  # exact float equality


def test_readme_links_the_config_reference(repo):
    readme = (repo / "README.md").read_text()
    assert "(docs/config-reference.md)" in readme and (repo / "docs" / "config-reference.md").is_file()
    assert "deterministic for a seed" not in readme


# ---- every mlhpc command shown in the README and docs/ still parses -------------------------------

DOCS = ["README.md", *sorted(p.relative_to(Path(__file__).resolve().parents[1]).as_posix()
                             for p in (Path(__file__).resolve().parents[1] / "docs").glob("*.md"))]
_SHELL_OPERATORS = {"&&", "||", "|", ";", ">", "2>&1"}


def shown_commands(text: str) -> list[list[str]]:
    """The arguments after ``mlhpc`` of every command line in the fenced code blocks of ``text``
    (``\\``-continued lines joined, comments and shell variables left out, ``a && mlhpc b``
    and ``torchrun ... mlhpc b`` included; in a synopsis ``[--opt V]`` counts as ``--opt V`` and
    ``a|b`` as ``a``, a placeholder such as ``N`` as ``1``)."""
    import shlex

    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue
            for i, word in enumerate(words):
                if word == "mlhpc" or word.endswith("/mlhpc"):
                    args = []
                    for arg in words[i + 1:]:
                        if arg in _SHELL_OPERATORS or arg.startswith("("):  # "(...)": a note in a diagram
                            break
                        if not arg.startswith("$"):  # a synopsis: [--opt V] parsed as --opt V, a|b as a,
                            arg = arg.strip("[]").split("|")[0]  # a placeholder (N, RUN) as 1
                            args.append("1" if re.fullmatch(r"[A-Z][A-Z_]*", arg) else arg)
                    found.append(args)
    return found


def parse_only(args: list[str]) -> None:
    """Parse ``mlhpc ARGS`` with click down to the last (sub)command, running nothing.

    Raises:
        click.UsageError: an unknown command or option, a bad choice, a missing argument.
    """
    import click

    from mlhpc.cli import main

    command, name, rest, parent = main, "mlhpc", list(args), None
    while True:
        ctx = command.make_context(name, rest, parent=parent)
        if not isinstance(command, click.Group):
            return
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        name, command, rest = command.resolve_command(ctx, rest)
        parent = ctx


def test_every_mlhpc_command_in_the_readme_and_docs_parses(repo):
    import click

    shown, bad = 0, []
    for name in DOCS:
        for args in shown_commands((repo / name).read_text()):
            shown += 1
            try:
                parse_only(args)
            except click.UsageError as exc:
                bad.append(f"{name}: mlhpc {' '.join(args)}: {exc.format_message()}")
    assert not bad, "\n".join(bad)
    assert shown >= 20  # the README and docs do show commands


def test_a_command_that_no_longer_parses_is_caught():
    import click

    with pytest.raises(click.UsageError):
        parse_only(["results", "compare", "only-one"])
    with pytest.raises(click.UsageError):
        parse_only(["stage", "--lits"])
    assert shown_commands("```bash\nmkdir x && .venv/bin/mlhpc run c.yaml --set a=1  # note\n```") == [
        ["run", "c.yaml", "--set", "a=1"]]
