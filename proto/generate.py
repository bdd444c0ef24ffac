"""Compile ``proto/*.proto`` into ``proto/*_pb2.py`` with grpcio-tools' protoc.

Run ``make proto`` (or ``python -m proto.generate``) after editing a .proto file; a test
regenerates into a temporary directory and fails if the checked-in output is stale.
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
ROOT = PROTO_DIR.parent


def proto_files() -> list[Path]:
    return sorted(PROTO_DIR.glob("*.proto"))


def generate(out_root: Path = ROOT) -> list[Path]:
    """Write generated modules under ``out_root/proto`` and return their paths."""
    from grpc_tools import protoc

    (out_root / "proto").mkdir(parents=True, exist_ok=True)
    well_known = resources.files("grpc_tools") / "_proto"
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        *(str(p.relative_to(ROOT)) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    return sorted((out_root / "proto").glob("*_pb2.py*"))


if __name__ == "__main__":
    for path in generate():
        print(path.relative_to(ROOT))
    sys.exit(0)
