"""docs/config-reference.md is generated from the config schema (issue 26, point 3): every key has
a meaning, and the file is what the generator prints now, so it cannot drift from the code."""

from __future__ import annotations

from click.testing import CliRunner
from pydantic import Field

from mlhpc.config import reference as config_reference
from mlhpc.cli import main
from mlhpc.config import Section


def test_every_key_has_a_description():
    assert config_reference.missing_descriptions() == []


def test_a_key_without_description_is_caught():
    class Documented(Section):
        """A section.

        Attributes:
            b: described in the docstring,
                over two lines.
        """

        a: int = Field(1, ge=0, description="described in the field")
        b: float = 2.0
        c_s: float = 3.0

    keys = {k.path: k for k in config_reference.section_keys(Documented, "x.")}
    assert keys["x.a"].meaning == "described in the field" and keys["x.a"].allowed == ">= 0"
    assert keys["x.b"].meaning == "described in the docstring, over two lines."
    assert keys["x.c_s"].meaning == "" and keys["x.c_s"].unit == "s"


def test_the_reference_file_is_what_the_schema_generates(repo):
    written = (repo / "docs" / "config-reference.md").read_text()
    assert written == config_reference.render(), (
        "docs/config-reference.md differs from the schema: run "
        "`mlhpc config reference --out docs/config-reference.md`")
    for key in ("train.log_every_steps", "train.amp", "data.num_workers", "model.conv_channels",
                "optimizer.lr", "power.interval_s"):
        assert f"| `{key}` |" in written, key


def test_the_command_prints_and_writes_it(tmp_path):
    printed = CliRunner().invoke(main, ["config", "reference"])
    assert printed.exit_code == 0 and printed.output == config_reference.render()
    out = tmp_path / "ref.md"
    wrote = CliRunner().invoke(main, ["config", "reference", "--out", str(out)])
    assert wrote.exit_code == 0 and out.read_text() == config_reference.render()
