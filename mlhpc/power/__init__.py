"""Power sampling during the timed run: energy to train, measured from real counters.

One sampler per node (local rank 0) reads, every ``power.interval_s`` (1 s by default, the MLPerf
power rules' minimum rate), either the site's node meter (``power.node_meter_command``: the
whole node at the wall, used alone when given) or the sum of every NVML GPU (total energy
counter, else the power gauge) and every readable RAPL CPU-package and DRAM zone under
``power.powercap_root``. It writes ``<out>/power/result_N/node_K.txt`` in the MLPerf power-log
layout (`mlhpc.power.sampler`), the folder ``mlperf_logging``'s result_summarizer and
``mlhpc report`` integrate into energy to train. Where nothing can be read, the run says so once
and no file is written: no energy is claimed. Not measured: network switches (an ``sw_K.txt``
with ``interconnect_power_est`` may be added by hand), and, without a node meter, fans, power
supplies, NICs, disks and anything else outside the GPUs and the RAPL zones. See docs/power.md.
"""

from mlhpc.config.power import PowerConfig
from mlhpc.power.sampler import Sampler, find_sources, node_file, samples_node, sampling

__all__ = ["PowerConfig", "Sampler", "find_sources", "node_file", "samples_node", "sampling"]
