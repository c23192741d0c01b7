"""The MLPerf HPC workloads shipped with mlhpc, installed as ``mlhpc_workloads``.

Each subpackage exports a `mlhpc.workload.Workload` as ``WORKLOAD`` and is registered through the
``mlhpc.workloads`` entry-point group (pyproject.toml), the same way a third-party package adds
one. The registry itself is `mlhpc.workload.get`; the harness never imports this package.
"""
