"""trellis_catalog: the mesh specification and the mesh catalog."""
