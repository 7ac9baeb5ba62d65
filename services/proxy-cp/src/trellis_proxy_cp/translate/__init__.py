"""Pure translation from a catalog view to Envoy resources, one module per resource type."""
