"""Compiles the broker's hot path with mypyc (see mqttbroker/compiled.py); everything else about
the package is in pyproject.toml.

The modules listed in ``mqttbroker.compiled.MODULES`` are compiled from their unchanged source,
and the SHA-256 of each is recorded in ``mqttbroker/compiled.sha256``, so that the package loads
the compiled form only while it matches the source beside it. ``MQTTBROKER_COMPILE=0`` installs
the pure-Python package only; so does a machine without a C compiler (the build falls back).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from mqttbroker import compiled  # noqa: E402  (the list of modules and the digest format)

GROUP = compiled.SHARED_LIBRARY.removesuffix("__mypyc")


class OptionalBuildExt(build_ext):
    """A failed compilation leaves the pure-Python package, with a warning, not a failed install."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler, missing headers...
            print(
                f"warning: mqttbroker's hot path was not compiled ({exc}); "
                "the pure-Python modules will be used",
                file=sys.stderr,
            )

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: {ext.name} was not compiled ({exc})", file=sys.stderr)


def extensions() -> list:  # type: ignore[type-arg]
    if os.environ.get("MQTTBROKER_COMPILE", "1") == "0":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        print(
            "warning: mypyc is not available; installing the pure-Python modules", file=sys.stderr
        )
        return []
    paths = [compiled.source_path(name) for name in compiled.MODULES]
    lines = [f"{digest}  {name}" for name, digest in compiled.digests(paths).items()]
    (ROOT / "mqttbroker" / compiled.DIGESTS).write_text("\n".join(lines) + "\n")
    return mypycify(
        [str(path.relative_to(ROOT)) for path in paths], group_name=GROUP, opt_level="3"
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
