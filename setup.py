"""Compiles the broker's hot path with mypyc and builds its C TCP transport (see
mqttbroker/compiled.py); everything else about the package is in pyproject.toml.

The modules listed in ``mqttbroker.compiled.MODULES`` are compiled from their unchanged source,
and the C transport (``mqttbroker.compiled.NATIVE``, Linux) is built as an extension of its
own. Once both are built, the SHA-256 (with size and modification time) of each source is
recorded in ``mqttbroker/compiled.sha256``, so that the package loads the compiled form only
while it matches the source beside it.

The build is the same wherever it runs, pip's isolated build environment included: mypyc's
mypy reads a configuration of its own (:func:`mypy_config`) in which the third-party packages
the broker imports are never read, installed or not, so no optional package can change it.

What is built, and what happens when that fails:

* a C compiler and the Python headers are there: everything is compiled, or the install fails
  with the compiler's or mypyc's own message and what to do about it (:data:`REMEDY`;
  ``MQTTBROKER_COMPILE=0`` installs the pure form on purpose);
* no C compiler or no Python headers, or ``MQTTBROKER_COMPILE=0``: the pure-Python package is
  installed, and why is written to ``mqttbroker/compiled.build``, which the broker logs as a
  warning when it starts (``mqttbroker.compiled.select``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError, LinkError

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from mqttbroker import compiled  # noqa: E402  (the list of modules and the digest format)

GROUP = compiled.SHARED_LIBRARY.removesuffix("__mypyc")
# The end of every message of a build that fails: what to do about it.
REMEDY = (
    "Fix the C compiler (Debian: apt-get install gcc python3-dev) and install again, or set "
    "MQTTBROKER_COMPILE=0 to install the pure-Python form, several times slower."
)


class BuildExt(build_ext):
    """Builds every extension or fails; the digests of the sources are written next to the
    package only once every extension is built, and any older digest file there is removed
    first. So a build that fails, in part or whole, can never make older machine code pass for
    the current source."""

    def run(self) -> None:
        package = ROOT / "mqttbroker" if self.inplace else Path(self.build_lib) / "mqttbroker"
        record = package / compiled.DIGESTS
        record.unlink(missing_ok=True)
        for path in compiled.leftover_shims(package):
            print(f"removing {path}: that module is no longer compiled", file=sys.stderr)
            path.unlink()
        try:
            super().run()
        except (CompileError, LinkError) as error:  # the compiler's own output is above
            raise SystemExit(
                f"error: mqttbroker's hot path and C transport could not be compiled ({error}). "
                + REMEDY
            ) from None
        package.mkdir(parents=True, exist_ok=True)
        record.write_text(compiled.record())


def mypy_config() -> str:
    """The configuration of the mypy that mypyc runs: not the developers' strict checks
    (pyproject.toml), and none of the third-party packages read, whether pip's build
    environment has them or not. Their types are ``Any`` to the compiled code, which calls
    them only through the Python API anyway."""
    modules = ",".join(f"{name},{name}.*" for name in compiled.UNREAD_IMPORTS)
    return (
        "[mypy]\n"
        "warn_unused_configs = False\n"
        f"[mypy-{modules}]\n"
        "follow_imports = skip\n"
        "follow_imports_for_stubs = True\n"
        "ignore_missing_imports = True\n"
    )


def missing_toolchain() -> str | None:
    """Why nothing can be compiled here, or None: a C compiler and Python.h are needed."""
    command = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    compiler = shlex.split(command)[0] if command.strip() else "cc"
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} is not on PATH)"
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        return f"no Python headers ({include}/Python.h is missing; install python3-dev)"
    return None


def native_extensions() -> list[Extension]:
    """The broker's own TCP transport (epoll: Linux only; see mqttbroker/server/streams.py),
    with TLS in OpenSSL where its headers are (Debian: libssl-dev); without them, TLS listeners
    run the Python TLS layer (server/tlslayer.py)."""
    if sys.platform != "linux":
        return []
    tls = openssl_headers()
    if not tls:
        print(
            "warning: no OpenSSL headers (Debian: apt-get install libssl-dev): TLS listeners "
            "will run the Python TLS layer, not TLS in the C transport",
            file=sys.stderr,
        )
    return [
        Extension(
            module,
            [str(compiled.native_source(module).relative_to(ROOT))],
            define_macros=[("MQTTBROKER_TLS", "1")] if tls else [],
            libraries=["ssl", "crypto"] if tls else [],
        )
        for module in compiled.NATIVE
    ]


def openssl_headers() -> bool:
    """Whether a program including OpenSSL's ssl.h compiles and links against libssl here."""
    command = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "probe.c"
        source.write_text(
            "#include <openssl/ssl.h>\n"
            "int main(void) { return SSL_CTX_new(TLS_server_method()) == NULL; }\n"
        )
        try:
            probe = subprocess.run(
                [*command, str(source), "-o", str(Path(folder) / "probe"), "-lssl", "-lcrypto"],
                capture_output=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    return probe.returncode == 0


def mypyc_extensions() -> list[Extension]:
    from mypyc.build import mypycify  # build-system.requires brings it

    paths = [str(compiled.source_path(name).relative_to(ROOT)) for name in compiled.MODULES]
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "mypyc.ini"
        config.write_text(mypy_config())
        try:
            built = mypycify(
                ["--config-file", str(config), *paths], group_name=GROUP, opt_level="3"
            )
        except SystemExit:  # mypy printed its errors above
            raise SystemExit(
                "error: mypyc could not compile mqttbroker's hot path (mypy's errors are "
                "above). Set MQTTBROKER_COMPILE=0 to install the pure-Python form instead."
            ) from None
    if sys.platform != "win32":  # GCC and Clang
        # The compiled modules are one C file, whose functions call each other directly; without
        # this, each such call goes through the PLT and none is inlined (the shared library's
        # symbols could be replaced at load time), so a small method split out of a class (the
        # delivery path's Output.append, say) would cost a call per delivery.
        for extension in built:
            extension.extra_compile_args.append("-fno-semantic-interposition")
    return built


def extensions() -> list[Extension]:
    """What to build; when nothing, why is written to compiled.build for the broker to log."""
    why = None
    if os.environ.get("MQTTBROKER_COMPILE", "1") == "0":
        why = "MQTTBROKER_COMPILE=0 at install"
    else:
        why = missing_toolchain()
    status = ROOT / "mqttbroker" / compiled.BUILD_STATUS
    if why is not None:
        print(f"warning: mqttbroker installs its pure-Python form: {why}", file=sys.stderr)
        status.write_text(why + "\n")
        return []
    status.unlink(missing_ok=True)
    return native_extensions() + mypyc_extensions()


if __name__ == "__main__":  # pip's build backend and ``python setup.py`` (tests import BuildExt)
    setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
