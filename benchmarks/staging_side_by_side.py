"""Staging throughput of two checkouts of mlhpc, side by side: the same tree staged by each, in
alternation, best of ``--repeats``, each in its own process (so each imports its own code).

Used to show that a change to the data layer kept staging's speed: run it with ``--old`` a
checkout of the earlier commit (``git worktree add /tmp/old <commit>``).

Usage: python benchmarks/staging_side_by_side.py --old /tmp/old [--files 96] [--mib 4] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlhpc.data.claims import make_claimed_dir, remove_claimed  # noqa: E402
from mlhpc.data.files import write_under  # noqa: E402
from mlhpc.text import echo  # noqa: E402

ONE_STAGING = r"""
import sys, time, json
from pathlib import Path
sys.path.insert(0, sys.argv[1])
try:
    from mlhpc.data.stage import stage
except ImportError:
    from mlhpc.staging import stage
from mlhpc.runtime import Runtime
t0 = time.perf_counter()
stage(Path(sys.argv[2]), Path(sys.argv[3]), Runtime(), workers=4)
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def make_tree(root: Path, files: int, mib: int) -> int:
    """``files`` files of ``mib`` MiB of random bytes under train/ and validation/ of ``root``
    (made here); total bytes."""
    root.mkdir()
    for i in range(files):
        write_under(root, Path("train" if i % 8 else "validation", f"part{i:04d}.bin"),
                    os.urandom(mib << 20))
    return files * (mib << 20)


def timed(code_root: Path, src: Path, dest: Path) -> float:
    proc = subprocess.run([sys.executable, "-c", ONE_STAGING, str(code_root), str(src), str(dest)],
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": ""})
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="checkout of the earlier commit")
    parser.add_argument("--files", type=int, default=96)
    parser.add_argument("--mib", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        total = make_tree(src, args.files, args.mib)
        best = {"old": float("inf"), "new": float("inf")}
        for i in range(args.repeats):
            for name, root in (("old", args.old), ("new", REPO)):
                # each copy inside a claimed scratch folder: an older checkout may not claim its
                # copies, and the scratch folder's claim covers all it holds
                scratch = make_claimed_dir(Path(tmp) / f"{name}{i}", "scratch")
                best[name] = min(best[name], timed(root, src, scratch / "copy"))
                remove_claimed(scratch, "scratch", "benchmark scratch folder")
    result = {"bytes": total, "repeats": args.repeats,
              "old_gb_per_s": total / best["old"] / 1e9, "new_gb_per_s": total / best["new"] / 1e9,
              "new_over_old": best["old"] / best["new"]}
    echo(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
