"""Pure endpoint logic: workloads, service views, ServiceEntry resolution. No I/O."""
