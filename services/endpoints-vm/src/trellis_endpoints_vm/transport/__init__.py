"""endpoints-vm transports: the provider gRPC API and the registration REST API."""
