"""What the agent exports: metric names, the catalog, the immutable Snapshot and its exposition."""
