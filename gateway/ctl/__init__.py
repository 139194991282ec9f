"""`yuzu-gw-ctl` (also `python -m gateway.ctl`): the operator's command line for a gateway's
management listener (`yuzu.server.v1.ManagementService`, docs/management-plane.md). docs/ctl.md.

    yuzu-gw-ctl [--target HOST:PORT] [--ca F] [--cert F --key F] [--json] [--timeout S]
        agents list [--limit N] [--all] [--cursor ID] | agents get ID
        | send (--all | ID...) PLUGIN ACTION [KEY=VALUE ...] [--timeout S] [--command-id X]
        | watch [ID...]

The modules:

- `cli`: the command line (pure: the parser, `KEY=VALUE` parameters, the send words, the
  target) and the requests it builds;
- `render`: what is printed (pure: table rows, answer and event lines, the `--json` objects);
- `errors`: the exit statuses and what each failure tells the operator to check (pure);
- `connect`: the grpclib channel (plaintext, or TLS with an optional client certificate);
- `commands`: the four commands over the generated grpclib stub;
- `__main__`: `main()`, the console script.

Low-volume tooling: grpclib and the project's own generated code (protos/yuzu/server/v1), the
stack the gateway itself serves with; no grpcio and no betterproto needed.
"""
