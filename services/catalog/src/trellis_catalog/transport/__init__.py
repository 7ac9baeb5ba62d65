"""catalog transports: the Catalog gRPC API and the admin REST routes."""
