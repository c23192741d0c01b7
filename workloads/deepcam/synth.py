"""Embedded DeepCAM-like data: climate fields with tropical cyclones and atmospheric rivers.

`synthesize` writes the official layout (see `workloads.deepcam.data`): ``train/`` and
``validation/`` with one ``data-YYYY-MM-DD-HH-1.h5`` per 3-hourly snapshot, and ``stats.h5``.

Each sample is built in three steps, all on an equirectangular global grid (row 0 northmost):

1. Background: the 16 CAM5 variables of the reference dataset (`data.CHANNELS`) as zonally
   symmetric climatologies (moist warm tropics, trade easterlies and mid-latitude westerlies,
   subtropical highs and subpolar lows, a tropopause at ~200 hPa) plus smooth random weather
   (Gaussian-filtered white noise, wrapping in longitude). Geopotential heights follow the
   hypsometric equation from the temperatures, Z1000 from sea-level pressure, PS from PSL and a
   random orography.
2. Events placed at random: tropical cyclones as warm-core vortices (Gaussian sea-level pressure
   deficit, a Lamb-Oseen-like tangential wind turning cyclonically for the hemisphere, a moist core,
   heavy rain, a warm anomaly aloft), and atmospheric rivers as long narrow filaments from the
   subtropics polewards and eastwards carrying extra water vapour and a low-level jet along them.
3. Labels from a detector applied to the finished fields, in the spirit of TECA (Prabhat et al.
   2012/2015) as used for the DeepCAM labels (Kurth et al. 2018):
   - tropical cyclone: a local sea-level pressure minimum deeper than ``tc_psl_drop_pa`` below
     the zonal median, with cyclonic mean 850 hPa vorticity, a warm core at 500 hPa and
     near-surface winds of at least tropical-storm strength, below 45 degrees of latitude; its
     mask is the region connected to the centre where the water-vapour (TMQ) anomaly exceeds
     ``tc_tmq_anomaly_kg_per_m2`` (a flood fill, bounded to 2.5 storm radii);
   - atmospheric river: connected regions where the integrated vapour transport, approximated as
     IVT = TMQ * |V850| (kg m^-1 s^-1), exceeds its zonal median by ``ar_ivt_anomaly_kg_per_m_s``,
     at least ``ar_min_length_km`` long with length/width >= 2 (Guan & Waliser 2015 geometry)
     and centred poleward of 15 degrees, leaving out the 2.5 storm radii around a detected
     cyclone (its own moist, windy surroundings).
   Cyclone pixels are class 1, river pixels class 2, the rest 0.

Every sample draws from its own generator seeded by ``(seed, split, index)``: the data are
deterministic for a seed and a re-run writes only the files that are missing, each atomically
(temporary file + rename), and the bytes do not depend on how many ranks or processes wrote
them. ``stats.h5`` is written last, from every training file's per-channel figures.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import h5py
import numpy as np
from pydantic import Field
from scipy import ndimage

from mlhpc.workload import NO_PROGRESS, SynthProgress
from mlhpc.config import Section
from mlhpc.data.files import atomic_output
from mlhpc.data.pool import map_in_order
from mlhpc.errors import DataError
from .data import CHANNELS, DATA_KEY, LABEL_KEY, STATS_FILE, TRAIN_DIR, VALIDATION_DIR

KM_PER_DEG = 111.195  # great-circle km per degree on a 6371 km sphere
G_M_PER_S2 = 9.81
R_DRY_J_PER_KG_K = 287.0

_SPLITS = {TRAIN_DIR: 0, VALIDATION_DIR: 1}
_FIRST_YEAR = {TRAIN_DIR: 2100, VALIDATION_DIR: 2200}


class SynthConfig(Section):
    """The ``synth`` section of a DeepCAM config: what `synthesize` writes. Every field has a
    default; the grid default is the reference's 768 x 1152 (0.25 degree CAM5)."""

    height: int = Field(768, ge=16, description=(
        "grid rows (latitudes); the reference's 0.25 degree CAM5 grid has 768"))
    width: int = Field(1152, ge=16, description="grid columns (longitudes); the reference has 1152")
    train_samples: int = Field(256, ge=1, description="samples written to train/")
    validation_samples: int = Field(64, ge=1, description="samples written to validation/")
    cyclones_per_sample: float = Field(1.0, ge=0.0, description=(
        "mean tropical cyclones per sample (Poisson)"))
    rivers_per_sample: float = Field(1.0, ge=0.0, description=(
        "mean atmospheric rivers per sample (Poisson)"))
    tc_radius_km: float = Field(300.0, gt=0.0, description=(
        "e-folding radius of a cyclone's pressure deficit"))
    ar_width_km: float = Field(300.0, gt=0.0, description=(
        "e-folding half-width of a river's vapour"))
    ar_length_km: float = Field(4500.0, gt=0.0, description="typical river length")
    noise_length_km: float = Field(1500.0, gt=0.0, description=(
        "correlation length of the background weather"))
    tc_psl_drop_pa: float = Field(1000.0, gt=0.0, description=(
        "central sea-level pressure drop of a cyclone"))
    tc_wind_m_per_s: float = Field(17.0, gt=0.0, description=(
        "a cyclone's peak wind (tropical-storm strength)"))
    tc_warm_core_k: float = Field(1.5, gt=0.0, description=(
        "warm-core temperature anomaly of a cyclone"))
    tc_tmq_anomaly_kg_per_m2: float = Field(10.0, gt=0.0, description=(
        "total precipitable water anomaly at a cyclone's centre"))
    ar_ivt_anomaly_kg_per_m_s: float = Field(250.0, gt=0.0, description=(
        "integrated vapour transport anomaly along a river"))
    ar_min_length_km: float = Field(2000.0, gt=0.0, description=(
        "shortest river the label detector keeps"))


def grid(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell-centre latitudes (H,) from north to south and longitudes (W,), in degrees (float64)."""
    lat = 90.0 - (np.arange(height) + 0.5) * 180.0 / height
    lon = (np.arange(width) + 0.5) * 360.0 / width
    return lat, lon


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], sigma_px: tuple[float, float]) -> np.ndarray:
    field = ndimage.gaussian_filter(rng.standard_normal(shape), sigma_px, mode=("nearest", "wrap"))
    return field / max(float(field.std()), 1e-12)


def _offsets_km(lat2d: np.ndarray, lon2d: np.ndarray, lat0: float, lon0: float) -> tuple[np.ndarray, np.ndarray]:
    """Eastward and northward distances (km) of every cell from (lat0, lon0), local-plane."""
    dlon = (lon2d - lon0 + 180.0) % 360.0 - 180.0
    return dlon * KM_PER_DEG * np.cos(np.deg2rad(lat2d)), (lat2d - lat0) * KM_PER_DEG


def _background(rng: np.random.Generator, cfg: SynthConfig, lat2d: np.ndarray) -> dict[str, np.ndarray]:
    h, w = lat2d.shape
    px_km = 180.0 * KM_PER_DEG / h
    sigma = (cfg.noise_length_km / px_km, cfg.noise_length_km / px_km)
    n = {k: _smooth_noise(rng, (h, w), sigma) for k in ("t", "p", "q", "u", "v", "oro", "r")}
    s2 = np.sin(np.deg2rad(lat2d)) ** 2
    alat = np.abs(lat2d)
    f: dict[str, np.ndarray] = {}
    f["TS"] = 302.0 - 45.0 * s2 + 2.5 * n["t"]
    f["TREFHT"] = f["TS"] - 1.2 - 0.3 * n["r"]
    f["T500"] = 268.0 - 28.0 * s2 + 1.5 * n["t"]
    f["T200"] = 218.0 + 6.0 * s2 + 0.8 * n["t"]
    moist = np.exp(-(lat2d / 26.0) ** 2)
    f["TMQ"] = (50.0 * moist + 5.0) * (1.0 + 0.08 * n["q"])
    f["QREFHT"] = (0.017 * moist + 0.0015) * (1.0 + 0.08 * n["q"])
    f["U850"] = -7.0 * np.exp(-(lat2d / 14.0) ** 2) + 14.0 * np.exp(-((alat - 45.0) / 11.0) ** 2) + 2.0 * n["u"]
    f["V850"] = 2.0 * n["v"]
    f["PSL"] = (101300.0 + 700.0 * np.exp(-((alat - 30.0) / 9.0) ** 2)
                - 1300.0 * np.exp(-((alat - 62.0) / 10.0) ** 2) + 400.0 * n["p"])
    f["PRECT"] = 1e-8 * (f["TMQ"] / 30.0) ** 3 * (1.0 + 0.3 * np.abs(n["r"]))
    f["orography_m"] = 2500.0 * np.clip(n["oro"] - 1.0, 0.0, None)
    return f


def _add_cyclone(f: dict[str, np.ndarray], rng: np.random.Generator, cfg: SynthConfig,
                 grid2d: tuple[np.ndarray, np.ndarray], centre: tuple[float, float]) -> None:
    """A vortex added to fields ``f`` at ``centre`` (latitude, longitude in degrees) of the
    (H, W) latitude and longitude grids ``grid2d``: its radius and strength drawn from ``rng``;
    a pressure drop, a rotating wind, moisture, rain and a warm core."""
    (lat2d, lon2d), (lat0, lon0) = grid2d, centre
    hemi = 1.0 if lat0 >= 0 else -1.0
    radius = cfg.tc_radius_km * rng.uniform(0.8, 1.25)
    drop_pa = rng.uniform(1500.0, 6000.0)
    vmax = 20.0 + drop_pa / 150.0
    rm = 0.6 * radius
    dx, dy = _offsets_km(lat2d, lon2d, lat0, lon0)
    r = np.hypot(dx, dy)
    core = np.exp(-(r / radius) ** 2)
    f["PSL"] -= drop_pa * core
    vt = vmax * (r / rm) * np.exp(0.5 * (1.0 - (r / rm) ** 2))  # peak vmax at rm
    rr = np.maximum(r, 1e-6)
    u, v = -hemi * vt * dy / rr, hemi * vt * dx / rr  # counter-clockwise in the north
    f["U850"] += u
    f["V850"] += v
    moist = np.exp(-(r / (1.2 * radius)) ** 2)
    f["TMQ"] += rng.uniform(18.0, 28.0) * moist
    f["QREFHT"] += 0.004 * moist
    f["PRECT"] += 2e-6 * np.exp(-(r / (0.8 * radius)) ** 2)
    f["T500"] += 4.0 * core
    f["T200"] += 3.0 * core


def _add_river(f: dict[str, np.ndarray], rng: np.random.Generator, cfg: SynthConfig,
               lat2d: np.ndarray, lon2d: np.ndarray) -> None:
    hemi = rng.choice([-1.0, 1.0])
    length = cfg.ar_length_km * rng.uniform(0.8, 1.25)
    lat_start = rng.uniform(12.0, 24.0)
    heading = np.deg2rad(rng.uniform(25.0, 55.0))  # from east towards the pole
    bend = rng.uniform(-0.4, 0.4)
    lon_start = rng.uniform(0.0, 360.0)
    # quadratic Bezier in (east km, north km) from the start point
    end = np.array([np.cos(heading), np.sin(heading)]) * length
    ctrl = 0.5 * end + bend * length * np.array([-np.sin(heading), np.cos(heading)])
    t = np.linspace(0.0, 1.0, 48)[:, None]
    pts = (2 * (1 - t) * t) * ctrl + t**2 * end  # (P, 2) km
    tang = 2 * (1 - t) * ctrl + 2 * t * (end - ctrl)
    tang /= np.linalg.norm(tang, axis=1, keepdims=True)
    lat_pts = hemi * (lat_start + pts[:, 1] / KM_PER_DEG)
    lon_pts = lon_start + pts[:, 0] / (KM_PER_DEG * np.cos(np.deg2rad(lat_pts)))
    width = cfg.ar_width_km * rng.uniform(0.8, 1.2)
    best = np.full(lat2d.shape, np.inf)
    which = np.zeros(lat2d.shape, dtype=np.int64)
    for k in range(len(t)):
        dx, dy = _offsets_km(lat2d, lon2d, lat_pts[k], lon_pts[k])
        d = np.hypot(dx, dy)
        closer = d < best
        best[closer], which[closer] = d[closer], k
    envelope = np.sin(np.pi * t[which, 0]) ** 0.5
    profile = np.exp(-(best / width) ** 2) * envelope
    speed = rng.uniform(12.0, 22.0) * profile
    east, north = tang[which, 0], hemi * tang[which, 1]
    f["TMQ"] += rng.uniform(18.0, 30.0) * profile
    f["QREFHT"] += 0.003 * profile
    f["U850"] += speed * east
    f["V850"] += speed * north
    f["PRECT"] += 4e-7 * profile


def _finish(f: dict[str, np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Derived variables; returns float32 (H, W, 16) in CHANNELS order."""
    f["UBOT"] = 0.75 * f["U850"]
    f["VBOT"] = 0.75 * f["V850"]
    f["PS"] = f["PSL"] * np.exp(-f["orography_m"] * G_M_PER_S2 / (R_DRY_J_PER_KG_K * f["TS"]))
    f["Z1000"] = (f["PSL"] - 100000.0) / (1.2 * G_M_PER_S2)  # ~8 m per hPa above 1000 hPa
    t_mean = (f["TS"] + f["T500"] + f["T200"]) / 3.0
    f["Z200"] = f["Z1000"] + R_DRY_J_PER_KG_K * t_mean / G_M_PER_S2 * np.log(1000.0 / 200.0)
    f["ZBOT"] = 62.0 + 0.005 * f["orography_m"] + 0.5 * rng.standard_normal(f["TS"].shape)
    return np.stack([f[name] for name in CHANNELS], axis=-1).astype(np.float32)


def _zonal_anomaly(x: np.ndarray) -> np.ndarray:
    return x - np.median(x, axis=1, keepdims=True)


def _components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """Connected components (8-neighbour) of a mask that wraps in longitude."""
    lab, count = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    if count == 0:
        return lab, 0
    parent = np.arange(count + 1)

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    h = mask.shape[0]
    for row in range(h):
        for drow in (-1, 0, 1):
            other = row + drow
            if 0 <= other < h and lab[row, -1] and lab[other, 0]:
                a, b = root(int(lab[row, -1])), root(int(lab[other, 0]))
                parent[max(a, b)] = min(a, b)
    roots = np.array([root(i) for i in range(count + 1)])
    return roots[lab], count


def detect(fields: np.ndarray, lat: np.ndarray, lon: np.ndarray, cfg: SynthConfig) -> np.ndarray:
    """TECA-style labels for one sample (criteria in the module docstring).

    Args:
        fields: float32 (H, W, 16) in `CHANNELS` order, physical units (K, Pa, m/s, kg/m^2 ...).
        lat / lon: cell-centre latitudes (H,) and longitudes (W,) in degrees.

    Returns:
        int32 (H, W): 0 background, 1 tropical cyclone, 2 atmospheric river.
    """
    v = {name: fields[..., i].astype(np.float64) for i, name in enumerate(CHANNELS)}
    labels = np.zeros(fields.shape[:2], dtype=np.int32)
    tc_mask, near_tc = _detect_cyclones(v, lat, lon, cfg)
    labels[tc_mask] = 1
    rivers = _detect_rivers(v, lat, lon, cfg, near_tc)
    labels[rivers & (labels == 0)] = 2
    return labels


def _detect_cyclones(v: dict[str, np.ndarray], lat: np.ndarray, lon: np.ndarray, cfg: SynthConfig
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The tropical cyclones of fields ``v`` (name -> float64 (H, W)): a sea-level pressure
    minimum, cyclonic, warm-cored and windy, its moist region; returns (their bool (H, W)
    mask, the cells within 2.5 storm radii of a detected centre)."""
    h, w = v["PSL"].shape
    lat2d, lon2d = np.meshgrid(lat, lon, indexing="ij")
    px_km = 180.0 * KM_PER_DEG / h
    radius_px = max(1, int(round(cfg.tc_radius_km / px_km)))
    psl_anom = _zonal_anomaly(v["PSL"])
    t500_anom = _zonal_anomaly(v["T500"])
    tmq_anom = _zonal_anomaly(v["TMQ"])
    wind = np.hypot(v["UBOT"], v["VBOT"])
    dx_m = np.deg2rad(360.0 / w) * 6.371e6 * np.cos(np.deg2rad(lat2d))
    dy_m = np.deg2rad(180.0 / h) * 6.371e6
    dvdx = (np.roll(v["V850"], -1, axis=1) - np.roll(v["V850"], 1, axis=1)) / (2 * dx_m)
    dudy = -np.gradient(v["U850"], axis=0) / dy_m  # rows run southwards
    vorticity = dvdx - dudy
    window = 2 * radius_px + 1
    minima = (psl_anom == ndimage.minimum_filter(psl_anom, size=window, mode=("nearest", "wrap")))
    candidates = np.argwhere(minima & (psl_anom < -cfg.tc_psl_drop_pa) & (np.abs(lat2d) < 45.0))
    tc_mask = np.zeros((h, w), dtype=bool)
    near_tc = np.zeros((h, w), dtype=bool)  # within 2.5 storm radii of a detected centre
    for i, j in candidates:
        dx, dy = _offsets_km(lat2d, lon2d, lat[i], lon[j])
        r = np.hypot(dx, dy) / cfg.tc_radius_km
        disk = r < 1.0
        hemi = 1.0 if lat[i] >= 0 else -1.0
        cyclonic = hemi * vorticity[disk].mean() > 0.0
        warm = t500_anom[r < 0.5].mean() - t500_anom[(r > 1.5) & (r < 2.5)].mean() > cfg.tc_warm_core_k
        windy = wind[disk].max() >= cfg.tc_wind_m_per_s
        if not (cyclonic and warm and windy):
            continue
        region, _ = _components((tmq_anom > cfg.tc_tmq_anomaly_kg_per_m2) & (r < 2.5))
        if region[i, j]:
            tc_mask |= region == region[i, j]
        near_tc |= r < 2.5
    return tc_mask, near_tc


def _detect_rivers(v: dict[str, np.ndarray], lat: np.ndarray, lon: np.ndarray, cfg: SynthConfig,
                   near_tc: np.ndarray) -> np.ndarray:
    """The atmospheric rivers of fields ``v`` away from cyclones (``near_tc``): connected regions
    of high vapour transport, outside the tropics, long and narrow; a bool (H, W) mask."""
    h = v["PSL"].shape[0]
    px_km = 180.0 * KM_PER_DEG / h
    ivt = v["TMQ"] * np.hypot(v["U850"], v["V850"])
    river = (_zonal_anomaly(ivt) > cfg.ar_ivt_anomaly_kg_per_m_s) & ~near_tc
    comp, _ = _components(river)
    found = np.zeros(river.shape, dtype=bool)
    for cid in np.unique(comp[comp > 0]):
        rows, cols = np.nonzero(comp == cid)
        lons = lon[cols]
        if np.ptp(lons) > 180.0:  # crosses the date line: unwrap
            lons = np.where(lons < 180.0, lons + 360.0, lons)
        lats = lat[rows]
        if abs(lats.mean()) < 15.0 or rows.size < 3:
            continue
        xy = np.stack([lons * KM_PER_DEG * np.cos(np.deg2rad(lats)), lats * KM_PER_DEG], axis=1)
        eig = np.linalg.eigvalsh(np.cov(xy.T))
        length_km = np.sqrt(12.0 * max(eig[1], 0.0))
        width_km = np.sqrt(12.0 * max(eig[0], 0.0)) + px_km
        if length_km >= cfg.ar_min_length_km and length_km >= 2.0 * width_km:
            found |= comp == cid
    return found


def make_sample(cfg: SynthConfig, seed: int, split: str, index: int) -> tuple[np.ndarray, np.ndarray]:
    """One synthetic snapshot: (data float32 (H, W, 16), labels int32 (H, W)).

    Deterministic in ``(seed, split, index)``.
    """
    rng = np.random.default_rng([seed, _SPLITS[split], index])
    lat, lon = grid(cfg.height, cfg.width)
    lat2d, lon2d = np.meshgrid(lat, lon, indexing="ij")
    f = _background(rng, cfg, lat2d)
    centres: list[tuple[float, float]] = []
    for _ in range(rng.poisson(cfg.cyclones_per_sample)):
        for _attempt in range(10):
            lat0 = rng.choice([-1.0, 1.0]) * rng.uniform(8.0, 28.0)
            lon0 = rng.uniform(0.0, 360.0)
            far = all(np.hypot(*_offsets_km(np.array(lat0), np.array(lon0), a, b)) > 5.0 * cfg.tc_radius_km
                      for a, b in centres)
            if far:
                centres.append((lat0, lon0))
                _add_cyclone(f, rng, cfg, (lat2d, lon2d), (lat0, lon0))
                break
    for _ in range(rng.poisson(cfg.rivers_per_sample)):
        _add_river(f, rng, cfg, lat2d, lon2d)
    data = _finish(f, rng)
    return data, detect(data, lat, lon, cfg)


def sample_name(split: str, index: int) -> str:
    """File name of sample ``index`` of ``split``: ``data-YYYY-MM-DD-HH-1.h5``, 3-hourly."""
    when = dt.datetime(_FIRST_YEAR[split], 1, 1) + dt.timedelta(hours=3 * index)
    return f"data-{when:%Y-%m-%d-%H}-1.h5"


def _write_atomic(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # the temporary created O_EXCL | O_NOFOLLOW (never written through a planted link), with
    # the bits an h5py-created file has (0666 less the umask)
    with atomic_output(path, 0o666) as tmp, h5py.File(tmp, "w") as f:
        for key, value in arrays.items():
            f.create_dataset(key, data=value)


def file_stats(data: np.ndarray) -> tuple[np.ndarray, ...]:
    """One sample's per-channel (min, max, mean, mean of squares), float64 ``(16,)`` each, of its
    ``(H, W, 16)`` data as stored."""
    x = data.astype(np.float64)
    return x.min(axis=(0, 1)), x.max(axis=(0, 1)), x.mean(axis=(0, 1)), (x**2).mean(axis=(0, 1))


def _read_stats_of(path: Path) -> tuple[np.ndarray, ...]:
    with h5py.File(path, "r") as f:
        return file_stats(f[DATA_KEY][...])


def write_stats(data_dir: Path, per_file: list[tuple[np.ndarray, ...]]) -> None:
    """Write ``stats.h5`` (climate/minval, maxval, mean, sqmean, count over the training files,
    ``per_file`` their `file_stats` in file order), as the reference's ``summarize_data.py``
    computes it from the training split: a running mean in file order, so the bytes do not
    depend on which ranks computed each file's figures."""
    lo = hi = mean = sqmean = None
    for k, (cur_lo, cur_hi, cur_mean, cur_sq) in enumerate(per_file):
        if k == 0:
            lo, hi, mean, sqmean = cur_lo, cur_hi, cur_mean.copy(), cur_sq.copy()
        else:
            lo, hi = np.minimum(lo, cur_lo), np.maximum(hi, cur_hi)
            mean += (cur_mean - mean) / (k + 1)
            sqmean += (cur_sq - sqmean) / (k + 1)
    _write_atomic(Path(data_dir) / STATS_FILE, {
        "climate/count": np.int64(len(per_file)), "climate/minval": lo.astype(np.float32),
        "climate/maxval": hi.astype(np.float32), "climate/mean": mean.astype(np.float32),
        "climate/sqmean": sqmean.astype(np.float32)})


#: HDF5 header and dataset headers of one sample file, in bytes (measured with h5py 3 on
#: 32 x 48 files: 4,480 bytes beside the two arrays).
FILE_OVERHEAD_BYTES = 4_480


def _write_sample(job: tuple[SynthConfig, int, str, int, Path]) -> tuple[np.ndarray, ...]:
    """Make and write one sample; its `file_stats`."""
    cfg, seed, split, index, path = job
    data, labels = make_sample(cfg, seed, split, index)
    _write_atomic(path, {DATA_KEY: data, LABEL_KEY: labels})
    return file_stats(data)


def estimated_bytes(cfg: SynthConfig, samples: int) -> int:
    """Bytes of ``samples`` sample files: float32 ``(H, W, 16)`` data and int32 ``(H, W)``
    labels each, plus `FILE_OVERHEAD_BYTES` (``stats.h5`` is left out: a few hundred bytes)."""
    return samples * (cfg.height * cfg.width * (len(CHANNELS) + 1) * 4 + FILE_OVERHEAD_BYTES)


def synthesize(out_dir: Path, cfg: SynthConfig, seed: int,
               progress: SynthProgress = NO_PROGRESS) -> None:
    """Write (or complete) a synthetic DeepCAM dataset in the official layout under ``out_dir``.

    Files already present are kept; missing ones are generated (deterministic in ``seed``) and
    written atomically; ``stats.h5`` is written last from every training file's figures. Of the
    plan's samples this rank writes ``progress.share``; the statistics are gathered from every
    rank (``progress.gather``), in ``progress.workers`` processes (0 or 1: here). ``progress``
    (`mlhpc.workload.SynthProgress`) hears ``plan(samples, bytes)`` before the first sample is
    made (bytes from `estimated_bytes`) and ``done(1)`` after each.

    Raises:
        DataError: ``out_dir`` cannot be created or written.
    """
    out_dir = Path(out_dir)
    try:
        plan = [(split, index, out_dir / split / sample_name(split, index))
                for split, count in ((TRAIN_DIR, cfg.train_samples), (VALIDATION_DIR, cfg.validation_samples))
                for index in range(count)]
        mine = progress.share(plan)  # this rank's samples; of those, the ones not yet written
        todo = [job for job in mine if not job[2].exists()]
        progress.plan(len(todo), estimated_bytes(cfg, len(todo)))
        for split in {job[0] for job in todo}:
            (out_dir / split).mkdir(parents=True, exist_ok=True)
        stats = {}
        jobs = [(cfg, seed, split, index, path) for split, index, path in todo]
        # spawn: the parent may hold torch / OpenMP threads that fork would copy half-started
        for (_, _, split, index, _), figures in zip(jobs, map_in_order(
                _write_sample, jobs, progress.workers, start="spawn")):
            if split == TRAIN_DIR:
                stats[index] = figures
            progress.done(1)
        part = [(index, stats.get(index) or _read_stats_of(path))
                for split, index, path in mine if split == TRAIN_DIR]
        every = progress.gather(part)
        if every is not None:  # the rank that finishes the data set, once all are written
            write_stats(out_dir, [figures for _, figures in sorted(every, key=lambda item: item[0])])
    except OSError as exc:
        raise DataError(f"{out_dir}: cannot write synthetic dataset ({exc.strerror or exc})") from None
