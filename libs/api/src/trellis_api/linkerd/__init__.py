"""linkerd2-proxy-api v0.18.0 (proto/vendor/linkerd2-proxy-api), generated: the Linkerd Destination API."""
