"""Pure catalog logic: the indexed specification, clusters and per-identity policy."""
