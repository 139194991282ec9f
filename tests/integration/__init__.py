"""Tests that drive a real node, a real socket or a subprocess on this host."""
