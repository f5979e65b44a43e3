"""Experiments that join tasks of several families on shared modules."""
