"""The children of `gateway_sup`, one module per feature: each reads the Config and the node's
context once and builds the frozen `Args` its actors start with, so no actor reads the Config,
the environment or a file itself (docs/dev/architecture.md)."""
