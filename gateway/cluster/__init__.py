"""The cluster: membership, the authenticated inter-node transport, and the management plane's
reach to the other nodes (docs/cluster.md). Peer addresses and this node's advertise address
are read with the config (gateway/config/cluster_seeds.py, advertise.py, local_host.py)."""
