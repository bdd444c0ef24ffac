"""The checked-in *_pb2 modules must be exactly what protoc makes of the .proto files."""

from __future__ import annotations

from pathlib import Path

from proto.generate import PROTO_DIR, generate, proto_files


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    fresh = {p.name: p.read_bytes() for p in generate(tmp_path)}
    assert len(fresh) == 2 * len(proto_files())
    checked_in = {p.name: p.read_bytes() for p in PROTO_DIR.glob("*_pb2.py*")}
    stale = sorted(n for n in fresh.keys() | checked_in.keys() if fresh.get(n) != checked_in.get(n))
    assert not stale, f"run `make proto`: stale generated files {stale}"
