"""The suite's own bookkeeping: every statement ID a test names exists, and every server/both
statement is either named by a test or explained in UNTESTED.md. No broker needed."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from .conftest import STATEMENT, STATEMENT_311
from .coverage import SPEC, SPEC_311, load_statements, untested_ids


def _named(pattern=STATEMENT, prefix="") -> dict[str, list[str]]:
    """Statement ID -> names of the tests naming it, over every test module (whatever -k or -m
    selected); with ``STATEMENT_311`` and prefix "MQTT-", the MQTT 3.1.1 ones."""
    named: dict[str, list[str]] = {}
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        module = importlib.import_module(f"{__package__}.{path.stem}")
        for name, obj in vars(module).items():
            if name.startswith("test_") and callable(obj):
                for sid in dict.fromkeys(pattern.findall(obj.__doc__ or "")):
                    named.setdefault(prefix + sid, []).append(name)
    return named


def test_mqtt311_statement_ids_exist():
    """Every [MQTT311-...] in a docstring is an ID of the 3.1.1 list, of role server or both."""
    statements = load_statements(SPEC_311)
    for sid, tests in _named(STATEMENT_311, "MQTT-").items():
        assert sid in statements, f"MQTT311{sid[4:]} (in {tests[0]}) is not a 3.1.1 statement ID"
        assert statements[sid]["role"] in ("server", "both"), f"{sid} binds only clients"


def test_statement_ids_exist():
    """Every [MQTT-...] in a docstring is an ID of the spec list, of role server or both."""
    statements = load_statements()
    for sid, tests in _named().items():
        assert sid in statements, f"{sid} (in {tests[0]}) is not a statement ID"
        assert statements[sid]["role"] in ("server", "both"), f"{sid} binds only clients"


@pytest.mark.parametrize("version", ["5.0", "3.1.1"])
def test_every_statement_tested_or_explained(version):
    """Each server/both statement is named by a test or listed in UNTESTED.md, not both."""
    statements = load_statements(SPEC_311 if version == "3.1.1" else SPEC)
    scope = {sid for sid, row in statements.items() if row["role"] in ("server", "both")}
    untested = set(untested_ids(version))
    assert untested <= scope, f"UNTESTED.md lists unknown IDs: {sorted(untested - scope)}"
    named = set(_named(STATEMENT_311, "MQTT-") if version == "3.1.1" else _named())
    assert not (named & untested), f"both tested and untested: {sorted(named & untested)}"
    assert not (scope - named - untested), f"unaccounted for: {sorted(scope - named - untested)}"


def test_equivalent_mutants_list_is_well_formed(tmp_path):
    """conformance/mutants-equivalent.txt: each entry a mutant of protocol/ or broker/ with a
    reason (see conformance/mutation.py); a line without one is an error."""
    from .mutation import equivalent, module

    listed = equivalent()
    for name, reason in listed.items():
        assert module(name).startswith(("mqttbroker.protocol", "mqttbroker.broker")), name
        assert "__mutmut_" in name and len(reason) > 10, (name, reason)
    bad = tmp_path / "equivalent.txt"
    bad.write_text("mqttbroker.broker.x.x_f__mutmut_1\n")
    with pytest.raises(ValueError, match="expected 'NAME # reason'"):
        equivalent(bad)
