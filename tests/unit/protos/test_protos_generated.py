"""The committed generated code is exactly what the .proto sources produce."""

from __future__ import annotations

from protos import generate


def test_sources_found() -> None:
    names = sorted(p.relative_to(generate.REPO_ROOT).as_posix() for p in generate.proto_sources())
    assert names == [
        "protos/yuzu/agent/v1/agent.proto",
        "protos/yuzu/common/v1/common.proto",
        "protos/yuzu/gateway/v1/gateway.proto",
        "protos/yuzu/server/v1/management.proto",
    ]


def test_committed_generated_code_is_up_to_date() -> None:
    problems = generate.check()
    assert problems == [], (
        "generated code differs from the sources; run `python -m protos.generate`:\n"
        + "\n".join(problems)
    )


def test_check_reports_a_stale_file(monkeypatch, tmp_path) -> None:
    """The check notices an edited generated file (run against a copy of the tree)."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(
        generate.PROTOS_DIR, copy / "protos", ignore=shutil.ignore_patterns("__pycache__")
    )
    stale = copy / "protos/yuzu/common/v1/common_pb2.py"
    stale.write_text(stale.read_text() + "# edited by hand\n")
    (copy / "protos/yuzu/server/v1/management_grpc.py").unlink()
    (copy / "protos/yuzu/server/v1/orphan_pb2.py").write_text("")
    monkeypatch.setattr(generate, "REPO_ROOT", copy)
    monkeypatch.setattr(generate, "PROTOS_DIR", copy / "protos")
    problems = generate.check()
    assert problems == [
        "protos/yuzu/common/v1/common_pb2.py: differs from what the sources produce",
        "protos/yuzu/server/v1/management_grpc.py: missing",
        "protos/yuzu/server/v1/orphan_pb2.py: no source produces it any more",
    ]


def test_check_covers_the_typed_package(monkeypatch, tmp_path) -> None:
    """Every file of protos/typed/ is generated: an edit or a stray file there is reported."""
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(
        generate.PROTOS_DIR, copy / "protos", ignore=shutil.ignore_patterns("__pycache__")
    )
    typed = copy / generate.TYPED_DIR
    edited = typed / "yuzu/server/v1/__init__.py"
    edited.write_text(edited.read_text().replace("class ManagementServiceStub", "class Renamed"))
    (typed / "yuzu/extra.py").write_text("")
    monkeypatch.setattr(generate, "REPO_ROOT", copy)
    monkeypatch.setattr(generate, "PROTOS_DIR", copy / "protos")
    assert generate.check() == [
        "protos/typed/yuzu/server/v1/__init__.py: differs from what the sources produce",
        "protos/typed/yuzu/extra.py: no source produces it any more",
    ]
