"""One run of a benchmark, from its config to its files (docs/architecture.md, "How a run flows").

`mlhpc.run.train.run` is the entry; the other modules are its parts, shared with ``mlhpc profile``
and the benchmarks: `assemble` (the `Job`, staging, `build`), `log` (the log's records around the
timed run), `step` (the one training step), `evaluate` (the quality metric over ranks),
`checkpoint` (save, restore, resume), `outcome` (signals, a failed attempt set aside, the ranks'
agreement), `finish` (the side files) and `result` (a run's files and its result read back from
its log).
"""
