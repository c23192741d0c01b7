"""What the no-network baselines (baseline_deepcam.py, baseline_powerspectrum.py) share: the seed
of the embedded data and their command line (``--config`` first, ``--json`` last, one JSON object
printed)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mlhpc.data.files import write_text_atomic
from mlhpc.text import echo


def synth_seed(config: Any) -> int:
    """The seed the embedded data are synthesised with (``data.synth_seed``; ``train.seed`` in
    configs that predate it)."""
    return getattr(config.data, "synth_seed", config.train.seed)


def argument_parser(doc: str, default_config: Path) -> argparse.ArgumentParser:
    """A parser described by the first line of ``doc``, with ``--config`` (default
    ``default_config``); the script adds its own options, then calls `parse_args`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--config", type=Path, default=default_config)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser``'s arguments with ``--json PATH`` (also write the result there) added last."""
    parser.add_argument("--json", type=Path, help="also write the result here")
    return parser.parse_args(argv)


def emit(result: dict[str, Any], json_path: Path | None) -> int:
    """Print ``result`` as indented JSON and, when ``json_path`` is given, write it there too;
    returns the exit status 0."""
    text = json.dumps(result, indent=1)
    echo(text)
    if json_path:
        write_text_atomic(json_path, text + "\n")
    return 0
