"""OC20 graph records checked and converted to the tensors the model reads.

`validate_record` takes the attribute dict `unpickle.load_record` returns and checks every key a
training record needs (`REQUIRED_KEYS`, reference names as ``AtomsToGraphs.convert`` and
``preprocess_ef.py`` store them; format: `lmdb_io`): shapes, dtypes, finite values, atomic
numbers, flags, edges inside the structure, and the sizes the record declares against stated
bounds (`unpickle.MAX_RECORD_ATOMS` atoms, `unpickle.MAX_EDGES_PER_ATOM` stored edges per
centre, `unpickle.MAX_TENSOR_ELEMENTS` numbers per value, a cell of at least
`MIN_CELL_VOLUME_A3` whose periodic images within the reference's 6 A are bounded by `images`),
so that what ``mlhpc data check`` passes the model can take.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from mlhpc.errors import DataError, Where
from mlhpc.text import clip

from . import images
from .unpickle import (
    MAX_EDGES_PER_ATOM,
    MAX_RECORD_ATOMS,
    MAX_TENSOR_ELEMENTS,
    TENSOR_DTYPES,
    load_record,
)

#: Keys a training record must hold (reference names).
REQUIRED_KEYS = ("pos", "cell", "atomic_numbers", "natoms", "tags", "fixed", "force", "y")
MAX_ATOMIC_NUMBER = 118
#: The smallest cell volume accepted (cubic angstroms): a near-zero cell would multiply the
#: periodic images a radius graph enumerates (OC20's slabs span hundreds of cubic angstroms).
MIN_CELL_VOLUME_A3 = 1.0
#: The radius of the reference's graph (``AtomsToGraphs(radius=6)``, DimeNet++ ``cutoff: 6.0``).
RADIUS_A = 6.0
_INT32_MAX = 2**31 - 1


def _numbers(value: Any, key: str, where: Where | str) -> np.ndarray:
    """A python number or (nested) sequence as a numpy array, after counting its entries
    against `MAX_TENSOR_ELEMENTS` (a pickle may nest one list in itself many times over)."""
    seen, todo = 0, [value]
    while todo:
        item = todo.pop()
        seen += 1
        if seen > MAX_TENSOR_ELEMENTS:
            raise DataError.at(where, f"{key} holds more than {MAX_TENSOR_ELEMENTS} numbers")
        if isinstance(item, (list, tuple)):
            todo.extend(item)
    try:
        return np.asarray(value)
    except (ValueError, TypeError):
        raise DataError.at(where, f"{key} is a ragged or non-numeric sequence") from None


def _array(fields: dict[str, Any], key: str, where: Where | str) -> np.ndarray:
    """``fields[key]`` as a numeric numpy array. Raises DataError (missing, non-numeric, over
    `MAX_TENSOR_ELEMENTS`)."""
    if key not in fields:
        raise DataError.at(where, f"missing {key!r} (a training record holds {', '.join(REQUIRED_KEYS)})")
    value = fields[key]
    count = value.numel() if isinstance(value, torch.Tensor) else value.size if isinstance(value, np.ndarray) else 0
    if count > MAX_TENSOR_ELEMENTS:
        raise DataError.at(where, f"{key} has shape {clip(str(tuple(value.shape)), 80)}, over the bound "
                        f"of {MAX_TENSOR_ELEMENTS} numbers")
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or value.is_complex() \
                or value.dtype not in TENSOR_DTYPES:
            raise DataError.at(where, f"{key} is a {value.layout} {value.dtype} tensor, expected a dense real "
                            "one of float64/32/16, bfloat16, int64/32/16/8, uint8 or bool")
        value = value.detach().cpu()
        value = value.float().numpy() if value.dtype in (torch.bfloat16, torch.float16) else value.numpy()
    elif isinstance(value, (int, float, bool, np.number, np.ndarray, list, tuple)):
        value = _numbers(value, key, where)
    else:
        raise DataError.at(where, f"{key} is a {type(value).__name__}, expected a tensor or number")
    if value.dtype.kind not in "biuf":
        raise DataError.at(where, f"{key} has dtype {value.dtype}, expected a numeric tensor")
    return value


def _shaped(fields: dict[str, Any], key: str, shape: tuple[int, ...], where: Where | str) -> np.ndarray:
    value = _array(fields, key, where)
    if value.shape != shape:
        raise DataError.at(where, f"{key} has shape {clip(str(tuple(value.shape)), 80)}, expected {shape}")
    return value


def _finite(value: np.ndarray, key: str, where: Where | str) -> np.ndarray:
    if value.dtype.kind == "f" and not np.isfinite(value).all():
        raise DataError.at(where, f"{key} holds NaN or infinite values")
    return value


def _integral(value: np.ndarray, key: str, where: Where | str, allowed: tuple[int, int]) -> np.ndarray:
    """``value`` as int64 after checking every entry is a whole number within ``allowed``."""
    if value.dtype.kind == "f" and not (np.isfinite(value).all() and (value == np.round(value)).all()):
        raise DataError.at(where, f"{key} holds non-integer values")
    out = value.astype(np.int64)
    if out.size and (out.min() < allowed[0] or out.max() > allowed[1]):
        bad = out[(out < allowed[0]) | (out > allowed[1])][0]
        raise DataError.at(where, f"{key} holds {int(bad)}, expected {allowed[0]} .. {allowed[1]}")
    return out


def _cell(fields: dict[str, Any], n: int, where: Where | str) -> np.ndarray:
    """float (1, 3, 3): the cell, checked for volume and for the periodic images of a search at
    the reference's radius (`images.check_images`; the distances too where no edges are stored,
    as the model then searches them itself)."""
    cell = _finite(_array(fields, "cell", where), "cell", where)
    if cell.shape not in ((1, 3, 3), (3, 3)):
        raise DataError.at(where, f"cell has shape {clip(str(tuple(cell.shape)), 80)}, expected (1, 3, 3)")
    volume = abs(float(np.linalg.det(cell.reshape(3, 3).astype(np.float64))))
    if not volume >= MIN_CELL_VOLUME_A3:
        raise DataError.at(where, f"cell volume {volume:.3g} A^3, under the {MIN_CELL_VOLUME_A3} A^3 of any "
                        "real structure (a zero or degenerate cell)")
    searched = 0 if "edge_index" in fields else n
    images.check_images(cell.reshape(3, 3), np.ones(3, dtype=bool), searched, RADIUS_A, where)
    return cell.astype(np.float32).reshape(1, 3, 3)


def _atoms(fields: dict[str, Any], where: Where | str) -> dict[str, torch.Tensor]:
    pos = _array(fields, "pos", where)
    if pos.ndim != 2 or pos.shape[1] != 3 or pos.shape[0] < 1 or pos.dtype.kind != "f":
        raise DataError.at(where, f"pos has shape {clip(str(tuple(pos.shape)), 80)} dtype {pos.dtype}, "
                        "expected float (N, 3)")
    n = pos.shape[0]
    if n > MAX_RECORD_ATOMS:
        raise DataError.at(where, f"pos holds {n} atoms, over the bound of {MAX_RECORD_ATOMS}")
    pos = _finite(pos, "pos", where)
    natoms = _array(fields, "natoms", where).reshape(-1)
    if natoms.size != 1 or int(_integral(natoms, "natoms", where, (1, MAX_RECORD_ATOMS))[0]) != n:
        raise DataError.at(where, f"natoms is {natoms[:3].tolist()}, pos holds {n} atoms")
    numbers = _shaped(fields, "atomic_numbers", (n,), where)
    return {
        "atomic_numbers": torch.from_numpy(_integral(numbers, "atomic_numbers", where, (1, MAX_ATOMIC_NUMBER))),
        "pos": torch.from_numpy(pos.astype(np.float32)),
        "cell": torch.from_numpy(_cell(fields, n, where)),
        "natoms": torch.tensor(n, dtype=torch.int64),
        "tags": torch.from_numpy(_integral(_shaped(fields, "tags", (n,), where), "tags", where, (0, _INT32_MAX))),
        "fixed": torch.from_numpy(_integral(_shaped(fields, "fixed", (n,), where), "fixed", where, (0, 1)) == 1),
    }


def _labels(fields: dict[str, Any], n: int, where: Where | str) -> dict[str, torch.Tensor]:
    force = _finite(_shaped(fields, "force", (n, 3), where), "force", where)
    energy = _finite(_array(fields, "y", where), "y", where)
    if energy.size != 1:
        raise DataError.at(where, f"y has shape {clip(str(tuple(energy.shape)), 80)}, expected one energy")
    return {"forces": torch.from_numpy(force.astype(np.float32)),
            "energy": torch.tensor(float(energy.reshape(-1)[0]), dtype=torch.float32)}


def _edges(fields: dict[str, Any], n: int, where: Where | str) -> dict[str, torch.Tensor]:
    has = [k for k in ("edge_index", "cell_offsets") if k in fields]
    if not has:
        return {}
    if len(has) == 1:
        other = "cell_offsets" if has[0] == "edge_index" else "edge_index"
        raise DataError.at(where, f"{has[0]} stored without {other}")
    index = _array(fields, "edge_index", where)
    if index.ndim != 2 or index.shape[0] != 2:
        raise DataError.at(where, f"edge_index has shape {clip(str(tuple(index.shape)), 80)}, expected (2, E)")
    offsets = _shaped(fields, "cell_offsets", (index.shape[1], 3), where)
    index = _integral(index, "edge_index", where, (0, n - 1))
    per_centre = np.bincount(index[1], minlength=n)
    if per_centre.size and per_centre.max() > MAX_EDGES_PER_ATOM:
        centre = int(per_centre.argmax())
        raise DataError.at(where, f"atom {centre} is the centre of {int(per_centre[centre])} stored edges, over "
                        f"the {MAX_EDGES_PER_ATOM} nearest neighbours the preprocessing keeps")
    return {"edge_index": torch.from_numpy(index),
            "cell_offsets": torch.from_numpy(_integral(offsets, "cell_offsets", where, (-_INT32_MAX, _INT32_MAX)))}


def validate_record(fields: dict[str, Any], where: Where | str) -> dict[str, torch.Tensor]:
    """One record's attributes checked and converted to the tensors the model reads.

    Returns (N atoms, E stored edges):
        ``atomic_numbers`` int64 (N,), ``pos`` float32 (N, 3) Angstrom, ``cell`` float32
        (1, 3, 3) Angstrom, ``natoms`` int64 (), ``tags`` int64 (N,), ``fixed`` bool (N,),
        ``forces`` float32 (N, 3) eV/Angstrom, ``energy`` float32 () eV, and when stored
        ``edge_index`` int64 (2, E) (row 0 neighbour, row 1 centre) and ``cell_offsets`` int64
        (E, 3).

    Raises:
        DataError: ``WHERE: ...`` for a missing key of `REQUIRED_KEYS`, a shape other than the
            above (``cell`` (3, 3) is accepted), natoms != N, NaN or inf in pos, cell, force or
            y, an atomic number outside 1..118, negative tags (OC20's are 0, 1, 2; other
            non-negative tags, such as ASE's layer numbers, are kept), fixed outside {0, 1},
            edges pointing outside the structure, or a size over its bound: more than
            `MAX_RECORD_ATOMS` atoms, `MAX_TENSOR_ELEMENTS` numbers in a value or
            `MAX_EDGES_PER_ATOM` stored edges into one centre, a cell under
            `MIN_CELL_VOLUME_A3` or whose periodic images exceed `images.check_images`'s bounds.
    """
    out = _atoms(fields, where)
    n = int(out["natoms"])
    out.update(_labels(fields, n, where))
    out.update(_edges(fields, n, where))
    return out


def _tensor(value: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().to(dtype).contiguous()
    return torch.from_numpy(np.asarray(value)).to(dtype).contiguous()


def convert_checked(fields: dict[str, Any]) -> dict[str, torch.Tensor]:
    """`validate_record`'s tensors (same keys, shapes, dtypes and values) for a record that
    `validate_record` has already passed: the same conversions without the value checks.

    Only for the very attributes, unpickled from the very bytes, that passed:
    `lmdb_io.LmdbFolder` calls it for a record it validated before in this process, from an
    environment that has not been reopened since (a changed file is reopened and its records
    validated again), as DeepCAM's reader checks each sample's values once per process.
    """
    pos = _tensor(fields["pos"], torch.float32)
    energy = float(_tensor(fields["y"], torch.float64).reshape(-1)[0])
    out = {"atomic_numbers": _tensor(fields["atomic_numbers"], torch.int64), "pos": pos,
           "cell": _tensor(fields["cell"], torch.float32).reshape(1, 3, 3),
           "natoms": torch.tensor(pos.shape[0], dtype=torch.int64),
           "tags": _tensor(fields["tags"], torch.int64),
           "fixed": _tensor(fields["fixed"], torch.int64) == 1,
           "forces": _tensor(fields["force"], torch.float32),
           "energy": torch.tensor(energy, dtype=torch.float32)}
    if "edge_index" in fields:
        out["edge_index"] = _tensor(fields["edge_index"], torch.int64)
        out["cell_offsets"] = _tensor(fields["cell_offsets"], torch.int64)
    return out


def decode_record(blob: bytes, where: Where | str) -> dict[str, torch.Tensor]:
    """`load_record` then `validate_record`. Raises DataError naming ``where``."""
    return validate_record(load_record(blob, where), where)
