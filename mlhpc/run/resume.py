"""Which checkpoint ``mlhpc run --resume`` continues: read from the run folder's logs and
claims before the run starts (the command's step, `mlhpc.run.command.run`), so the run itself
(`mlhpc.run.train`) reads no earlier log. The checkpoint's contents and the claim a resuming
attempt makes are `mlhpc.run.checkpoint`'s.

The answers ``--resume`` gives (each `ConfigError`, one line, exit status 2, nothing written):
a run that finished (``run_stop`` without a signal) has nothing to resume; a checkpoint already
resumed (its ``resumed_N.json`` claim exists, created exclusively by the resuming run) is not
resumed twice; several stopped runs in one folder need the checkpoint named. A run folder that was
moved is resumed where it now is: the new log goes to the folder given, and the config's paths are
those the first attempt resolved (made absolute against its working folder when it started), so
nothing is synthesised or read relative to the current folder. A run folder is a tree: its
checkpoint, logs and claims are read inside it, and one that is a symbolic link out of it is
refused, naming it, never followed (`mlhpc.data.inputs.open_input` with the folder as root).

What a resumed run is worth by the MLPerf rules is said in `mlhpc.run.checkpoint`.
"""

from __future__ import annotations

import os
from pathlib import Path

from mlhpc.config import Config, from_dict
from mlhpc.data.inputs import SIDE_FILE_BYTES, open_input, read_json_object
from mlhpc.errors import ConfigError
from mlhpc.log.parse import parse_log
from mlhpc.log.plausible import BOUNDS, checked_number
from mlhpc.run.checkpoint import CLAIM_PATTERN, Resume, TrainState, checked, index_of, load, restore


def _log_state(log: Path) -> tuple[str, float]:
    """``(state, timed seconds)`` of the attempt logged in ``log``: ``"finished"`` (run_stop
    without a signal), ``"stopped"`` (run_stop by a signal), ``"crashed"`` (no run_stop) or
    ``"missing"``; seconds from run_start to run_stop (or to its last record) plus the attempts
    it continued. Read inside its run folder: a link out of it is refused (LogFormatError)."""
    if not os.path.lexists(log):
        return "missing", 0.0
    events = parse_log(log, root=log.parent).events
    start = next((e.time_ms for e in events if e.key == "run_start"), None)
    stop = next((e for e in events if e.key == "run_stop"), None)
    earlier = next((e.value.get("earlier_attempts_s", 0.0) for e in events
                    if e.key == "resume" and isinstance(e.value, dict)), 0.0)
    end = stop.time_ms if stop is not None else (events[-1].time_ms if events else None)
    earlier = checked_number(0.0 if earlier is None else earlier, f"--resume {log}: the resume record's "
                             "earlier_attempts_s", ConfigError, BOUNDS["duration_s"][:2])
    seconds = (end - start) / 1000.0 + earlier if start is not None and end else 0.0
    if stop is None:
        return "crashed", seconds
    return ("stopped" if stop.metadata.get("signal") else "finished"), seconds


def select(target: Path) -> tuple[Path, float]:
    """The checkpoint to resume from ``target`` (a run folder or a ``checkpoint_N.pt``) and the
    timed seconds of the attempts before it.

    Raises:
        ConfigError: not a run folder or checkpoint; no checkpoint; every checkpoint belongs to a
            finished run or was resumed already; several stopped runs (name the checkpoint);
            a claim that is a link out of the folder.
        LogFormatError: a result log that is a link out of the folder, or cannot be read.
    """
    if target.is_file():
        candidates, run_dir = [target], target.parent
    elif target.is_dir():
        run_dir = target
        candidates = sorted(target.glob("checkpoint_*.pt"), key=lambda p: p.name)
    else:
        raise ConfigError(f"--resume {target}: not a run folder or checkpoint file")
    if not candidates:
        raise ConfigError(f"--resume {target}: no checkpoint_N.pt in this folder (a run writes one "
                          "when stopped by SIGTERM or every train.checkpoint_every_epochs)")
    open_, refusals = [], []
    for path in candidates:
        index = index_of(path)
        claim = run_dir / CLAIM_PATTERN.format(index)
        state, seconds = _log_state(run_dir / f"result_{index}.txt")
        if os.path.lexists(claim):
            # a claim that is a link out of the folder (or a FIFO) is refused, never followed
            os.close(open_input(claim, SIDE_FILE_BYTES, run_dir, "resume claim", ConfigError))
            by = read_json_object(claim, "resume claim").get("resumed_by", "another run")
            refusals.append(f"{path.name} was already resumed by {by} ({claim.name}); resume that "
                            "run's checkpoint instead")
        elif state == "finished":
            refusals.append(f"result_{index}.txt finished (run_stop without a signal); nothing to "
                            "resume from " + path.name)
        else:
            open_.append((path, seconds))
    if len(open_) > 1:
        names = ", ".join(p.name for p, _ in open_)
        raise ConfigError(f"--resume {target}: {len(open_)} stopped runs ({names}); give the "
                          "checkpoint file to resume")
    if not open_:
        raise ConfigError(f"--resume {target}: " + refusals[-1])
    return open_[0]


def load_resume(target: Path) -> tuple[Config, Resume]:
    """The config and saved state to continue the run stopped in ``target`` (see `select`).

    The checkpoint is loaded with ``weights_only=True`` (tensors and plain containers only) and
    every field checked; the config's ``output.dir`` becomes the folder the checkpoint is in.

    Raises:
        ConfigError: as `select`, a checkpoint that cannot be read or is malformed, or a config
            in it that does not validate.
    """
    path, earlier_s = select(Path(target))
    raw = load(path, source=f"--resume {path}", root=path.parent)  # never a link out of its folder
    saved = checked(raw, source=f"--resume {path}")
    tree = dict(saved["config"])
    tree["output"] = {**(tree.get("output") or {}), "dir": str(path.parent)}
    config = from_dict(tree, source=f"{path} (config)")
    state = TrainState(config)
    restore({"train_state": state}, saved, source=f"--resume {path}")  # the counters
    if not earlier_s:  # the stopped attempt's log is gone: the time the checkpoint recorded
        earlier_s = state.elapsed_s
    return config, Resume(saved, state, path, path.parent, earlier_s)
