"""Clients of the catalog and certmanager: views and secret material for connected proxies."""
