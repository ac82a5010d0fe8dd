"""Everything that leaves the process: metrics, the priority table, the engine client."""
