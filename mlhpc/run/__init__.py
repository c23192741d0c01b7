"""One run of a benchmark, from its config to its files (docs/architecture.md, "How a run flows").

`mlhpc.run.train.run` is the entry: a straight line of stages, each taking values and returning
values, around a `Job` built once (`job`). The other modules are its parts, shared with
``mlhpc profile`` (`profile`) and the benchmarks: `assemble` (staging and the parts), `loop`
(the timed loop), `step` (the one training step), `evaluate` (the quality metric over ranks),
`mllog` (the log: its writer and the records around the timed run), `checkpoint` (save,
restore, resume), `outcome` (how a run ends: signals, a failed attempt set aside, the side files
after run_stop, the ranks' agreement), `result` (a run's files: the results folder checked, the
side files written once, the result read back from the log), `env` and `perf` (what a run ran
on, FLOPs and peaks).
"""
