"""The features of one protein chain as the model reads them, following AlphaFold 2's input
pipeline (Jumper et al. 2021, supplement 1.2.5-1.2.7 and Algorithms 1-3; the reference's
``data_transforms``), in numpy with an explicit random generator:

1. crop (training): a contiguous window of at most ``crop_size`` residues, its start uniform;
2. MSA sampling: the query stays first, the other rows are shuffled; the first
   ``max_msa_clusters`` rows become the cluster centres, the next ``max_extra_msa`` the extra MSA;
3. masked MSA (BERT): each centre position is chosen with probability 0.15 and replaced by a
   token drawn as 10 % a uniform amino acid, 10 % from the MSA profile, 10 % unchanged and 70 %
   the mask token (22); ``true_msa`` keeps the original, ``bert_mask`` marks the chosen positions;
4. clustering: every non-centre row (before the extra MSA is cut to size) joins the centre it
   agrees with at most positions (gaps and masked tokens do not count); the cluster profile and
   mean deletion count average over the centre and its members;
5. ``msa_feat`` (49 channels): centre one-hot (23), has-deletion, deletion value
   ``2/pi * arctan(d/3)``, cluster profile (23), cluster deletion mean ``2/pi * arctan(m/3)``;
   ``target_feat`` (22): a zero between-segment flag and the residue one-hot over 21 types;
6. the centres and the extra rows are zero-padded to ``max_msa_clusters`` and
   ``max_extra_msa`` rows (masks 0), as AlphaFold's fixed-size padding, so that a chain with a
   shallow alignment still gives the model every input (an empty extra MSA would not do).

Shapes below: N residues (after the crop), S centres, E extra rows, T templates; the batch
dimension is added by the collate function (`mlhpc_workloads.openfold.data.collate`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .residue_constants import MSA_MASK_INDEX

MSA_CLASSES = 23  # 20 amino acids, X, gap, mask
REPLACE_FRACTION = 0.15
UNIFORM_PROB, PROFILE_PROB, SAME_PROB = 0.1, 0.1, 0.1


#: The longest validation chain evaluated whole, residues: the reference's validation set, the
#: CAMEO targets of 2021-09-17 .. 2021-12-11, holds chains of at most 700 residues
#: (closed_openfold.yaml and the reference's logs: ``val_max_sequence_length``).
VAL_MAX_SEQUENCE_LENGTH = 700


@dataclass(frozen=True)
class FeatureSizes:
    """The sizes the pipeline cuts to (the reference's ``crop_size``, ``max_msa_clusters``,
    ``max_extra_msa``, ``max_templates``); ``crop_size`` None keeps the whole chain (evaluation),
    of at most ``val_max_sequence_length`` residues (None: any length)."""

    crop_size: int | None
    max_msa_clusters: int
    max_extra_msa: int
    max_templates: int
    val_max_sequence_length: int | None = None

    @property
    def msa_rows_read(self) -> int:
        """The aligned rows read per chain (query first, in file order): the rows the features
        place (``max_msa_clusters`` centres and ``max_extra_msa`` extra rows) and as many
        again, among which the centres and extra rows are drawn and over which the clusters
        average (step 4 clusters every row read that is not a centre). Rows past it, an
        alignment's lowest-ranked hits (HHblits and jackhmmer list hits best first), are not
        read, as AlphaFold's own search keeps only its best hits (``uniref_max_hits`` 10,000,
        ``mgnify_max_hits`` 501 in ``alphafold/data/pipeline.py``)."""
        return 2 * (self.max_msa_clusters + self.max_extra_msa)


@dataclass(frozen=True)
class RawChain:
    """What the parsers give for one chain (N residues, S0 aligned rows, query first).

    aatype ``[N]`` int64; residue_index ``[N]`` int64; all_atom_positions ``[N, 37, 3]`` float32
    Angstrom; all_atom_mask ``[N, 37]`` float32; msa ``[S0, N]`` int64 (0..21); deletion_matrix
    ``[S0, N]`` int32; resolution_A float; templates: per template the `templates.hit_features`
    arrays over the N residues (none when no ``.hhr`` was read).
    """

    aatype: np.ndarray
    residue_index: np.ndarray
    all_atom_positions: np.ndarray
    all_atom_mask: np.ndarray
    msa: np.ndarray
    deletion_matrix: np.ndarray
    resolution_A: float
    templates: tuple[dict[str, np.ndarray], ...] = ()


#: One-hot rows of the 21 tokens whose agreement counts in the clustering (gap and mask: zero).
_SCORED = np.eye(MSA_CLASSES, 21, dtype=np.float32)


def _one_hot(values: np.ndarray, classes: int) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[values]


def crop(chain: RawChain, crop_size: int | None, rng: np.random.Generator) -> RawChain:
    """A contiguous window of ``crop_size`` residues, start uniform (the whole chain when it is
    no longer, or when ``crop_size`` is None)."""
    n = len(chain.aatype)
    if crop_size is None or n <= crop_size:
        return chain
    start = int(rng.integers(0, n - crop_size + 1))
    window = slice(start, start + crop_size)
    templates = tuple({k: v[window] for k, v in t.items()} for t in chain.templates)
    return RawChain(chain.aatype[window], chain.residue_index[window],
                    chain.all_atom_positions[window], chain.all_atom_mask[window],
                    chain.msa[:, window], chain.deletion_matrix[:, window], chain.resolution_A,
                    templates)


def msa_profile(msa: np.ndarray) -> np.ndarray:
    """``[N, 22]`` float32: each token's frequency in each column of ``msa`` ``[S, N]`` (0..21),
    counted (`np.bincount`) rather than averaged over a one-hot ``[S, N, 22]``: the same float32
    values (a count, exact, over S), without the one-hot's S x N x 22 floats."""
    s, n = msa.shape
    counts = np.bincount((np.arange(n) * 22 + msa).ravel(), minlength=n * 22)
    return counts.reshape(n, 22).astype(np.float32) / np.float32(s)


def masked_msa(msa: np.ndarray, profile: np.ndarray, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
    """BERT-style corruption of the centres (step 3): ``(masked msa [S, N] int64,
    bert_mask [S, N] float32)``. ``profile`` ``[N, 22]`` is the MSA's frequency of each token."""
    uniform = np.concatenate([np.full(20, 0.05, dtype=np.float32), np.zeros(2, np.float32)])
    probs = (UNIFORM_PROB * uniform + PROFILE_PROB * profile[None]
             + SAME_PROB * _one_hot(msa, 22))
    mask_prob = 1.0 - UNIFORM_PROB - PROFILE_PROB - SAME_PROB
    probs = np.concatenate([probs, np.full(probs.shape[:-1] + (1,), mask_prob, np.float32)], -1)
    cumulative = np.cumsum(probs, axis=-1)
    draw = rng.random(msa.shape + (1,), dtype=np.float32) * cumulative[..., -1:]
    replacement = np.minimum((draw > cumulative).sum(-1), MSA_MASK_INDEX)
    chosen = rng.random(msa.shape) < REPLACE_FRACTION
    return np.where(chosen, replacement, msa).astype(np.int64), chosen.astype(np.float32)


def cluster_profiles(centres: np.ndarray, centre_del: np.ndarray, rest: np.ndarray,
                     rest_del: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step 4: ``(cluster_profile [S, N, 23], cluster_deletion_mean [S, N])`` of the centres
    ``[S, N]`` and the other rows ``[R, N]`` (each joining the centre it agrees with most).

    The agreement is one matrix product of one-hot rows (gap and mask columns left out: their
    agreement does not count) and the sums are counts (`np.bincount`): every partial sum is a
    whole number, held exactly in float32 below 2**24, so the result is bit for bit that of
    AlphaFold's ``nearest_neighbor_clusters`` and ``summarize_clusters`` (one-hot einsum,
    scatter-add; tests/test_openfold_pipeline_exact.py), whatever the order of summation."""
    s, n = centres.shape
    agreement = (_SCORED[rest].reshape(len(rest), n * 21) @ _SCORED[centres].reshape(s, n * 21).T)
    assignment = agreement.argmax(axis=1) if len(rest) else np.zeros(0, dtype=np.int64)
    members = np.bincount(assignment, minlength=s).astype(np.float32)
    counts = (1e-6 + 1.0 + np.zeros(centres.shape, dtype=np.float32)) + members[:, None]
    cell = assignment[:, None] * n + np.arange(n)  # [R, N] index of (centre, column)
    profile_sum = _one_hot(centres, MSA_CLASSES) + np.bincount(
        (cell * MSA_CLASSES + rest).ravel(), minlength=s * n * MSA_CLASSES
    ).reshape(s, n, MSA_CLASSES).astype(np.float32)
    deletion_sum = centre_del.astype(np.float32) + np.bincount(
        cell.ravel(), weights=rest_del.ravel(), minlength=s * n).reshape(s, n).astype(np.float32)
    return profile_sum / counts[..., None], deletion_sum / counts


def _deletion_value(deletions: np.ndarray) -> np.ndarray:
    return (np.arctan(deletions.astype(np.float32) / 3.0) * (2.0 / np.pi)).astype(np.float32)


def msa_features(chain: RawChain, sizes: FeatureSizes, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Steps 2-5 on a (cropped) chain: ``msa_feat [S, N, 49]``, ``msa_mask [S, N]``,
    ``true_msa [S, N]`` int64, ``bert_mask [S, N]``, ``extra_msa [E, N]`` int64,
    ``extra_has_deletion``, ``extra_deletion_value``, ``extra_msa_mask`` ``[E, N]``."""
    rows = np.concatenate([[0], 1 + rng.permutation(len(chain.msa) - 1)])
    centre_rows, rest_rows = rows[:sizes.max_msa_clusters], rows[sizes.max_msa_clusters:]
    msa, deletions = chain.msa, chain.deletion_matrix
    profile = msa_profile(msa)
    masked, bert_mask = masked_msa(msa[centre_rows], profile, rng)
    cluster_profile, deletion_mean = cluster_profiles(masked, deletions[centre_rows],
                                                      msa[rest_rows], deletions[rest_rows])
    centre_del = deletions[centre_rows]
    msa_feat = np.concatenate([
        _one_hot(masked, MSA_CLASSES), np.clip(centre_del, 0, 1)[..., None].astype(np.float32),
        _deletion_value(centre_del)[..., None], cluster_profile,
        _deletion_value(deletion_mean)[..., None]], axis=-1)
    extra = rest_rows[:sizes.max_extra_msa]
    centres = {"msa_feat": msa_feat.astype(np.float32),
               "msa_mask": np.ones(masked.shape, dtype=np.float32),
               "true_msa": msa[centre_rows].astype(np.int64), "bert_mask": bert_mask}
    extras = {"extra_msa": msa[extra].astype(np.int64),
              "extra_has_deletion": np.clip(deletions[extra], 0, 1).astype(np.float32),
              "extra_deletion_value": _deletion_value(deletions[extra]),
              "extra_msa_mask": np.ones((len(extra), msa.shape[1]), dtype=np.float32)}
    return {**_pad_rows(centres, sizes.max_msa_clusters), **_pad_rows(extras, sizes.max_extra_msa)}


def _pad_rows(arrays: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
    """Each array zero-padded along its first (row) axis to ``rows`` (masks 0 there), as
    AlphaFold's ``make_fixed_size`` pads the MSA and the extra MSA."""
    return {k: np.pad(v, [(0, rows - len(v))] + [(0, 0)] * (v.ndim - 1)) for k, v in arrays.items()}


def template_features(chain: RawChain, sizes: FeatureSizes) -> dict[str, np.ndarray]:
    """``max_templates`` template slots: the chain's templates first (``template_mask`` 1),
    then empty slots (mask 0, gap type 21 and no atoms)."""
    t, n = sizes.max_templates, len(chain.aatype)
    out = {"template_aatype": np.full((t, n), 21, dtype=np.int64),
           "template_all_atom_positions": np.zeros((t, n, 37, 3), dtype=np.float32),
           "template_all_atom_mask": np.zeros((t, n, 37), dtype=np.float32),
           "template_mask": np.zeros((t,), dtype=np.float32),
           "template_pseudo_beta": np.zeros((t, n, 3), dtype=np.float32),
           "template_pseudo_beta_mask": np.zeros((t, n), dtype=np.float32)}
    for slot, template in enumerate(chain.templates[:t]):
        for key, value in template.items():
            out[key][slot] = value
        out["template_mask"][slot] = 1.0
    return out


def chain_features(chain: RawChain, sizes: FeatureSizes, rng: np.random.Generator
                   ) -> dict[str, np.ndarray]:
    """Every input and target of one chain (the batch interface without its batch axis).

    Returns:
        numpy arrays: ``aatype [N]`` int64, ``residue_index [N]`` int64, ``seq_mask [N]``,
        ``target_feat [N, 22]``, the `msa_features`, the `template_features`,
        ``all_atom_positions [N, 37, 3]`` Angstrom, ``all_atom_mask [N, 37]``,
        ``resolution []`` Angstrom; float32 unless said.
    """
    chain = crop(chain, sizes.crop_size, rng)
    n = len(chain.aatype)
    target_feat = np.concatenate([np.zeros((n, 1), np.float32), _one_hot(chain.aatype, 21)], -1)
    features = {"aatype": chain.aatype.astype(np.int64),
                "residue_index": chain.residue_index.astype(np.int64),
                "seq_mask": np.ones(n, dtype=np.float32), "target_feat": target_feat,
                "all_atom_positions": chain.all_atom_positions.astype(np.float32),
                "all_atom_mask": chain.all_atom_mask.astype(np.float32),
                "resolution": np.asarray(chain.resolution_A, dtype=np.float32)}
    features.update(msa_features(chain, sizes, rng))
    features.update(template_features(chain, sizes))
    return features
