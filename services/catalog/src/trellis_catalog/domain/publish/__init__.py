"""What the catalog publishes to its consumers, versioned by content: the resources (an
identity's policy, a cluster's slice, a destination) in one change log, and the
destinations that service discovery answers with.
"""
