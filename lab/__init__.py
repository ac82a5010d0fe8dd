"""Everything offline that studies the product: simulators, workloads, traces, benchmarks, reports.

Nothing in the daemon imports this package; the CLI does (``kvcast simulate``, ``generate``,
``convert``, ``bench`` and the embedded default's demo workload).
"""
