"""One run of a benchmark, from its config to its files (docs/architecture.md, "How a run flows").

`mlhpc.run.train.run` is the entry: a straight line of stages, each taking values and returning
values, around a `Job` built once (`job`). The other modules are its parts, shared with
``mlhpc profile`` (`profile`) and the benchmarks: `assemble` (staging and the parts), `loop`
(the timed loop), `step` (the one training step), `evaluate` (the quality metric over ranks),
`log` and `mllog` (the log's records and its writer), `checkpoint` (save, restore, resume),
`outcome` (signals, a failed attempt set aside, the ranks' agreement), `finish` and `result` (the
side files; a run's result read back from its log), `outdir`, `env` and `perf` (the results
folder, what a run ran on, FLOPs and peaks).
"""
