"""The cluster: membership, the authenticated inter-node transport, and the management plane's
reach to the other nodes (docs/cluster.md). Importing the package imports nothing else, so the
config keys can use `gateway.cluster.seeds` without a cycle."""
