"""certmanager transports: the gRPC API and the admin REST routes."""
