"""trellis_proxy_cp: the proxy control plane (Envoy xDS v3 ADS, state of the world and delta)."""
