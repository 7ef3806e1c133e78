"""Core: config-independent machinery every layer uses: sharding rules and meshes, preemption, machine facts,
the compile cache, the metrics log, iterator state, atomic files."""
