"""The dev stack: a fake Yuzu server, one gateway node and N simulated agents on loopback, so a
newcomer sees the gateway fan commands out without a server or real agents (docs/devstack.md).

    python -m gateway.devstack [--agents N] [--tls] [--free-ports]    (or rel/yuzu_gw devstack)

The modules:

- `stack`: the orchestration (the run directory, the node subprocess, readiness, the banner, the
  ordered stop) and `__main__` its command line;
- `config`: the node's configuration, derived from sys_config/sys.config;
- `pki`: the throwaway CA and certificates of `--tls`;
- `fake_upstream`: the fake Yuzu server (grpcio), also the tests' fake and runnable alone
  (`python -m gateway.devstack.fake_upstream`); `upstream` starts it for the stack;
- `behaviour`: what a simulated agent says (pure: command answers, Guardian events, backoff);
- `agents`: the simulated agents themselves (grpcio, one connection each);
- `client`: a small ManagementService client for the banner's "send a command" line.

Needs grpcio, the `dev` extra (`pip install -e '.[dev]'`).
"""
