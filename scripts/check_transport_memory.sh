#!/bin/sh
# The C transport (mqttbroker/server/_streams.c) under AddressSanitizer and valgrind: its tests,
# with real sockets, run twice.
#
# 1. AddressSanitizer: _streams.c is built on its own with -fsanitize=address into a temporary
#    folder and loaded in place of the installed build (scripts/streams_override.py, a pytest
#    plugin); the Python process runs with libasan preloaded (it is not built with it) and
#    PYTHONMALLOC=malloc, so that objects and buffers come from the malloc ASan watches, not
#    from pymalloc's arenas. Leak detection is off: the interpreter frees little at exit.
# 2. valgrind (memcheck) on the installed build (loaded by the same plugin, which stops the run
#    if the C transport would not run: the compiled form stale, say), also with
#    PYTHONMALLOC=malloc (pymalloc's reads of its own arenas look like errors to valgrind);
#    --error-exitcode=1, no leak check, CPython's own reports suppressed
#    (scripts/valgrind-python.supp: none in the transport).
#
# Either failing fails the script. It needs the compiled form installed and current
# (python setup.py build_ext --inplace, or pip install -e .), gcc with libasan, OpenSSL's headers
# (libssl-dev: TLS in the transport is checked too), and valgrind.
# Arguments: the tests to run (default: the C transport's own, below). Not a benchmark: the
# valgrind run takes minutes. Usage: scripts/check_transport_memory.sh [pytest arguments]
set -eu
cd "$(dirname "$0")/.."
# The interpreter itself, not a wrapper script (pyenv's shims are): valgrind runs the program
# it is given, and only that.
PYTHON=$("${PYTHON:-python}" -c 'import sys; print(sys.executable)')
CC=${CC:-gcc}
if [ $# -eq 0 ]; then
    set -- tests/transports/test_streams.py tests/transports/test_half_closed_clients.py \
        tests/transports/test_tls_layer.py
fi

mode=$("$PYTHON" -c 'import mqttbroker.compiled as c, mqttbroker.broker.core, mqttbroker.server.streams as s; print("ok" if s.available() else f"{c.mode}: {c.reason}")')
if [ "$mode" != ok ]; then
    echo "check_transport_memory: the C transport does not run ($mode)" >&2
    exit 2
fi
command -v valgrind >/dev/null || { echo "check_transport_memory: valgrind is not installed" >&2; exit 2; }
libasan=$("$CC" -print-file-name=libasan.so)
[ -e "$libasan" ] || { echo "check_transport_memory: $CC has no libasan.so" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')

echo "== AddressSanitizer: $*"
"$CC" -shared -fPIC -g -O1 -fno-omit-frame-pointer -fsanitize=address -Wall -Wextra -Werror \
    -DMQTTBROKER_TLS=1 -I"$include" mqttbroker/server/_streams.c -o "$work/_streams_asan.so" \
    -lssl -lcrypto
LD_PRELOAD="$libasan" \
    ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=99 \
    PYTHONMALLOC=malloc \
    MQTTBROKER_STREAMS_SO="$work/_streams_asan.so" \
    PYTHONPATH="scripts${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -m pytest -p streams_override -p no:cacheprovider -q "$@"

# This test lowers RLIMIT_NOFILE and restores it; valgrind keeps descriptors of its own above
# the limit and handles setrlimit on it itself, and under it the client is not accepted after
# the restore (the first failure is logged, no retry succeeds). It runs under AddressSanitizer.
rlimit_test=tests/transports/test_streams.py::test_accepting_pauses_when_descriptors_run_out_and_resumes
echo "== valgrind: $*"
installed=$("$PYTHON" -c 'import mqttbroker.server._streams as m; print(m.__file__)')
PYTHONMALLOC=malloc MQTTBROKER_STREAMS_SO="$installed" \
    PYTHONPATH="scripts${PYTHONPATH:+:$PYTHONPATH}" \
    valgrind --quiet --error-exitcode=1 --leak-check=no --track-origins=yes \
    --suppressions=scripts/valgrind-python.supp \
    "$PYTHON" -m pytest -p streams_override -p no:cacheprovider -q \
    --deselect "$rlimit_test" "$@"

echo "check_transport_memory: no error found"
