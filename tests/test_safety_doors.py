"""One way in and one way out, proved from the source with `ast`: code in mlhpc/, workloads/ and
benchmarks/ opens, reads, writes and deletes files, prints, draws text and shows URLs only
through the doors

- the one reader (`mlhpc.data.inputs`), the one atomic writer and temporary name
  (`mlhpc.data.files`), the one remover (`mlhpc.data.claims`: deletes only what a claim record
  says mlhpc made),
- the terminal, rich, plot and URL sinks (`mlhpc.text`),

or through a call listed in `ALLOWED` with its reason (as the function-size limits in
tests/test_architecture.py are). A new call that goes around a door fails here, naming it; an
allowance no longer needed fails too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("mlhpc", "workloads", "benchmarks")
#: The doors themselves.
DOORS = {"mlhpc/text.py", "mlhpc/data/files.py", "mlhpc/data/inputs.py", "mlhpc/data/claims.py",
         "mlhpc/data/statefiles.py", "mlhpc/data/checksums.py", "mlhpc/data/locks.py", "mlhpc/data/trees.py"}

#: ``called name -> what it does around a door``. A call ``a.b.f(...)`` is matched by ``f`` and
#: by its dotted text (``os.open``, ``click.echo``).
FORBIDDEN = {
    # files in
    "open": "opens a file (use mlhpc.data.inputs.read_input / open_input, or files.atomic_output)",
    "io.open": "opens a file (use mlhpc.data.inputs or mlhpc.data.files)",
    "os.open": "opens a file (use mlhpc.data.inputs or mlhpc.data.files)",
    "read_text": "reads a whole file (use mlhpc.data.inputs.read_text_input)",
    "read_bytes": "reads a whole file (use mlhpc.data.inputs.read_input)",
    # files out
    "write_text": "writes in place, through any link (use mlhpc.data.files.write_text_atomic)",
    "write_bytes": "writes in place, through any link (use mlhpc.data.files.atomic_output)",
    "torch.save": "writes in place (use mlhpc.data.files.atomic_output)",
    "np.save": "writes in place (use mlhpc.data.files.atomic_output)",
    "numpy.save": "writes in place (use mlhpc.data.files.atomic_output)",
    "savefig": "writes in place (save to the path mlhpc.data.files.atomic_output gives)",
    "shutil.copyfile": "copies through links (use mlhpc.data.files)",
    "shutil.copy": "copies through links (use mlhpc.data.files)",
    "shutil.copy2": "copies through links (use mlhpc.data.files)",
    "shutil.copytree": "copies through links (use mlhpc.data.files)",
    "shutil.move": "moves through links (use mlhpc.data.files)",
    "os.replace": "renames outside the one writer (use mlhpc.data.files.atomic_output)",
    "os.rename": "renames outside the one writer (use mlhpc.data.files.atomic_output)",
    "os.link": "links outside the one writer (use mlhpc.data.files.atomic_output(exclusive=True))",
    "lmdb.open": "opens an LMDB environment (read-only, or through atomic_output's path)",
    # files removed
    "rmtree": "deletes a tree (use mlhpc.data.claims.remove_claimed: only what a claim lists)",
    "shutil.rmtree": "deletes a tree (use mlhpc.data.claims.remove_claimed: only what a claim lists)",
    "os.remove": "deletes a file (use mlhpc.data.claims)",
    "os.unlink": "deletes a file (use mlhpc.data.claims)",
    "unlink": "deletes a file (use mlhpc.data.claims)",
    "os.rmdir": "deletes a folder (use mlhpc.data.claims)",
    "rmdir": "deletes a folder (use mlhpc.data.claims)",
    "os.removedirs": "deletes folders (use mlhpc.data.claims)",
    # text out
    "print": "prints around the terminal sanitiser (use mlhpc.text.echo)",
    "click.echo": "prints around the terminal sanitiser (use mlhpc.text.echo)",
    "click.secho": "prints around the terminal sanitiser (use mlhpc.text.echo)",
    "sys.stdout.write": "prints around the terminal sanitiser (use mlhpc.text.echo)",
    "sys.stderr.write": "prints around the terminal sanitiser (use mlhpc.text.echo)",
    "Console": "a rich console that reads markup (use mlhpc.text.console)",
    "Text": "a rich text around the sanitiser (use mlhpc.text.cell / styled)",
    "escape": "rich markup escaping (use mlhpc.text.console, which reads no markup)",
    # URLs
    "render_as_string": "shows a URL around the one URL display (use mlhpc.text.show_url)",
}
#: Forbidden only as a bare name: ``console().print`` is the door's own, ``reader.open(path, info)``
#: a format's.
NAME_ONLY = {"open", "print", "Console", "Text", "escape"}
#: ``h5py.File(path, MODE)`` with one of these modes writes (the default mode reads).
H5_WRITE_MODES = {"w", "w-", "x", "a", "r+"}

#: ``(path, call) -> reason``: the calls that may go around a door, and why.
ALLOWED: dict[tuple[str, str], str] = {
    ("mlhpc/run/checkpoint.py", "os.open"): "claims resumed_N.json with O_CREAT|O_EXCL: a planted link "
        "fails with EEXIST, never followed",
    ("mlhpc/config/__init__.py", "os.open"): "the config reader opens O_NONBLOCK and refuses FIFOs, devices "
        "and files over MAX_CONFIG_BYTES with its own config-key messages, the reader's rules",
    ("mlhpc/data/convert.py", "shutil.copyfile"): "copies a source file already walked by walk_files "
        "(no link out of its tree) into the temporary path atomic_output yields",
    ("mlhpc/data/embedded.py", "os.open"): "opens the dataset's parent folder read-only to flock it; "
        "no file is read or written through it",
    ("mlhpc/data/embedded.py", "os.rename"): "moves the hidden folder mlhpc synthesised into "
        "place, within its parent (rename never follows a link)",
    ("mlhpc/data/stage/copy.py", "open"): "staging reads a source file after walk_files refused links "
        "out of the source tree, and checks its identity against the plan",
    ("mlhpc/data/stage/copy.py", "os.open"): "staging writes under part_path (the one temporary name) "
        "relative to a folder descriptor opened O_NOFOLLOW, created O_EXCL|O_NOFOLLOW",
    ("mlhpc/data/stage/copy.py", "os.replace"): "staging renames its part_path file into place "
        "relative to the same O_NOFOLLOW folder descriptor",
    ("mlhpc/run/result.py", "rmdir"): "the writability probe removes the folders it made itself, "
        "only when empty (rmdir cannot remove anything else)",
    ("mlhpc/data/stage/copy.py", "os.unlink"): "removes its own temporary file (part_path: this host "
        "and process in the name) relative to an O_NOFOLLOW folder descriptor",
    ("mlhpc/run/checkpoint.py", "unlink"): "undoes the O_EXCL claim file (resumed_N.json) this attempt "
        "made moments before, when the attempt fails before run_start",
    ("mlhpc/run/outcome.py", "unlink"): "the run's own log: an empty one it claimed O_EXCL and never "
        "wrote, or the old name once a hard link set the bytes aside under failed/",
    ("mlhpc/run/env.py", "read_text"): "/proc/cpuinfo, a kernel file, read for the environment record",
    ("mlhpc/log/writer.py", "os.open"): "claims result_N.txt with O_CREAT|O_EXCL|O_NOFOLLOW; the log grows "
        "line by line as the run goes (a rename at the end would hide a crashed run's log)",
    ("mlhpc/run/outcome.py", "os.link"): "sets a failed log aside with a hard link that never replaces "
        "a file (exclusive), then removes the original name",
    ("mlhpc/run/result.py", "os.open"): "the writability probe: created O_CREAT|O_EXCL, written, removed",
    ("mlhpc/power/sampler.py", "os.open"): "the power log grows while the run goes: created "
        "O_EXCL|O_NOFOLLOW under part_path (the one temporary name), published by _publish",
    ("mlhpc/power/sampler.py", "os.link"): "publishes the power log with a hard link, which never "
        "replaces an existing file",
    ("mlhpc/power/sampler.py", "os.rename"): "publishes the power log where hard links are not "
        "supported, after checking that no file has the final name",
    ("mlhpc/power/sources.py", "read_text"): "sysfs powercap files (energy_uj, name, "
        "max_energy_range_uj): kernel files of a few bytes",
    ("mlhpc/report/package_check.py", "shutil.copytree"): "copies the package mlhpc just wrote (write_under, "
        "no link followed) into a fresh private temporary folder for package_checker",
    ("mlhpc/log/mlperf_adapter.py", "read_text"): "mlperf_logging's own rule files, read from its installed "
        "package",
    ("mlhpc/slurm.py", "read_text"): "mlhpc's own sbatch template, read from its installed package "
        "(importlib.resources)",
    ("mlhpc/store/engine.py", "read_text"): "/proc/mounts, a kernel file, for the network file "
        "system warning",
    ("workloads/cosmoflow/convert.py", "open"): "copy_range reads a source the format's reader "
        "opened and checked, into the temporary path atomic_output gave its caller",
    ("workloads/cosmoflow/formats.py", "open"): "memory-maps a data file found by walking the split "
        "folder (walk_files: no link out of it); its size is checked against the counts first",
    ("workloads/cosmoflow/tfrecord_io.py", "open"): "reads two magic bytes of a data file found by "
        "walking the split folder (walk_files)",
    ("workloads/opencatalyst/lmdb_io.py", "lmdb.open"): "opens an OC20 LMDB read-only, lock-free, "
        "without readahead, after the file's kind and size were checked",
    ("workloads/opencatalyst/lmdb_io.py", "os.replace"): "the LMDB writer makes its file under "
        "part_path (the one temporary name) and renames it into place",
}


def _call_names(node: ast.Call) -> set[str]:
    func = node.func
    if isinstance(func, ast.Name):
        return {func.id}
    if isinstance(func, ast.Attribute):
        return {func.attr, ast.unparse(func)}
    return set()


def _mode(node: ast.Call) -> str | None:
    """The mode a call names (second positional or ``mode=``), when it is a literal."""
    arg = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


#: Calls that may write the temporary path the one writer yields (``with atomic_output(final) as
#: tmp: h5py.File(tmp, "w")``): the writer made it new, never through a link, and renames it.
WRITES_TO_TMP = {"open", "h5py.File(write)", "torch.save", "np.save", "numpy.save", "savefig",
                 "write_text", "write_bytes", "lmdb.open", "Path.open"}


def _yielded_paths(tree: ast.AST) -> set[str]:
    """Names bound by ``with atomic_output(...) as NAME`` anywhere in ``tree``."""
    return {item.optional_vars.id for node in ast.walk(tree) if isinstance(node, (ast.With, ast.AsyncWith))
            for item in node.items
            if isinstance(item.context_expr, ast.Call) and _call_names(item.context_expr) & {"atomic_output"}
            and isinstance(item.optional_vars, ast.Name)}


def _targets(node: ast.Call) -> set[str]:
    """The names a call may write to: its positional arguments, or the object of a method call."""
    names = {arg.id for arg in node.args if isinstance(arg, ast.Name)}
    if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
        names.add(node.func.value.id)
    return names


def violations(source: str) -> list[tuple[str, int]]:
    """``(call, line)`` for each call in ``source`` that goes around a door."""
    found = []
    tree = ast.parse(source)
    yielded = _yielded_paths(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "markup" and \
                isinstance(node.value, ast.Constant) and node.value.value is True:
            found.append(("markup=True", node.value.lineno))
        if not isinstance(node, ast.Call):
            continue
        names = _call_names(node)
        hit = sorted(n for n in names if n in FORBIDDEN and (n not in NAME_ONLY or isinstance(node.func, ast.Name)))
        if "open" in names and isinstance(node.func, ast.Attribute) and ast.unparse(node.func) not in FORBIDDEN \
                and (not node.args or isinstance(node.args[0], ast.Constant)):
            hit.append("Path.open")  # path.open() / path.open("w"), not a format reader's open(path, info)
        if names & {"h5py.File", "File"} and ast.unparse(node.func).endswith("h5py.File") \
                and _mode(node) in H5_WRITE_MODES:
            hit.append("h5py.File(write)")
        if hit and all(h in WRITES_TO_TMP for h in hit) and _targets(node) & yielded:
            continue
        found += [(max(hit, key=len), node.lineno)] if hit else []
    return sorted(found, key=lambda item: item[1])


def _sources() -> list[Path]:
    return [p for base in SCANNED for p in sorted((ROOT / base).rglob("*.py"))]


def _found() -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel in DOORS:
            continue
        for call, line in violations(path.read_text()):
            out.setdefault((rel, call), []).append(line)
    return out


def test_no_code_goes_around_a_door():
    bad = [f"{rel}:{lines[0]}: {call} ({FORBIDDEN.get(call, 'writes or reads around a door')})"
           for (rel, call), lines in sorted(_found().items()) if (rel, call) not in ALLOWED]
    assert not bad, "calls around the doors, not in ALLOWED (with a reason):\n" + "\n".join(bad)


def test_every_allowance_is_still_needed_and_has_a_reason():
    stale = sorted(set(ALLOWED) - set(_found()))
    assert not stale, f"ALLOWED lists calls that are gone: {stale}"
    assert all(len(reason) > 20 for reason in ALLOWED.values())


def test_the_scan_sees_each_kind_of_way_around():
    planted = (
        "import click, h5py, os, torch\nfrom rich.console import Console\nfrom rich.text import Text\n"
        "open('x', 'w')\nos.open('x', os.O_RDONLY)\nPath('x').write_text('y')\nPath('x').read_bytes()\n"
        "p.open('w')\nh5py.File(dest, 'w')\nh5py.File(dest, 'r')\ntorch.save(state, path)\n"
        "print('x')\nclick.echo(value)\nConsole().print(value)\nText(value)\n"
        "c.print(value, markup=True)\nurl.render_as_string(hide_password=True)\n"
        "fig.savefig(path)\nos.replace(a, b)\nreader.open(path, info)\n"
        "with atomic_output(final) as tmp, h5py.File(tmp, 'w') as f:\n    torch.save(x, tmp)\n"
        "with atomic_output(final) as tmp:\n    h5py.File(other, 'w')\n")
    calls = [call for call, _ in violations(planted)]
    assert calls == ["open", "os.open", "write_text", "read_bytes", "Path.open", "h5py.File(write)",
                     "torch.save", "print", "click.echo", "Console", "Text", "markup=True",
                     "render_as_string", "savefig", "os.replace", "h5py.File(write)"], calls


@pytest.mark.parametrize("module", ["mlhpc/cli.py", "mlhpc/store/cli.py", "mlhpc/report/cli.py",
                                    "mlhpc/progress.py", "mlhpc/errors.py"])
def test_the_command_line_prints_through_the_text_door(module):
    """The modules that print import the terminal door (and nothing else prints: above)."""
    assert re.search(r"from mlhpc\.text import|mlhpc\.text", (ROOT / module).read_text()), module


def test_every_figure_is_drawn_without_mathtext():
    """A module that draws with matplotlib makes its figures inside `mlhpc.text.plot_text`."""
    for path in _sources():
        text = path.read_text()
        if re.search(r"^\s*import matplotlib|^\s*from matplotlib", text, re.MULTILINE):
            assert "plot_text()" in text, f"{path.relative_to(ROOT)} draws without mlhpc.text.plot_text"


def test_a_side_record_is_an_object_or_nothing(tmp_path):
    """`read_json_object` (the one reader's JSON side records: resume claims, a run's side files)
    gives the object, and ``{}`` for what is missing, not JSON, not an object, or a link out of
    its folder, never raising."""
    import os

    from mlhpc.data.inputs import read_json_object

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "ok.json").write_text('{"resumed_by": "result_1.txt"}')
    (folder / "list.json").write_text("[1, 2]")
    (folder / "bad.json").write_text("{not json")
    (tmp_path / "outside.json").write_text('{"secret": 1}')
    os.symlink(tmp_path / "outside.json", folder / "link.json")
    assert read_json_object(folder / "ok.json", "resume claim") == {"resumed_by": "result_1.txt"}
    for name in ("list.json", "bad.json", "link.json", "missing.json"):
        assert read_json_object(folder / name) == {}, name
