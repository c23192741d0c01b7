"""Checks of the AlphaFold 2 residue constants that the OpenFold model and data share."""

from __future__ import annotations

import numpy as np
from mlhpc_workloads.openfold import residue_constants as rc


def test_orders_and_sizes():
    assert "".join(rc.RESTYPES) == "ARNDCQEGHILKMFPSTWYV"
    assert rc.RESTYPE_ORDER_WITH_X["X"] == 20
    assert len(rc.ATOM_TYPES) == 37 and rc.ATOM_TYPES[:5] == ("N", "CA", "C", "CB", "O")
    assert rc.ATOM_TYPES[-1] == "OXT"
    # the heavy-atom count of each residue (TRP 14 is the largest, hence atom14)
    assert rc.STANDARD_ATOM_MASK.sum(axis=1).tolist() == [
        5, 11, 8, 8, 6, 9, 9, 4, 10, 8, 8, 9, 8, 11, 7, 6, 7, 14, 12, 7, 0]
    assert rc.MSA_LETTER_TO_INDEX["-"] == 21 and rc.MSA_LETTER_TO_INDEX["B"] == 3


def test_atom14_atom37_round_trip():
    for i in range(20):
        slots = np.nonzero(rc.RESTYPE_ATOM14_MASK[i])[0]
        atoms37 = rc.RESTYPE_ATOM14_TO_ATOM37[i, slots]
        assert rc.STANDARD_ATOM_MASK[i, atoms37].all()
        assert (rc.RESTYPE_ATOM37_TO_ATOM14[i, atoms37] == slots).all()


def test_default_frames_are_rigid_and_place_chi_atoms():
    frames = rc.RESTYPE_RIGID_GROUP_DEFAULT_FRAME
    for i, r in enumerate(rc.RESTYPES):
        resname = rc.RESTYPE_1TO3[r]
        n_groups = 4 + len(rc.CHI_ANGLES_ATOMS[resname])
        rot = frames[i, :n_groups, :3, :3]
        np.testing.assert_allclose(rot @ rot.transpose(0, 2, 1), np.tile(np.eye(3), (n_groups, 1, 1)),
                                   atol=1e-5)
        np.testing.assert_allclose(np.linalg.det(rot), 1.0, atol=1e-5)
        assert not frames[i, n_groups:].any()
    # chi1 frame origin is the CB position in the backbone frame
    ser = rc.RESTYPE_ORDER["S"]
    cb = rc.RIGID_GROUP_ATOM_POSITIONS["SER"]["CB"][1]
    np.testing.assert_allclose(frames[ser, 4, :3, 3], cb, atol=1e-6)


def test_swaps_and_chi_tables():
    asp = rc.RESTYPE_ORDER["D"]
    od1 = rc.ATOM14_NAMES["ASP"].index("OD1")
    od2 = rc.ATOM14_NAMES["ASP"].index("OD2")
    assert rc.RESTYPE_ATOM14_SWAP_INDEX[asp, od1] == od2
    assert rc.RESTYPE_ATOM14_IS_AMBIGUOUS.sum() == 12
    assert rc.CHI_ANGLES_MASK.sum(axis=1).tolist()[:5] == [0, 4, 2, 2, 1]
    assert rc.CHI_PI_PERIODIC.sum() == 4
    assert rc.sequence_to_aatype("AXRZ").tolist() == [0, 20, 1, 20]
