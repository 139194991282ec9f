"""Several nodes on one host: what `rel/yuzu_gw start --nodes N` runs (docs/multinode.md).

- `plan`: the pure part, from the configuration and a node index to the node's name, ports and
  environment (boot applies the same function, so the plan and the node agree).
- `restart_policy`: when a node that ended is started again (backoff, restart intensity).
- `runfile`: `<run_dir>/nodes.json`, the release's record of its nodes.
- `supervisor`: the small supervisor process that spawns the nodes and restarts a dead one.
- `__main__`: `python -m gateway.release supervise | wait | stop | status | node | count`,
  which `rel/yuzu_gw` calls.
"""
