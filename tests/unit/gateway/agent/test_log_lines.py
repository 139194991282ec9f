"""Every operator log line the specification quotes (SPEC_INDEX section 8; issue 10 §4) has a
test that triggers its condition and finds the line with its level, and its rate limit where
the seed gives one.

`LINES` maps each line id to the tests that do so: most live beside the feature they belong to
(the pure core's or the actor's own tests), the rest are here or in
tests/integration/test_log_lines.py (lines only a node's request processes write). The server's
and the agent's lines that the section quotes for correlation are in `NOT_THE_GATEWAY`. Two
tests keep the table whole: every id of section 8 has an entry, and every entry names a test
that exists.

The warn-limited lines end with the seed's suffix, which one function writes
(actors/core/warn_limit.py); a test fails when the words appear anywhere else in the code.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from actors.core.warn_limit import SUPPRESSED_SUFFIX, WarnLimiter
from gateway.agent.plane import AgentPlane, guarded
from gateway.agent.register import _session_peer
from tests.support.actors import Harness, actor_test
from tests.unit.actors.upstream.test_upstream_actor import LOGGER, failing_register, messages, start

ROOT = Path(__file__).resolve().parents[4]
SPEC_INDEX = ROOT.parent / "shared" / "design" / "SPEC_INDEX.md"
HERE = "tests/unit/gateway/agent/test_log_lines.py"
NODE = "tests/integration/test_log_lines.py"

# Line id -> the tests that trigger it and find it ("path::test").
LINES: dict[str, tuple[str, ...]] = {
    "L01": (
        "tests/unit/actors/core/test_heartbeat_buffer.py::test_a_one_chunk_flush_logs_at_debug_and_an_empty_one_not_at_all",
        "tests/unit/actors/core/test_heartbeat_buffer.py::test_chunks_stay_under_3_mib_oldest_first_at_most_8_per_cycle",
    ),
    "L02": (
        "tests/unit/gateway/agent/test_admission_summary.py::test_first_rejection_then_at_most_one_line_per_interval",
        "tests/integration/test_agent_plane.py::test_heartbeat_admission_binds_the_session_to_its_connection",
    ),
    "L03": (
        "tests/integration/test_agent_plane.py::test_heartbeat_admission_binds_the_session_to_its_connection",
    ),
    "L04": (f"{NODE}::test_l04_an_inventory_refused_before_forwarding_is_warn_limited",),
    "L05": (
        "tests/supervision/test_agent_owner.py::test_owner_registers_writes_its_row_and_announces_once",
    ),
    "L06": (
        "tests/unit/actors/core/test_notify_store.py::test_refusal_warns_with_the_seeds_line_and_is_resent_after_one_to_three_seconds",
        "tests/unit/actors/upstream/test_upstream_notify.py::test_acknowledged_false_goes_to_the_resends_while_the_session_is_held",
    ),
    "L07": (
        "tests/unit/actors/core/test_breaker.py::test_five_consecutive_failures_open_it_with_the_seed_line",
        "tests/unit/actors/upstream/test_upstream_actor.py::test_five_failures_open_it_and_calls_are_refused_without_reaching_the_channel",
    ),
    "L08": (
        "tests/unit/actors/core/test_breaker.py::test_half_open_after_the_reset_timeout_then_probe_success_closes",
        "tests/unit/actors/upstream/test_upstream_actor.py::test_the_reset_timeout_passes_and_a_probe_closes_it",
    ),
    "L09": (
        "tests/unit/actors/core/test_breaker.py::test_failed_probes_double_up_to_the_cap_and_success_resets",
        "tests/unit/actors/upstream/test_upstream_actor.py::test_a_failed_probe_reopens_with_a_doubled_reset_timeout",
    ),
    "L10": (
        "tests/unit/actors/upstream/test_upstream_notify.py::test_a_failed_send_is_requeued_and_feeds_the_breaker",
    ),
    "L11": (
        "tests/unit/actors/core/test_notify_store.py::test_an_unencodable_probe_is_evicted_with_the_seeds_warning",
    ),
    # L12 and L13 are one line here: the probe is killed at its deadline, never otherwise.
    "L12": (
        "tests/unit/actors/upstream/test_upstream_notify.py::test_a_probe_past_its_deadline_is_killed_and_counts_as_a_failed_probe",
    ),
    "L13": (
        "tests/unit/actors/upstream/test_upstream_notify.py::test_a_probe_past_its_deadline_is_killed_and_counts_as_a_failed_probe",
    ),
    "L14": (
        f"{HERE}::test_l14_raised_lines_are_warn_limited_with_the_suffix",
        "tests/unit/actors/upstream/test_upstream_actor.py::test_an_exception_out_of_the_channel_is_a_failure_named_by_class_only",
    ),
    "L15": (
        "tests/unit/actors/upstream/test_upstream_actor.py::test_neutral_statuses_never_move_it",
    ),
    "L16": (f"{NODE}::test_l16_upstream_register_failed_is_warn_limited",),
    # The seed's signature of an encoder that fails every request: INTERNAL and the L14 line.
    "L17": (f"{NODE}::test_l17_an_unencodable_register_is_internal_with_the_raised_line",),
    "L18": (f"{NODE}::test_l18_upstream_report_inventory_failed_is_warn_limited",),
    "L19": ("tests/integration/test_agent_plane.py::test_the_agent_id_is_checked_first",),
    "L20": (f"{HERE}::test_l20_a_replaced_peer_address_is_warn_limited",),
    "L21": (
        "tests/supervision/test_registry.py::test_an_older_register_committing_late_is_superseded",
    ),
    "L22": (
        "tests/unit/actors/core/test_replay_queue.py::test_a_verdict_queues_the_held_sessions_and_counts_the_rest",
        "tests/unit/actors/upstream/test_replay_lane.py::test_a_verdict_replays_the_named_sessions_it_holds_and_announces_them_again",
    ),
    "L23": (
        "tests/unit/actors/upstream/test_replay_lane.py::test_a_verdict_replays_the_named_sessions_it_holds_and_announces_them_again",
    ),
    "L24": (
        "tests/unit/actors/core/test_replay_queue.py::test_a_verdict_while_the_breaker_is_open_is_dropped_whole",
    ),
    "L25": (
        "tests/unit/actors/core/test_replay_queue.py::test_half_the_batch_and_the_threshold_start_a_full_replay",
        "tests/integration/test_server_restart.py::test_a_server_restart_with_200_agents_recovers_every_agent_without_a_reconnect",
    ),
    "L26": (
        "tests/unit/actors/core/test_replay_queue.py::test_a_walk_with_the_registry_unavailable_is_aborted",
        "tests/unit/actors/upstream/test_replay_lane.py::test_a_walk_whose_registry_went_away_is_aborted",
    ),
    "L27": (
        "tests/unit/actors/upstream/test_replay_lane.py::test_accepted_false_ends_only_that_owner_and_announces_nothing",
        "tests/integration/test_server_restart.py::test_accepted_false_on_a_replay_disconnects_only_that_agent",
    ),
    "L28": (
        "tests/unit/actors/upstream/test_replay_lane.py::test_superseded_ends_the_owner_and_counts_as_a_success_for_the_breaker",
    ),
    "L29": (
        "tests/unit/actors/core/test_verdicts.py::test_ids_are_kept_by_length_only_deduplicated_and_sorted",
    ),
    "L30": (
        "tests/unit/actors/core/test_verdicts.py::test_4100_listed_ids_pass_4096_and_the_rest_are_counted_nowhere",
        "tests/unit/actors/core/test_verdicts.py::test_a_restarted_reader_warns_again_with_suppressed_zero",
    ),
    "L31": (
        "tests/unit/actors/core/test_notify_store.py::test_planned_stop_flushes_everything_64_at_a_time_whatever_the_breaker",
        "tests/integration/test_planned_stop.py::test_a_frozen_server_stop_ends_within_the_budget_and_counts_the_rest_lost",
    ),
    "L32": (
        "tests/integration/test_owner_recovery.py::test_a_crash_loop_gives_up_on_the_fourth_restart",
    ),
    "L33": (
        "tests/unit/actors/core/test_permits.py::test_sizing_logs_and_warns",
        "tests/unit/actors/upstream/test_regulator_actor.py::test_the_server_stream_limit_sizes_the_pools_with_the_log_lines",
    ),
    "L34": (
        "tests/unit/actors/core/test_permits.py::test_sizing_logs_and_warns",
        "tests/unit/actors/upstream/test_regulator_actor.py::test_the_server_stream_limit_sizes_the_pools_with_the_log_lines",
    ),
    # The boot refusals: the refusal's text, and the one CRITICAL line every refusal is.
    "L35": (
        "tests/unit/gateway/config/test_upstream_client_config.py::test_unverified_https_is_refused",
        "tests/unit/gateway/config/test_config_refusal.py::test_the_log_line_is_one_critical_line",
    ),
    "L36": (
        "tests/unit/gateway/config/test_upstream_client_config.py::test_a_directory_where_a_tls_file_belongs_refuses_boot",
        "tests/unit/gateway/config/test_config_refusal.py::test_the_log_line_is_one_critical_line",
    ),
    "L37": (
        "tests/unit/gateway/config/test_upstream_client_config.py::test_mixed_endpoints_text_is_the_seeds",
        "tests/unit/gateway/config/test_config_refusal.py::test_the_log_line_is_one_critical_line",
    ),
    "L38": (
        "tests/unit/gateway/config/test_config_schema.py::test_upstream_address_variables_have_no_effect",
    ),
    "L39": (
        "tests/unit/gateway/config/test_upstream_client_config.py::test_missing_empty_or_pem_less_files_warn_once_each_and_boot",
        "tests/integration/test_upstream_channel.py::test_a_missing_ca_file_warns_fails_tls_and_recovers",
    ),
    "L40": (
        "tests/integration/test_upstream_channel.py::test_a_missing_ca_file_warns_fails_tls_and_recovers",
    ),
    "L41": (
        "tests/unit/gateway/config/test_upstream_client_config.py::test_the_seeds_example_line_word_for_word",
    ),
    "L42": (
        "tests/unit/gateway/config/test_mgmt_auth_boot.py::test_the_identity_is_derived_from_a_single_certificate_cacertfile",
    ),
    "L43": (
        "tests/unit/gateway/config/test_mgmt_auth_boot.py::test_the_deny_list_line_shows_at_most_twenty",
    ),
    "L44": (
        "tests/unit/gateway/config/test_shedder_config.py::test_marks_that_cannot_work_refuse",
        "tests/integration/test_memory_shedding.py::test_marks_that_cannot_work_refuse_the_boot",
    ),
    "L45": (
        "tests/unit/actors/memory/test_shedder_actor.py::test_an_unknown_limit_with_fractions_is_inactive",
    ),
    "L46": (
        "tests/unit/actors/core/test_shedder_marks.py::test_a_failing_resume_logs_first_then_once_a_minute_then_the_success",
        "tests/unit/actors/memory/test_shedder_actor.py::test_a_resume_that_fails_is_retried_counted_and_logged",
    ),
    "L47": (
        "tests/unit/actors/memory/test_reclaim.py::test_without_malloc_trim_one_notice_and_garbage_collection_only",
    ),
    "L48": (
        "tests/unit/actors/memory/test_reclaim.py::test_a_drop_runs_a_pass_then_a_followup_with_one_line_each",
    ),
    "L49": (
        "tests/unit/gateway/config/test_shedder_config.py::test_bad_reclaim_entries_warn_and_take_their_defaults",
    ),
    "L50": (
        "tests/unit/gateway/config/test_config_schema.py::test_cluster_id_variable_with_bytes_that_are_not_utf8_refuses",
    ),
    "L51": (
        "tests/unit/gateway/config/test_config_schema.py::test_cluster_id_from_the_file_refuses_without_the_value",
        "tests/unit/gateway/config/test_config_schema.py::test_cluster_id_variable_with_bytes_that_are_not_utf8_refuses",
    ),
    "L52": (
        f"{HERE}::test_l52_a_handler_crash_is_one_error_line_with_class_and_top_frame",
        "tests/integration/test_agent_plane.py::test_subscribe_while_agent_sup_is_down_is_internal_with_one_line",
    ),
    # The seed's safe-call sites: the registry call of Register, and the router of SendCommand.
    "L53": (
        f"{NODE}::test_l53_a_register_with_the_registry_down_names_only_the_class",
        "tests/integration/test_management_plane.py::test_router_killed_during_a_command",
    ),
}

# Quoted so an operator can correlate; written by the server or the agent, never the gateway.
NOT_THE_GATEWAY: dict[str, str] = {
    "L54": "the server's BatchHeartbeat debug line",
    "L55": "the server's GatewayRouteStore lease guard",
    "L56": "the server's ProxyInventory line",
    "L57": "the server's adoption and ProxyRegister lines",
    "L58": "the server's gRPC receive limit",
    "L59": "the server's migration v5",
    "L60": "the server's migration failure lines",
    "L61": "the agent's heartbeat thread lines",
}

SEED_SUFFIX = "(N similar line(s) suppressed since the last)"


def section_8_ids() -> list[str]:
    if not SPEC_INDEX.is_file():
        pytest.skip(f"{SPEC_INDEX} is not on this machine")
    text = SPEC_INDEX.read_text(encoding="utf-8")
    section = text.split("\n## 8.", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| (L\d+) \|", section, re.MULTILINE)


def test_every_line_of_section_8_has_an_entry() -> None:
    ids = set(section_8_ids())
    entries = set(LINES) | set(NOT_THE_GATEWAY)
    assert ids, "section 8 was not found or not parsed"
    assert sorted(ids - entries) == [], "section 8 lines with no test"
    assert sorted(entries - ids) == [], "entries for ids section 8 no longer has"
    assert set(LINES).isdisjoint(NOT_THE_GATEWAY)


def test_every_entry_names_a_test_that_exists() -> None:
    missing = []
    for line_id, refs in LINES.items():
        assert refs, line_id
        for ref in refs:
            path, _, name = ref.partition("::")
            tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
            defined = {
                node.name
                for node in ast.walk(tree)
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            if name not in defined:
                missing.append(f"{line_id}: {ref}")
    assert missing == []


def test_the_suppressed_suffix_is_the_seeds_word_for_word() -> None:
    assert SUPPRESSED_SUFFIX.format(n="N") == " " + SEED_SUFFIX
    limiter = WarnLimiter()
    assert limiter.admit("kind", 0.0) == ""  # the first line of a kind is never held
    assert limiter.admit("kind", 0.5) is None
    assert limiter.admit("kind", 1.0) == " " + SEED_SUFFIX.replace("N", "1", 1)


def test_the_suffix_is_written_in_one_place_only() -> None:
    """Every limited line takes its suffix from WarnLimiter.admit, never from a copy."""
    writers = [
        path.relative_to(ROOT).as_posix()
        for top in ("gateway", "actors", "supervisors")
        for path in sorted((ROOT / top).rglob("*.py"))
        if "similar line(s) suppressed" in path.read_text(encoding="utf-8")
    ]
    assert writers == ["actors/core/warn_limit.py"]


@actor_test
async def test_l14_raised_lines_are_warn_limited_with_the_suffix(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    actors, channel = start(h)
    upstream = h.instance(actors.upstream)
    upstream.limiter = WarnLimiter(interval_s=0.5)  # the seed's rule, at a test's pace

    def explode(_request: object) -> None:
        raise KeyError("enrolment-token-secret")

    channel.set_rule("ProxyRegister", explode)
    for _ in range(3):  # below the breaker's threshold of 5
        await failing_register(h, actors)
    await h.settle()
    await asyncio.sleep(0.55)
    await failing_register(h, actors)
    await h.settle()
    raised = [(level, m) for level, m in messages(caplog) if " raised " in m]
    line = "Upstream RPC ProxyRegister raised exception:KeyError"
    assert raised == [
        (logging.WARNING, line),
        (logging.WARNING, line + " (2 similar line(s) suppressed since the last)"),
    ]
    assert "secret" not in caplog.text


def test_l20_a_replaced_peer_address_is_warn_limited(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="yuzu_gw.agent")
    clock = [100.0]
    runtime = SimpleNamespace(loop=SimpleNamespace(time=lambda: clock[0]))
    plane = AgentPlane(cast(Any, runtime), cast(Any, None), cast(Any, None), cast(Any, None))
    too_long = "2001:db8::" + "f" * 290  # 300 bytes: cut to the 255 a session keeps
    assert _session_peer(plane, "agent-1", "10.0.0.9") == "10.0.0.9"  # kept: no line
    for _ in range(3):
        assert len(_session_peer(plane, "agent-1", too_long).encode()) <= 255
    clock[0] += 1.0
    _session_peer(plane, "agent-1", too_long)
    line = (
        "Register from agent agent-1: the peer address was replaced or cut to fit"
        " (original size 300 bytes)"
    )
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.WARNING, line),
        (logging.WARNING, line + " (2 similar line(s) suppressed since the last)"),
    ]


def test_l52_a_handler_crash_is_one_error_line_with_class_and_top_frame(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="yuzu_gw.agent")

    @guarded("Subscribe")
    async def handler(_self: object, _stream: object) -> None:
        raise KeyError("enrolment-token-secret")

    with pytest.raises(GRPCError) as caught:
        asyncio.run(handler(None, cast(Any, None)))
    assert caught.value.status is Status.INTERNAL
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert re.fullmatch(
        r"Subscribe failed: KeyError at test_log_lines\.py:\d+ in handler", record.getMessage()
    )
    assert "secret" not in caplog.text
