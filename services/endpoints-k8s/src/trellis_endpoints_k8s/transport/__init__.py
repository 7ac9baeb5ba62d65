"""endpoints-k8s's APIs: the EndpointsProvider gRPC service and the admin REST routes."""
