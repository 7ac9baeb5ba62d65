"""The mesh specification's model: the documents (``trellis_common.documents``) resolved
into what the mesh applies (access grants, routes, settings) and each document's status.

The catalog builds it from the spec directory or Kubernetes and computes policies from it;
``trellis spec validate`` builds it offline from files. ``mesh`` builds and patches it,
``grants`` resolves TrafficTargets, ``gateway_matches`` Gateway API matches, ``egress``
the statuses that need no known service, ``statuses`` their values, ``steps`` the
stepwise work a big build yields in.
"""
