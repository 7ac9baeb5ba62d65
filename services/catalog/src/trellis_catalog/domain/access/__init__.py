"""Who may call whom, and how: one identity's policy (:mod:`.policy`), its inbound ports and
what IngressBackends admit to them (:mod:`.inbound`), its Egress (:mod:`.egress`), the
UpstreamTrafficSettings its clusters apply (:mod:`.upstream`), and CheckPolicy's answer in
words (:mod:`.explain`).

Builds on the routes (:mod:`~trellis_catalog.domain.routing`) and the known services
(:mod:`~trellis_catalog.domain.index`).
"""
