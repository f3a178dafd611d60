"""The workflow context is a contract (engine/contract.py): every public method of the Context is in
it, and every stand-in that runs workflow code in the Context's place implements each one (or
refuses it with a named reason), so a new context method cannot leave describe's shape, the checks
built on it or the replay check blind. The type checker holds the signatures (make test runs mypy);
this holds the lists, and what the stand-ins do with the methods the shape missed before.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from django.core import checks

import django_durable as durable
from django_durable import checks as durable_checks
from django_durable.engine import contract, describe
from django_durable.engine.context import Context
from django_durable.engine.replay import Session as AdvanceSession
from django_durable.replaycheck import _Session as CheckSession

ENGINE = Path(durable.__file__).parent / "engine"


def _public(cls) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def _protocol_members(protocol) -> set[str]:
    return {name for name in vars(protocol) if not name.startswith("_")} | set(
        getattr(protocol, "__annotations__", {}))


def test_every_public_method_of_the_context_is_in_the_contract():
    missing = _public(Context) - _protocol_members(contract.WorkflowContext)
    assert not missing, f"Add these Context methods to engine/contract.py's WorkflowContext: {sorted(missing)}"


@pytest.mark.parametrize("stand_in", [describe.Recorder], ids=lambda cls: cls.__qualname__)
def test_every_stand_in_of_the_context_has_every_method_of_the_contract(stand_in):
    instance = stand_in("tests.contract")
    lacking = sorted(name for name in _protocol_members(contract.WorkflowContext) if not hasattr(instance, name))
    assert not lacking, f"{stand_in.__qualname__} lacks {lacking}: implement each, or raise contract.Refused"


def test_every_session_the_context_uses_is_in_the_contract_and_every_session_has_it():
    """What the context asks of `self._session` (read from the engine's code), in the Session
    contract, and implemented by the worker's session and the replay check's."""
    used = set()
    for path in ENGINE.glob("*.py"):
        used |= set(re.findall(r"\b_session\.(\w+)", path.read_text()))
    assert used, "the engine's code reads its session as self._session"
    members = _protocol_members(contract.Session)
    assert used <= members, f"Add to engine/contract.py's Session: {sorted(used - members)}"
    for session in (AdvanceSession, CheckSession):
        source = inspect.getsource(session)
        lacking = sorted(name for name in members
                         if not hasattr(session, name) and not re.search(rf"self\.{name}\b[^=\n]*=", source))
        assert not lacking, f"{session.__qualname__} lacks {lacking}"


@durable.workflow("tests.contract.streams_then_approval")
def streams_then_approval(ctx, question="refund?"):
    for token in ctx.step("answer", str.split, question):
        ctx.write_stream("tokens", token)
    ctx.close_stream("tokens")
    ctx.step("refund", str.upper, question)
    return ctx.wait_for_approval("refund", approvers="auth.change_user")


def test_the_shape_goes_on_past_a_stream_and_finds_the_clash_behind_it():
    shape = durable.describe(streams_then_approval)
    assert [node["type"] for node in shape["shape"]] == ["step", "stream", "close", "step", "approval"]
    assert any("'refund' is used by ctx.step()" in problem for problem in shape["problems"]), shape["problems"]
    found = [message for message in checks.run_checks() if "tests.contract.streams_then_approval" in message.msg]
    assert [message.id for message in found] == ["django_durable.E011"], found


def test_the_shape_of_a_stream_reads_in_the_cli_and_the_admin(admin_client):
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("durable", "describe", "tests.contract.streams_then_approval", stdout=out)
    assert "write to stream tokens" in out.getvalue() and "close stream tokens" in out.getvalue(), out.getvalue()
    page = admin_client.get("/admin/django_durable/definition/tests.contract.streams_then_approval/")
    assert page.status_code == 200
    assert "write to stream</strong> <code>tokens</code>" in page.content.decode()


def test_describe_hands_out_a_copy_of_its_recording():
    first = durable.describe(streams_then_approval)
    first["shape"].clear()
    first["shape"].append({"type": "edited"})
    assert durable.describe(streams_then_approval)["shape"][0]["type"] == "step"


@durable.workflow("tests.contract.stops")
def stops(ctx, when):
    import datetime as dt

    dt.datetime.fromisoformat(when)  # an input it cannot describe: a stand-in is no date
    ctx.step("after", str.upper, "x")


def test_a_shape_that_stops_is_a_warning_naming_the_workflow_and_the_reason():
    # (The test settings silence W005 for the test app's workflows that fail on purpose: the
    # check function itself, as `manage.py check` runs it.)
    found = [message for message in durable_checks.check_workflow_shapes() if "tests.contract.stops" in message.msg]
    assert [message.id for message in found] == ["django_durable.W005"]
    assert "fromisoformat" in found[0].msg and "TypeError" in found[0].msg
