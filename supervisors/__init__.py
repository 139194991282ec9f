"""An OTP-like library on thespian: the loop system base, processes, supervisors, tables
and introspection. Knows nothing of Yuzu."""
