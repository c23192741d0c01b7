"""OpenFold's readers against data made by an attacker or a careless user (issue 43, classes 2
and 3), through `mlhpc data check openfold` and `mlhpc run`: every case is one line naming the
file, exit status 2, and nothing of the user's touched.

- Links out of the data tree: a linked mmCIF file, alignment folder, ``a3m/`` sub-folder, a3m
  file or ``.hhr`` file is refused by the run and by the check alike (one code path).
- Names read from data are names: an ``.hhr`` template name with ``/``, ``..``, an absolute
  path or a NUL is refused, and no file outside the data is opened.
- Sizes from data: a ``.cif.gz`` that inflates past the cap (or to NUL bytes) is stopped while
  inflating, with small memory; an a3m of 200,000 rows is streamed and read only up to the rows
  the features use; a validation chain longer than ``model.val_max_sequence_length`` is refused
  before training.
"""

from __future__ import annotations

import os
import struct
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from mlhpc_workloads.openfold import a3m, data, mmcif
from mlhpc_workloads.openfold.a3m import format_a3m
from mlhpc_workloads.openfold.features import FeatureSizes
from mlhpc_workloads.openfold.synth_cif import format_mmcif
from test_openfold_cli import MINI, TINY_RUN

from mlhpc.cli import main
from mlhpc.errors import DataError

REPO = Path(__file__).resolve().parents[1]
LETTERS = list("ACDEFGHIKLMNPQRSTVWY")


def _chain(split: Path, pdb_id: str, length: int, rng: np.random.Generator) -> str:
    """One chain ``<pdb_id>_A`` of ``length`` residues: its mmCIF file and a two-row a3m."""
    sequence = "".join(rng.choice(LETTERS, length))
    (split / "mmcif_files").mkdir(parents=True, exist_ok=True)
    (split / "mmcif_files" / f"{pdb_id}.cif").write_text(
        format_mmcif(pdb_id, sequence, rng.normal(size=(length, 5, 3)) * 3))
    folder = split / "alignments" / f"{pdb_id}_A"
    folder.mkdir(parents=True)
    (folder / "uniref90_hits.a3m").write_text(format_a3m(["query", "hit"], [sequence, sequence[::-1]]))
    return sequence


@pytest.fixture
def tiny(tmp_path) -> Path:
    """Two training chains and one validation chain of 12 residues, written by hand."""
    rng = np.random.default_rng(0)
    root = tmp_path / "data"
    for pdb_id in ("aa01", "aa02"):
        _chain(root / "train", pdb_id, 12, rng)
    _chain(root / "validation", "vv01", 12, rng)
    return root


def _moved_out(path: Path, outside: Path) -> Path:
    """``path`` moved to ``outside`` and replaced by a link to it; returns the moved copy."""
    outside.parent.mkdir(parents=True, exist_ok=True)
    path.rename(outside)
    path.symlink_to(outside, target_is_directory=outside.is_dir())
    return outside


def _state(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def _check(root: Path, *flags: str):
    return CliRunner().invoke(main, ["data", "check", "openfold", str(root), *flags])


def _refused_once(out, named: str, says: str) -> None:
    """Exit 2, no traceback, and exactly one line of stderr naming ``named`` with ``says``."""
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output, out.output
    lines = [line for line in out.stderr.splitlines() if named in line]
    assert len(lines) == 1 and says in lines[0], out.stderr


def _run(root: Path, tmp_path: Path, *sets: str):
    return CliRunner().invoke(main, ["run", str(MINI), *TINY_RUN, "--set", f"data.path={root}",
                                     "--set", "data.synthesize_if_missing=false",
                                     "--set", "data.staging.enabled=false",
                                     "--set", f"output.dir={tmp_path / 'out'}", *sets])


def _run_refused(out, named: str, says: str) -> None:
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0] and says in lines[0], out.stderr


# ------------------------------------------------------------------ links out of the data tree

LINKED = {
    "mmCIF file": lambda root, out: root / "train" / "mmcif_files" / "aa01.cif",
    "alignment folder": lambda root, out: root / "train" / "alignments" / "aa01_A",
    "a3m alignment": lambda root, out: root / "train" / "alignments" / "aa01_A" / "uniref90_hits.a3m",
    "alignments/ folder": lambda root, out: root / "validation" / "alignments",
}


@pytest.mark.parametrize("what", list(LINKED))
def test_data_check_refuses_every_link_out_of_the_tree(tiny, tmp_path, what):
    victim = LINKED[what](tiny, tmp_path)
    outside = _moved_out(victim, tmp_path / "elsewhere" / victim.name)
    before = _state(outside) if outside.is_dir() else outside.read_bytes()
    out = _check(tiny, "--full")
    _refused_once(out, str(victim), "symbolic link")
    assert (_state(outside) if outside.is_dir() else outside.read_bytes()) == before


def test_a_linked_a3m_sub_folder_and_hhr_file_are_refused(tiny, tmp_path):
    """OpenProteinSet's a3m/ and hhr/ sub-folders: a link out of the tree in either is refused."""
    chain = tiny / "train" / "alignments" / "aa02_A"
    (chain / "a3m").mkdir()
    (chain / "uniref90_hits.a3m").rename(chain / "a3m" / "uniref90_hits.a3m")
    _moved_out(chain / "a3m", tmp_path / "elsewhere" / "a3m")
    _refused_once(_check(tiny), str(chain / "a3m"), "symbolic link out of the data tree")
    (chain / "a3m").unlink()
    (tmp_path / "elsewhere" / "a3m").rename(chain / "a3m")
    (tmp_path / "hits.hhr").write_text("No 1\n>aa01_A\n")
    (chain / "pdb70_hits.hhr").symlink_to(tmp_path / "hits.hhr")
    _refused_once(_check(tiny, "--full"), str(chain / "pdb70_hits.hhr"), "symbolic link")


def test_run_refuses_a_linked_mmcif_before_training(tiny, tmp_path):
    """The issue's case: the check refused a linked mmCIF file and the run parsed it."""
    victim = tiny / "train" / "mmcif_files" / "aa02.cif"
    outside = _moved_out(victim, tmp_path / "pdb" / "aa02.cif")
    before = outside.read_bytes()
    _run_refused(_run(tiny, tmp_path), str(victim), "symbolic link out of the data tree")
    assert outside.read_bytes() == before and not (tmp_path / "out" / "result_0.txt").exists()


# ------------------------------------------------------------------ names read from data

HHR_HIT = """No 1
>{name} a hit
Probab=99.00  E-value=1e-20  Score=100.00  Aligned_cols=4  Identities=30%

Q query_A           1 {q}   4 (12)
T {name}            1 {q}   4 (12)
"""


@pytest.mark.parametrize("name", ["../../../secret_A", "/etc/passwd_A", "aa02/../../x_A",
                                  "aa02_A\x00", "..", "aa02.cif_A"])
def test_an_hhr_template_name_is_a_name_never_a_path(tiny, tmp_path, name):
    (tmp_path / "secret.cif").write_text("data_secret\n")
    chain = tiny / "train" / "alignments" / "aa01_A"
    hhr = chain / "pdb70_hits.hhr"
    hhr.write_text(HHR_HIT.format(name=name, q="ACDE"))
    out = _check(tiny, "--full")
    _refused_once(out, str(hhr), "hit 1: template name")
    assert "names read from data are never paths" in out.stderr


def test_run_refuses_an_hhr_name_that_climbs_out(tiny, tmp_path):
    hhr = tiny / "train" / "alignments" / "aa01_A" / "pdb70_hits.hhr"
    hhr.write_text(HHR_HIT.format(name="../../../../../etc/x_A", q="ACDE"))
    _run_refused(_run(tiny, tmp_path), str(hhr), "hit 1: template name")


def test_a_good_template_name_still_reads_its_structure(tiny):
    """The check on names keeps real ones: pdb70's ``1abc_A`` form reads the split's mmCIF."""
    entries = data.list_chains(tiny / "train")
    chain_dir = entries[0].a3m_files[0].parent
    sequence = mmcif.read_chain(entries[0].mmcif, "A").sequence
    (chain_dir / "pdb70_hits.hhr").write_text(HHR_HIT.format(name="aa02_A", q=sequence[:4]))
    assert len(data.read_raw(entries[0], max_templates=1).templates) == 1


# ------------------------------------------------------------------ sizes from data


def _gzip_of(path: Path, byte: bytes, inflated_bytes: int) -> Path:
    """A one-member GZIP file of ``inflated_bytes`` (a multiple of 1 MiB) copies of one ``byte``:
    one MiB deflated once after a full flush (no reference back past it), that segment
    repeated, a final empty block and the true CRC-32 and size (RFC 1951, 1952)."""
    block = byte * (1 << 20)
    head = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = head.compress(block) + head.flush(zlib.Z_FULL_FLUSH)
    raw = zlib.compressobj(9, zlib.DEFLATED, -15)
    segment = raw.compress(block) + raw.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(inflated_bytes >> 20):
        crc = zlib.crc32(block, crc)
    final = zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)
    path.write_bytes(first + segment * ((inflated_bytes >> 20) - 1) + final
                     + struct.pack("<II", crc, inflated_bytes & 0xFFFFFFFF))
    return path


def test_the_bombs_are_what_they_say():
    """The helper's file inflates (gzip's own reader) to exactly what it claims."""
    import gzip
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        made = _gzip_of(Path(folder) / "x.gz", b"a", 4 << 20)
        assert gzip.decompress(made.read_bytes()) == b"a" * (4 << 20)


@pytest.fixture(scope="module")
def space_bomb(tmp_path_factory) -> Path:
    """400 MiB of spaces in a file of about 400 kB: over the 384 MiB an mmCIF may inflate to."""
    return _gzip_of(tmp_path_factory.mktemp("bomb") / "spaces.cif.gz", b" ", 400 << 20)


def test_a_cif_gz_is_stopped_while_inflating_with_small_memory(space_bomb, tmp_path):
    assert space_bomb.stat().st_size < 1 << 20 and mmcif.MMCIF_BYTES < 400 << 20
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match="inflates to more than") as caught:
            mmcif.read_block(space_bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(caught.value).startswith(str(space_bomb)) and "\n" not in str(caught.value)
    assert peak < 8 << 20, peak  # pieces of 1 MiB, never the inflated whole


def test_data_check_and_run_refuse_gzip_bombs(tiny, tmp_path, space_bomb):
    """The issue's 512 MiB of zeros (a NUL byte: not text, stopped at the first piece) and a
    bomb of spaces past the cap, as a training mmCIF file."""
    victim = tiny / "train" / "mmcif_files" / "aa01.cif"
    victim.unlink()
    bomb = victim.with_suffix(".cif.gz")
    bomb.write_bytes(space_bomb.read_bytes())
    _refused_once(_check(tiny), str(bomb), "inflates to more than")
    zeros = _gzip_of(bomb, b"\0", 512 << 20)
    assert zeros.stat().st_size < 1 << 20
    _refused_once(_check(tiny), str(zeros), "NUL byte")
    _run_refused(_run(tiny, tmp_path), str(zeros), "NUL byte")


def test_truncated_and_foreign_gzip_are_one_line(tiny):
    victim = tiny / "validation" / "mmcif_files" / "vv01.cif"
    packed = zlib.compressobj(6, zlib.DEFLATED, 31)
    whole = packed.compress(victim.read_bytes()) + packed.flush()
    victim.unlink()
    gz = victim.with_suffix(".cif.gz")
    gz.write_bytes(whole[:-12])
    _refused_once(_check(tiny), str(gz), "ends inside its GZIP stream")
    gz.write_bytes(b"not gzip at all")
    _refused_once(_check(tiny), str(gz), "not readable GZIP data")


def _deep_a3m(path: Path, query: str, rows: int, tail: str) -> None:
    """``rows`` distinct aligned rows after the query (``>h<6 digits>`` and random letters,
    made as one numpy array), then ``tail`` (a last record)."""
    letters = np.frombuffer("".join(LETTERS).encode(), dtype=np.uint8)
    body = np.empty((rows, 9 + len(query) + 1), dtype=np.uint8)
    body[:, 0:2] = np.frombuffer(b">h", dtype=np.uint8)
    digits = np.arange(rows)[:, None] // 10 ** np.arange(5, -1, -1) % 10
    body[:, 2:8] = ord("0") + digits
    body[:, 8] = body[:, -1] = ord("\n")
    body[:, 9:-1] = letters[np.random.default_rng(1).integers(0, 20, size=(rows, len(query)))]
    path.write_bytes(f">query\n{query}\n".encode() + body.tobytes() + tail.encode())


def test_a_deep_a3m_is_streamed_and_read_only_to_the_rows_used(tiny):
    """200,000 rows: reading stops at the rows the features use (the reference's sizes give
    2 x (124 + 1024)); a bad record past them is never read, and the memory stays small."""
    entry = data.list_chains(tiny / "train")[0]
    query = mmcif.read_chain(entry.mmcif, "A").sequence
    _deep_a3m(entry.a3m_files[0], query, 200_000, ">bad\nAC1DE\n")
    assert entry.a3m_files[0].stat().st_size > 4 << 20
    sizes = FeatureSizes(256, 124, 1024, 4)
    tracemalloc.start()
    try:
        raw = data.read_raw(entry, 0, sizes.msa_rows_read)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert raw.msa.shape == (sizes.msa_rows_read, len(query)) == (2296, 12)
    assert peak < 16 << 20, peak
    out = _check(tiny, "--full")
    assert out.exit_code == 0, out.output  # the bad last record lies past the rows read
    assert entry.a3m_files[0].read_bytes().endswith(b">bad\nAC1DE\n")


def test_an_endless_a3m_line_and_a_foreign_query_are_one_line(tiny):
    entry = data.list_chains(tiny / "train")[1]
    second = entry.a3m_files[0].parent / "mgnify_hits.a3m"
    second.write_text(">other\nACDEFGHIKLMN\n")
    _refused_once(_check(tiny, "--full"), str(second), "its query differs")
    second.write_text(">q\n" + "A" * (a3m.A3M_RECORD_BYTES + 10))
    _refused_once(_check(tiny, "--full"), str(second), "an a3m row may hold")


def test_a_long_validation_chain_is_refused_before_training(tiny, tmp_path):
    """An 800-residue validation chain, evaluated uncropped, would need a tensor of gigabytes:
    the run and the check refuse it in one line naming the file and its length."""
    _chain(tiny / "validation", "vv02", 800, np.random.default_rng(2))
    victim = tiny / "validation" / "mmcif_files" / "vv02.cif"
    _refused_once(_check(tiny), str(victim), "validation chain A has 800 residues")
    out = _run(tiny, tmp_path)
    _run_refused(out, str(victim), "over model.val_max_sequence_length 700")
    assert not (tmp_path / "out" / "result_0.txt").exists()  # before the log, nothing timed
    raised = data.OpenFoldDataset(tiny / "validation", FeatureSizes(None, 4, 4, 0, 800), train=False)
    assert len(raised) == 2  # the bound is the config's: raised, the chain is kept


# ------------------------------------------------------------------ benchmarks' writes


def test_side_by_side_json_replaces_a_planted_link_never_writes_through_it(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import side_by_side

    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file\n")
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    (out / "report.json").symlink_to(victim)
    monkeypatch.setattr(side_by_side, "run", lambda args, report, emit: emit("# measured"))
    assert side_by_side.main(["cosmoflow", "--json", str(out / "report.json")]) == 0
    assert victim.read_text() == "the user's file\n"
    written = out / "report.json"
    assert not written.is_symlink() and '"measured"' in written.read_text()
    assert os.stat(written).st_nlink == 1


@pytest.mark.parametrize("number", ["1" + "0" * 30, "0", "99999999999"])
def test_an_hhr_residue_number_out_of_range_is_one_line(tiny, number):
    """A residue number is range-checked where it is parsed (10^30 overflowed int64 before)."""
    chain = tiny / "train" / "alignments" / "aa01_A"
    hhr = chain / "pdb70_hits.hhr"
    hhr.write_text(HHR_HIT.format(name="aa02_A", q="ACDE").replace("T aa02_A            1 ",
                                                                    f"T aa02_A            {number} "))
    _refused_once(_check(tiny, "--full"), str(hhr), f"residue number '{number[:20]}' is not within")


@pytest.mark.parametrize("content", ["empty", "list", "tensor", "model_int", "empty_dict"])
def test_a_starting_checkpoint_that_is_not_a_state_dict_is_one_line(tmp_path, content):
    """model.init_checkpoint: an empty file, or one that holds something other than names to
    tensors, is one ConfigError line naming the file (exit 2 through the CLI), never a traceback."""
    import torch

    from mlhpc import config as mlhpc_config
    from mlhpc.errors import ConfigError
    from mlhpc_workloads.openfold.training import build_model

    path = tmp_path / "init.pt"
    if content == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"list": [1, 2], "tensor": torch.zeros(3), "model_int": {"model": 5},
                    "empty_dict": {}}[content], path)
    config = mlhpc_config.load(REPO / "configs" / "openfold-mini.yaml",
                               (f"model.init_checkpoint={path}", "model.init_checkpoint_sha256=null"))
    with pytest.raises(ConfigError, match=r"init.pt: model.init_checkpoint cannot be loaded"):
        build_model(config.model)
