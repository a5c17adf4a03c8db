"""Serving components: each a SimPy process, or the owner of SimPy resources, on one clock."""
