"""``mlhpc validate``: does this machine compute a workload's model correctly? Deep500's four
levels (Ben-Nun et al., "A Modular Benchmarking Infrastructure for High-Performance and
Reproducible Deep Learning", IPDPS 2019; code deep500/deep500): operators, network, training and
distributed training, each on the user's device and precision against float64 on the CPU, with
named metrics and the tolerances of `mlhpc.validate.checks.TOLERANCES` (docs/validate.md).
"""
