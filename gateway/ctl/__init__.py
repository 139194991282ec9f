"""`yuzu-gw-ctl` (also `python -m gateway.ctl`): the operator's command line for a gateway's
management listener (`yuzu.server.v1.ManagementService`, docs/management-plane.md). docs/ctl.md.

    yuzu-gw-ctl [--target HOST:PORT] [--ca F] [--cert F --key F] [--json] [--timeout S]
        agents list [--limit N] [--all] [--cursor ID] | agents get ID
        | send (--all | ID...) PLUGIN ACTION [KEY=VALUE ...] [--timeout S] [--command-id X]
          [--final-only]
        | watch [ID...] | completion bash|zsh

The modules:

- `cli`: the command line (pure: the parser, `KEY=VALUE` parameters, the send words, the
  target) and the requests it builds;
- `render`: what is printed (pure: table rows, answer and event lines, the `--json` objects,
  the counts of a send's live summary);
- `live`: the live one-line summary of a send on a terminal, redrawn in place;
- `completion`: the bash and zsh completion scripts, written from the parser;
- `errors`: the exit statuses and what each failure tells the operator to check (pure);
- `connect`: the grpclib channel (plaintext, or TLS with an optional client certificate);
- `commands`: the four calls over the typed grpclib stub;
- `__main__`: `main()`, the console script.

Low-volume tooling: grpclib and the typed management API (betterproto2 dataclasses and their
grpclib stub in `protos/typed/`, docs/dev/protos.md), where ergonomics matter more than codec
speed; the gateway itself serves with the upb classes. No grpcio needed.
"""
