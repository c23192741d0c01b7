"""The workload contract is the only door, read from the source with `ast` and `tokenize`:

- nothing under mlhpc/ reflects on a workload's objects (no ``getattr``, ``hasattr`` or
  ``inspect``): every hook it calls is declared in `mlhpc.workload` (`WorkloadDataset`,
  `DataTools`, `Workload`), and the hooks it calls on datasets and data tools are those;
- no bundled workload's name, folder, data format or model setting appears in the harness's
  code or help texts (docstrings aside; `NAMED` lists each place that quotes a rule).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from mlhpc.workload import DataTools, Workload, WorkloadDataset, get

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mlhpc"
BUNDLED = ("cosmoflow", "deepcam", "oc20", "openfold")


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# ---- no reflection on a workload's objects --------------------------------------------------------

#: Every ``getattr`` / ``hasattr`` under mlhpc/ (``path::call``), each on an object of the
#: harness's own or of a library, never a workload's, with the reason it is there.
REFLECTION: dict[str, str] = {
    "mlhpc/validate/operators.py::getattr(func, '__name__', '')": "a torch function seen by a "
        "TorchFunctionMode (a method descriptor may have no name): torch's, not a workload's",
    "mlhpc/errors.py::getattr(exc, 'exit_status', 2)": "an exception of any kind reaching the "
        "CLI: the library's own carry an exit status",
    "mlhpc/config/yamlfile.py::getattr(exc, 'problem', None)": "a PyYAML error's optional problem text",
    "mlhpc/config/__init__.py::getattr(exc, 'problem_mark', None)": "a PyYAML error's optional position",
    "mlhpc/config/__init__.py::getattr(exc, 'problem', None)": "a PyYAML error's optional problem text",
    "mlhpc/config/reference.py::getattr(origin, '__name__', str(origin))": "a typing origin's "
        "name, for the config reference's type column",
    "mlhpc/config/reference.py::getattr(m, name)": "pydantic's field metadata (bounds), read "
        "for the config reference's allowed-values column",
    "mlhpc/config/reference.py::getattr(m, name, None)": "pydantic's field metadata (bounds), "
        "read for the config reference's allowed-values column",
    "mlhpc/log/mlperf_adapter.py::getattr(_module(module), attribute)": "the adapter checks "
        "that mlperf_logging still has the internals it uses",
    "mlhpc/log/mlperf_adapter.py::hasattr(checker, m)": "the adapter checks mlperf_logging's "
        "checker methods",
    "mlhpc/log/mlperf_adapter.py::hasattr(checker, a)": "the adapter checks mlperf_logging's "
        "checker attributes",
    "mlhpc/report/__init__.py::getattr(options, name)": "the report's own options dataclass, "
        "field by field",
    "mlhpc/store/queries.py::getattr(filters, name)": "the store's own filters dataclass, field "
        "by field",
    "mlhpc/store/engine.py::getattr(exc, 'orig', exc)": "SQLAlchemy's wrapped driver error",
    "mlhpc/store/engine.py::getattr(engine, 'mlhpc_read_only', False)": "a flag the store sets on "
        "its own SQLAlchemy engine when it opens a store read-only",
    "mlhpc/report/figures.py::getattr(record, name)": "the report's own records (ReportedRun and its facts, "
        "FolderResult, ValidFlops, RcpVerdict), a figure's field by its name",
    "mlhpc/data/checksums.py::hasattr(_buffers, 'pair')": "a thread-local copy buffer made on first "
        "use in each thread",
    "mlhpc/log/writer.py::getattr(self._mllogger, kind)": "mlperf_logging's logger: start, end or "
        "event by name",
    "mlhpc/run/profile.py::getattr(e, device_attr, 0)": "torch.profiler's event, whose device time "
        "field is named differently across torch versions",
}


def _reflection(source: str, rel: str) -> list[str]:
    """``path::call`` of every getattr/hasattr call and ``path::import inspect`` of every import
    of the standard library's inspect in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "vars"):
            found.append(f"{rel}::{ast.unparse(node)}")
        elif isinstance(node, ast.Import) and any(a.name == "inspect" for a in node.names):
            found.append(f"{rel}::import inspect")
        elif isinstance(node, ast.ImportFrom) and node.module == "inspect":
            found.append(f"{rel}::from inspect import")
    return found


def test_the_harness_reflects_on_no_workload_object():
    """No ``getattr``, ``hasattr``, ``vars`` or ``inspect`` under mlhpc/ but those `REFLECTION`
    lists (each on the harness's own objects or a library's), and each of those still there."""
    found = [key for path in _sources() for key in _reflection(path.read_text(), _rel(path))]
    adapter = "mlhpc/log/mlperf_adapter.py::import inspect"  # mlperf_logging's signatures
    unlisted = [key for key in found if key not in REFLECTION and key != adapter]
    assert not unlisted, f"reflection not in REFLECTION (declare the hook instead): {unlisted}"
    assert not sorted(set(REFLECTION) - set(found)), "REFLECTION lists calls no longer there"
    inspecting = [key for key in found if "inspect" in key]
    assert inspecting == [adapter], inspecting


def test_the_reflection_scan_sees_a_planted_probe():
    planted = ("import inspect\n"
               "def f(dataset, synthesize):\n"
               "    hook = getattr(dataset, 'collate_fn', None)\n"
               "    takes = 'progress' in inspect.signature(synthesize).parameters\n"
               "    return hasattr(dataset, 'locate')\n")
    assert _reflection(planted, "x.py") == [
        "x.py::import inspect", "x.py::getattr(dataset, 'collate_fn', None)",
        "x.py::hasattr(dataset, 'locate')"]


#: Names the harness gives a workload's datasets and data tools, and the class that declares
#: what may be called on them.
RECEIVERS = {r"(^|_)ds$|dataset$": WorkloadDataset, r"(^|\.)(data_)?tools$": DataTools}


def _calls_on(receiver: str) -> set[tuple[str, str]]:
    """``(path, attribute)`` for every ``X.attribute`` under mlhpc/ whose receiver ``X`` (its
    last name) matches ``receiver``."""
    found = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and re.search(receiver, ast.unparse(node.value)):
                found.add((_rel(path), node.attr))
    return found


@pytest.mark.parametrize("receiver", sorted(RECEIVERS))
def test_the_harness_calls_only_declared_hooks(receiver):
    """Every attribute the harness reads of a workload's dataset or data tools is declared by
    `WorkloadDataset` or `DataTools` (the class ``mlhpc.workload`` gives them)."""
    declared = RECEIVERS[receiver]
    undeclared = sorted((p, a) for p, a in _calls_on(receiver) if not hasattr(declared, a))
    assert not undeclared, f"not declared by {declared.__name__}: {undeclared}"
    assert _calls_on(receiver), "the scan found no call at all: its pattern is stale"


def test_every_bundled_workload_declares_through_the_contract():
    for name in BUNDLED:
        workload = get(name)
        assert isinstance(workload, Workload) and isinstance(workload.data_tools, DataTools)
        settings = workload.model_settings(workload.model_config())
        assert settings and all(isinstance(k, str) for k in settings), name


# ---- no workload's name, folder, format or model setting in the harness ----------------------------

#: Bundled workloads' names and folders, their data formats' names, modules and suffixes (a
#: substring match, so ``x.npy``, ``stats.h5``, ``h5py`` and ``read_lmdb`` count).
NAMES = ("cosmoflow", "deepcam", "oc20", "opencatalyst", "openfold", "mlhpc_workloads",
         "tfrecord", "hdf5", "h5py", ".h5", "npy", "lmdb")

#: The places under mlhpc/ that name one, each quoting a rule: ``(path, name) -> reason``.
NAMED: dict[tuple[str, str], str] = {
    **{("mlhpc/rules.py", name): "the rules' table per ruleset quotes each round's benchmarks "
       "(runs per benchmark; OpenFold's epoch_num counts samples)"
       for name in ("cosmoflow", "deepcam", "oc20", "openfold")},
}


def model_settings() -> tuple[str, ...]:
    """The names of every bundled workload's model settings and prepare options that are
    compound names (``input_size``, ``channels_last``): a one-word setting (``loss``,
    ``dropout``) is a word of the field, not a workload's own name."""
    found: set[str] = set()
    for name in BUNDLED:
        workload = get(name)
        found |= set(workload.model_config.model_fields)
        if workload.data_tools is not None:
            found |= set(workload.data_tools.prepare_options.model_fields)
    return tuple(sorted(name for name in found if "_" in name.strip("_")))


def _docstrings(tree: ast.Module) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    nodes = [node.body[0].value for node in ast.walk(tree)
             if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
             and node.body and isinstance(node.body[0], ast.Expr)
             and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)]
    return [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in nodes]


def named(source: str, settings: tuple[str, ...] = ()) -> list[tuple[int, str, str]]:
    """``(line, name, token)`` for every name of `NAMES` (substring) or of ``settings`` (whole
    word) in ``source``'s identifiers, strings (help texts included) and comments; docstrings
    left out."""
    spans = _docstrings(ast.parse(source))
    words = re.compile(r"\b(" + "|".join(map(re.escape, settings)) + r")\b") if settings else None
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT) or \
                any(start <= tok.start and tok.end <= end for start, end in spans):
            continue
        text = tok.string.lower()
        found += [(tok.start[0], name, tok.string) for name in NAMES if name in text]
        found += [(tok.start[0], word, tok.string) for word in (words.findall(tok.string) if words else [])]
    return found


def test_the_harness_names_no_workload_folder_format_or_model_setting():
    """Outside docstrings, no code or help text under mlhpc/ names a bundled workload, its
    folder, a data format or a model setting of a bundled workload; `NAMED` alone excepted."""
    settings = model_settings()
    found = [f"{_rel(p)}:{line}: {name} in {token!r}" for p in _sources()
             for line, name, token in named(p.read_text(), settings) if (_rel(p), name) not in NAMED]
    assert not found, "\n".join(found)
    used = {(_rel(p), name) for p in _sources() for _, name, _ in named(p.read_text(), settings)}
    assert not sorted(set(NAMED) - used), "NAMED lists places that no longer name it"


@pytest.mark.parametrize("snippet, name", [
    ("click.option('--to', help='npy or hdf5')\n", "npy"),
    ("x = Field(1, description='as cosmoflow does')\n", "cosmoflow"),
    ("keys = ('input_size', 'in_channels')\n", "input_size"),
    ("flag = config.model.channels_last\n", "channels_last"),
    ("src = root / 'mlhpc_workloads' / name\n", "mlhpc_workloads"),
])
def test_the_name_scan_sees_a_planted_name(snippet, name):
    assert name in {n for _, n, _ in named(snippet, ("input_size", "channels_last"))}, snippet


def test_the_name_scan_leaves_docstrings():
    assert named('"""Reads CosmoFlow HDF5, model.input_size."""\n', ("input_size",)) == []


# ---- the house: few top-level modules, small files and functions -----------------------------------

MAX_TOP_LEVEL = 15


def test_mlhpc_has_at_most_15_top_level_modules():
    """The top of mlhpc/ holds the commands' faces and the shared foundations; a run's insides
    live in mlhpc/run/, a config's in mlhpc/config/."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top
    assert (PACKAGE / "run" / "__init__.py").is_file() and (PACKAGE / "config" / "__init__.py").is_file()


def _limits(path: Path) -> list[str]:
    """What in ``path`` is over the limits: the file over 500 lines, a function over 60 lines or
    with more than 6 parameters (a click command, one parameter per option, aside)."""
    from test_architecture import MAX_FILE_LINES, _oversized

    found = [f"{_rel(path)}: {len(path.read_text().splitlines())} lines"
             for _ in [0] if len(path.read_text().splitlines()) > MAX_FILE_LINES]
    return found + [f"{key}: {what}" for key, what in _oversized(path)]


#: What in workloads/ is still over the limits: a debt, each entry to be paid by splitting the
#: file or the function; nothing in mlhpc/ is (tests/test_architecture.py's ALLOWED gives each
#: function's reason).
WORKLOAD_DEBT: set[str] = set()  # all paid


@pytest.mark.parametrize("folder", ["mlhpc", "workloads"])
def test_no_file_function_or_parameter_list_over_the_limits(folder):
    """In mlhpc/ and workloads/: files of at most 500 lines, functions of at most 60 lines and
    6 parameters (click commands aside); mlhpc/ without exception, workloads/ but its listed
    debt, every entry of which is still over."""
    over = [line for path in sorted((ROOT / folder).rglob("*.py")) for line in _limits(path)]
    keys = {line.split(": ")[0] for line in over}
    assert not [line for line in over if line.split(": ")[0] not in WORKLOAD_DEBT], "\n".join(over)
    if folder == "workloads":
        assert keys == WORKLOAD_DEBT, f"paid, take it off WORKLOAD_DEBT: {sorted(WORKLOAD_DEBT - keys)}"


def test_three_jobs_are_three_names():
    """One class is called Job (the run's); the store's rendered campaign job and the Slurm
    script's settings are named for what they are."""
    jobs = [f"{_rel(p)}:{n.lineno}" for p in _sources() for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.ClassDef) and n.name == "Job"]
    assert [j.split(":")[0] for j in jobs] == ["mlhpc/run/job.py"], jobs
