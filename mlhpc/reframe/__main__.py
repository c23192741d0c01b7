"""``python -m mlhpc.reframe``: the path of the checks file for ``reframe -c``;
``--config NAME``: the path of an example ReFrame configuration for ``reframe -C`` (``laptop``,
``slurm``). An unknown name is one line on stderr, exit status 2."""

from __future__ import annotations

import sys

from mlhpc.reframe import CHECKS_FILE, CONFIGS
from mlhpc.text import echo


def main(argv: list[str]) -> int:
    """Print the asked path; 0, or 2 for a bad argument (one line naming it)."""
    if not argv:
        echo(str(CHECKS_FILE))
        return 0
    if len(argv) == 2 and argv[0] == "--config" and argv[1] in CONFIGS:
        echo(str(CONFIGS[argv[1]]))
        return 0
    echo(f"mlhpc: error: usage: python -m mlhpc.reframe [--config {'|'.join(CONFIGS)}]; got "
         f"{' '.join(argv)!r}", err=True)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
