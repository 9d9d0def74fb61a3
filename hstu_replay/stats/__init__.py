"""Statistics that merge by addition, so one process and many workers give the same report."""
