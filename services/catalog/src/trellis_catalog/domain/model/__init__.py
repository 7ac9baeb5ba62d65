"""The catalog's values (an identity's view, a cluster's state) and their content versions.

The ground floor of the domain: it imports nothing of the catalog, only the libraries.
"""
