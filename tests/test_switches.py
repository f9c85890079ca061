"""ktframe's boolean environment switches (ktframe/core/switches.py): ``0``, ``false``, ``no``, ``off`` and
the empty string, in any case and with spaces around, are off; anything else is on. Checked on the
function and, in fresh processes that read the variables from their environment, on
``KTFRAME_NO_KERNELS`` and ``KTFRAME_DISABLE_PLUGINS``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ktframe.core import switches
from ktframe.kernels import cpu as kernels

OFF = ["", "0", "false", "FALSE", "No", " off ", "  "]
ON = ["1", "true", "TRUE", " yes ", "on", "On"]


@pytest.mark.parametrize("value", OFF)
def test_off_values_are_off(value, monkeypatch):
    monkeypatch.setenv("KTFRAME_SOME_SWITCH", value)
    assert not switches.on("KTFRAME_SOME_SWITCH")


@pytest.mark.parametrize("value", [*ON, "2", "anything"])
def test_anything_else_is_on(value, monkeypatch):
    monkeypatch.setenv("KTFRAME_SOME_SWITCH", value)
    assert switches.on("KTFRAME_SOME_SWITCH")


def test_unset_is_off(monkeypatch):
    monkeypatch.delenv("KTFRAME_SOME_SWITCH", raising=False)
    assert not switches.on("KTFRAME_SOME_SWITCH")


@pytest.mark.parametrize("value,on", [*((v, False) for v in OFF), *((v, True) for v in [*ON, "2"])])
def test_no_kernels_in_process(value, on, monkeypatch):
    monkeypatch.setenv(kernels.OFF_ENV, value)
    assert kernels.usable(torch.zeros(3)) is not on


PROBE = """
import json, torch
from ktframe.kernels import cpu as kernels
from ktframe.plugin import manager as pluginmanager
print(json.dumps({"kernels": kernels.usable(torch.zeros(1 << 16)), "variants": pluginmanager.registry().names("variant"), "disabled": pluginmanager.disabled()}))
"""


def probe(value: str) -> dict:
    """A fresh process with both KTFRAME_NO_KERNELS and KTFRAME_DISABLE_PLUGINS set to ``value``."""
    env = {key: val for key, val in os.environ.items() if not key.startswith("KTFRAME_")}
    env.update(KTFRAME_STRICT_PLUGINS="1", KTFRAME_NO_KERNELS=value, KTFRAME_DISABLE_PLUGINS=value)
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("value", OFF)
def test_off_values_leave_kernels_and_plugins_on(value):
    seen = probe(value)
    assert seen["kernels"] is True  # KTFRAME_NO_KERNELS=false used to turn the kernels off
    assert "lloyd" in seen["variants"] and seen["disabled"] == ""


@pytest.mark.parametrize("value", ON)
def test_on_values_turn_kernels_and_plugins_off(value):
    seen = probe(value)
    assert seen["kernels"] is False
    # Every other distribution's plugins are off; ktframe's own variants are not installed plugins.
    assert seen["disabled"].startswith("plugins of other distributions than ktframe are disabled"), seen["disabled"]
    assert "lloyd" in seen["variants"] and "learned" in seen["variants"]
