"""The management messages in upb (`protos.yuzu.*_pb2`) and betterproto2 (`protos.typed`):
`python -m tests.bench.typed_codec [--repeat N] [--json]`.

Workload: what `yuzu-gw-ctl` moves, at the sizes it moves them: a ListAgentsResponse page of
500 agent summaries (platform, timestamps), a SendCommandResponse (an answer with 200 bytes of
output and an error's metadata), a SendCommandRequest (one command, 4 parameters, 10 ids).
Both codecs encode the same content; the bench checks that each decodes the other's bytes to
the same content first (so the numbers compare like with like), then times encode and decode
(best of `--repeat` runs of a fixed count, process CPU time) and reports the ratio
betterproto2 / upb, and the size of each generated package on disk.

No target: the operator CLI sends a handful of messages per command; the ratios say why the
agent and upstream paths stay on upb (docs/dev/protos.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from protos.typed.yuzu.agent.v1 import (
    CommandRequest,
    CommandResponse,
    CommandResponseStatus,
)
from protos.typed.yuzu.common.v1 import ErrorDetail, Platform, Timestamp
from protos.typed.yuzu.server.v1 import (
    AgentSummary,
    ListAgentsResponse,
    SendCommandRequest,
    SendCommandResponse,
)
from protos.yuzu.agent.v1 import agent_pb2
from protos.yuzu.common.v1 import common_pb2
from protos.yuzu.server.v1 import management_pb2

ROOT = Path(__file__).resolve().parents[2]
PAGE = 500


def upb_messages() -> dict[str, Any]:
    page = management_pb2.ListAgentsResponse(next_cursor="agent-0500")
    for n in range(PAGE):
        page.agents.add(
            agent_id=f"agent-{n:04d}",
            hostname=f"host-{n:04d}.example.com",
            platform=common_pb2.Platform(os="linux", arch="x86_64", version="6.1"),
            agent_version="1.2.3",
            online=True,
            last_seen=common_pb2.Timestamp(millis_epoch=1767323045678 + n),
        )
    answer = management_pb2.SendCommandResponse(agent_id="agent-0001")
    answer.response.command_id = "c1"
    answer.response.status = agent_pb2.CommandResponse.FAILURE
    answer.response.output = "x" * 200
    answer.response.exit_code = 2
    answer.response.error.code = "E5"
    answer.response.error.message = "failed"
    answer.response.error.metadata.update({"k": "v", "path": "/etc/x"})
    request = management_pb2.SendCommandRequest(
        agent_ids=[f"agent-{n:04d}" for n in range(10)], timeout_seconds=30
    )
    request.command.command_id = "c1"
    request.command.plugin, request.command.action = "os", "info"
    request.command.parameters.update({f"p{n}": f"value-{n}" for n in range(4)})
    return {"list_page": page, "answer": answer, "request": request}


def typed_messages() -> dict[str, Any]:
    page = ListAgentsResponse(
        next_cursor="agent-0500",
        agents=[
            AgentSummary(
                agent_id=f"agent-{n:04d}",
                hostname=f"host-{n:04d}.example.com",
                platform=Platform(os="linux", arch="x86_64", version="6.1"),
                agent_version="1.2.3",
                online=True,
                last_seen=Timestamp(millis_epoch=1767323045678 + n),
            )
            for n in range(PAGE)
        ],
    )
    answer = SendCommandResponse(
        agent_id="agent-0001",
        response=CommandResponse(
            command_id="c1",
            status=CommandResponseStatus.FAILURE,
            output="x" * 200,
            exit_code=2,
            error=ErrorDetail(code="E5", message="failed", metadata={"k": "v", "path": "/etc/x"}),
        ),
    )
    request = SendCommandRequest(
        agent_ids=[f"agent-{n:04d}" for n in range(10)],
        timeout_seconds=30,
        command=CommandRequest(
            command_id="c1",
            plugin="os",
            action="info",
            parameters={f"p{n}": f"value-{n}" for n in range(4)},
        ),
    )
    return {"list_page": page, "answer": answer, "request": request}


def best(fn: Callable[[], object], count: int, repeat: int) -> float:
    """Best CPU seconds per call over `repeat` runs of `count` calls."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(count):
            fn()
        times.append((time.process_time() - start) / count)
    return min(times)


def package_bytes(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.typed_codec")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    upb, typed = upb_messages(), typed_messages()
    rows = []
    for name in upb:
        wire = upb[name].SerializeToString()
        # Same content both ways (map order aside, encodings may differ byte for byte).
        assert type(upb[name]).FromString(bytes(typed[name])) == upb[name], name
        assert type(typed[name]).FromString(wire) == typed[name], name
        count = 20 if name == "list_page" else 2000
        upb_cls, typed_cls = type(upb[name]), type(typed[name])
        row = {
            "message": name,
            "bytes": len(wire),
            "upb_encode_us": best(upb[name].SerializeToString, count, args.repeat) * 1e6,
            "typed_encode_us": best(typed[name].SerializeToString, count, args.repeat) * 1e6,
            "upb_decode_us": best(functools.partial(upb_cls.FromString, wire), count, args.repeat)
            * 1e6,
            "typed_decode_us": best(
                functools.partial(typed_cls.FromString, wire), count, args.repeat
            )
            * 1e6,
        }
        row["encode_ratio"] = row["typed_encode_us"] / row["upb_encode_us"]
        row["decode_ratio"] = row["typed_decode_us"] / row["upb_decode_us"]
        rows.append(row)
    sizes = {
        "upb_management_modules_bytes": package_bytes(
            sorted((ROOT / "protos/yuzu").glob("*/v1/*_pb2.py*"))
            + sorted((ROOT / "protos/yuzu").glob("*/v1/*_grpc.py"))
        ),
        "typed_package_bytes": package_bytes(
            [p for p in (ROOT / "protos/typed").rglob("*.py") if "__pycache__" not in p.parts]
        ),
    }
    if args.json:
        print(json.dumps({"rows": rows, "sizes": sizes}, indent=2))
        return 0
    print(
        f"{'message':<10} {'bytes':>6} {'upb enc':>9} {'bp2 enc':>9} {'x':>6}"
        f" {'upb dec':>9} {'bp2 dec':>9} {'x':>6}   (microseconds of CPU per message)"
    )
    for r in rows:
        print(
            f"{r['message']:<10} {r['bytes']:>6} {r['upb_encode_us']:>9.1f}"
            f" {r['typed_encode_us']:>9.1f} {r['encode_ratio']:>6.0f}"
            f" {r['upb_decode_us']:>9.1f} {r['typed_decode_us']:>9.1f} {r['decode_ratio']:>6.0f}"
        )
    for name, size in sizes.items():
        print(f"{name}: {size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
