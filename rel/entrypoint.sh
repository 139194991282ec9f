#!/usr/bin/env bash
# Container entrypoint: the node runs as PID 1 through `exec`, so `docker stop`'s SIGTERM is
# its planned stop. Give the container a stop grace period of 40 s (`stop_grace_period: 40s`,
# seed "Stop timeout coupling"): Docker's default of 10 s kills the node mid-flush.
#
#   docker run ... image                       -> foreground node
#   docker run ... image foreground --nodes auto -> one node per core (docs/multinode.md)
#   docker exec -it CONTAINER rel/yuzu_gw remote_console | ping | eval EXPR | status
#
# Anything else given as the command runs as `rel/yuzu_gw ARGS` (`ping` for a health check).
#
# YUZU_GW_ADVERTISE_ADDR is not computed here, as the Erlang entrypoint did: with vm.args
# `-name yuzu_gw@${YUZU_GW_ADVERTISE_ADDR}` and the variable unset, the node finds the address
# at boot in the same order, in a container or not (docs/cluster.md, "The advertise address").
set -euo pipefail

here=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)
# One node (or one release of N nodes) per container; its run directory is container-local
# unless a volume is mounted.
export YUZU_GW_RUN_DIR=${YUZU_GW_RUN_DIR:-/var/run/yuzu-gateway}

if [[ $# -eq 0 || $1 == foreground ]]; then
    if [[ -z "${YUZU_GW_COOKIE:-}" && ${YUZU_GW_ALLOW_DEFAULT_COOKIE:-} != 1 ]]; then
        # The node refuses to boot (`default_cookie`); say why before it does. A trial
        # container passes YUZU_GW_ALLOW_DEFAULT_COOKIE=1 and gets a cookie of its own.
        echo "entrypoint: YUZU_GW_COOKIE unset: pass it (at least 32 characters, the same" \
            "on every node), or YUZU_GW_ALLOW_DEFAULT_COOKIE=1 for a trial" >&2
    fi
    exec "$here/yuzu_gw" foreground "${@:2}"
fi
exec "$here/yuzu_gw" "$@"
