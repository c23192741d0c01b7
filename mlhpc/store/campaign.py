"""Campaigns: ``mlhpc submit --sweep KEY=V1,V2,...`` -> one job per point, one shared campaign id.

`sweep_points` expands the sweep specifications into the ``--set`` overrides of each job (the
cartesian product when several keys are swept) and a campaign id; the submit command renders
one job per point with ``MLHPC_CAMPAIGN=<id>`` in its environment, so that `record_run` stores
each run under the campaign and ``mlhpc results scaling --campaign ID`` reads it.
"""

from __future__ import annotations

import datetime as dt
import itertools
import secrets
from dataclasses import dataclass

from mlhpc.errors import ConfigError


@dataclass(frozen=True)
class Sweep:
    """A campaign: its id and, per job, the ``KEY=VALUE`` overrides (in the sweep's key order)."""

    campaign_id: str
    points: list[list[str]]


def new_campaign_id() -> str:
    """``YYYYmmdd-HHMMSS-<6 hex>`` (UTC): sortable by time, unique across concurrent submits."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def sweep_points(specs: list[str], campaign_id: str | None = None) -> Sweep:
    """``["nodes=1,2,4", "train.global_batch_size=64,128"]`` -> 6 points, each a list of
    ``--set`` overrides (``["nodes=1", "train.global_batch_size=64"]``, ...).

    Raises:
        ConfigError: a specification without ``=``, with no value, a repeated key, or a value
            list with an empty entry (naming it).
    """
    keys, values = [], []
    for spec in specs:
        key, sep, listed = spec.partition("=")
        key = key.strip()
        choices = [v.strip() for v in listed.split(",")]
        if not sep or not key or not listed.strip() or any(not v for v in choices):
            raise ConfigError(f"--sweep {spec!r}: expected KEY=V1,V2,... with no empty value")
        if key in keys:
            raise ConfigError(f"--sweep {spec!r}: key {key!r} swept twice")
        keys.append(key)
        values.append(choices)
    points = [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*values)]
    return Sweep(campaign_id or new_campaign_id(), points)
