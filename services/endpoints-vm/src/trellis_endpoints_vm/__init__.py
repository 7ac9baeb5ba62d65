"""trellis_endpoints_vm: the endpoints provider for workloads outside Kubernetes."""
