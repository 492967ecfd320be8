"""gdn.env_vars.read is os.environ.get: every change made through os.environ (set, reset to the same or
another value, delete, clear) shows in the next read, for values of any encoding, and a replaced
os.environ is read as it is."""

from __future__ import annotations

import os

import pytest

from gdn import env_vars

pytestmark = pytest.mark.single_op
NAME = "GDN_TEST_ENV_VARS_READ"


def test_reads_follow_every_change_made_through_os_environ(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    assert env_vars.read(NAME, "default") == "default"
    for value in ["1", "0", "0", "", "auto", "triton:bundled", "nœud-é"]:
        monkeypatch.setenv(NAME, value)
        assert env_vars.read(NAME, "default") == value == os.environ.get(NAME, "default")
    os.environ[NAME] = "x"
    assert env_vars.read(NAME, "default") == "x"
    del os.environ[NAME]
    assert env_vars.read(NAME, "default") == "default"
    os.environ[NAME] = "y"
    saved = dict(os.environ)
    os.environ.clear()
    try:
        assert env_vars.read(NAME, "default") == "default"
    finally:
        os.environ.update(saved)
    assert env_vars.read(NAME, "default") == "y"
    del os.environ[NAME]


def test_a_replaced_os_environ_is_read_as_it_is(monkeypatch):
    monkeypatch.setenv(NAME, "in the process")
    monkeypatch.setattr(os, "environ", {NAME: "replaced"})
    assert env_vars.read(NAME, "default") == "replaced"
    monkeypatch.setattr(os, "environ", {})
    assert env_vars.read(NAME, "default") == "default"


def test_the_op_calls_see_a_change_of_mode_on_the_next_call(monkeypatch):
    from gdn import _validate, resolve

    monkeypatch.setenv("GDN_VALUE_CHECKS", "1")
    assert _validate.value_check_mode() == "1"
    monkeypatch.setenv("GDN_VALUE_CHECKS", "0")
    assert _validate.value_check_mode() == "0"
    monkeypatch.setenv("GDN_VALUE_CHECKS", "sometimes")
    with pytest.raises(ValueError, match="GDN_VALUE_CHECKS: expected one of"):
        _validate.value_check_mode()
    monkeypatch.setenv("GDN_COMPUTE_MODE", "eager")
    assert resolve.compute_mode() == "eager"
    monkeypatch.delenv("GDN_COMPUTE_MODE")
    assert resolve.compute_mode() == "auto"
