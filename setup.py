"""Compiles the broker's hot path with mypyc (see mqttbroker/compiled.py); everything else about
the package is in pyproject.toml.

The modules listed in ``mqttbroker.compiled.MODULES`` are compiled from their unchanged source,
and the SHA-256 (with size and modification time) of each is recorded in ``mqttbroker/compiled.sha256``, so that the package loads
the compiled form only while it matches the source beside it. ``MQTTBROKER_COMPILE=0`` installs
the pure-Python package only; so does a machine without a C compiler (the build falls back).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from mqttbroker import compiled  # noqa: E402  (the list of modules and the digest format)

GROUP = compiled.SHARED_LIBRARY.removesuffix("__mypyc")


class OptionalBuildExt(build_ext):
    """A failed compilation leaves the pure-Python package, with a warning, not a failed install.

    The digests of the sources are written next to the package only once every extension is
    built; before that any older digest file there is removed. So a build that fails, in part
    or whole, can never make older machine code pass for the current source."""

    def run(self) -> None:
        self.failed = False
        package = ROOT / "mqttbroker" if self.inplace else Path(self.build_lib) / "mqttbroker"
        record = package / compiled.DIGESTS
        record.unlink(missing_ok=True)
        for path in compiled.leftover_shims(package):
            print(f"removing {path}: that module is no longer compiled", file=sys.stderr)
            path.unlink()
        try:
            super().run()
        except Exception as exc:  # no compiler, missing headers...
            print(f"warning: mqttbroker's hot path was not compiled ({exc})", file=sys.stderr)
            self.failed = True
        if self.failed or not self.extensions:
            print("warning: the pure-Python modules will be used", file=sys.stderr)
            return
        package.mkdir(parents=True, exist_ok=True)
        record.write_text(compiled.record())

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: {ext.name} was not compiled ({exc})", file=sys.stderr)
            self.failed = True


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
    # The broker's own TCP transport (epoll: Linux only; see mqttbroker/server/streams.py).
    native = [
        Extension(module, [str(compiled.native_source(module).relative_to(ROOT))])
        for module in compiled.NATIVE
        if sys.platform == "linux"
    ]
    try:
        return native + mypycify(
            [str(path.relative_to(ROOT)) for path in paths], group_name=GROUP, opt_level="3"
        )
    except SystemExit:  # mypyc found an error it will not compile (a newer mypy, say)
        print(
            "warning: mypyc refused the hot path; installing the pure-Python modules",
            file=sys.stderr,
        )
        return []


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
