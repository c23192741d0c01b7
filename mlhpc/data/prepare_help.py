"""The help of ``mlhpc data prepare``: the generic options, then each registered workload's own
prepare options (declared by the workload through `mlhpc.workload.prepare_options`)."""

from __future__ import annotations

import click

from mlhpc.errors import ConfigError


class PrepareCommand(click.Command):
    """``data prepare``, whose help ends with each registered workload's own options."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        from mlhpc.workload import get, names, prepare_options

        rows = []
        for name in names():
            try:
                tools = get(name).data_tools
            except ConfigError:  # a broken entry point: `mlhpc list` says why
                continue
            for option in prepare_options(tools) if tools is not None else []:
                rows.append((f"{name}: {option['name']}",
                             f"{option['description']} (default {option['default']})"))
        with formatter.section("Options of each workload (--option KEY=VALUE)"):
            formatter.write_dl(rows or [("(none)", "no registered workload declares one")])
