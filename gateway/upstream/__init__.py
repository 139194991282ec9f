"""The upstream hop: the channel of HTTP/2 connections to the Yuzu server, and the call
path every upstream request takes (breaker, permits, deadline)."""
