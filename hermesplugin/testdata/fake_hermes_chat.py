#!/usr/bin/env python3
"""A stand-in for the Hermes CLI process that hosts the hermes_host plugin: not Hermes, only
what Hermes does to a plugin, run by worker/plugin_e2e_test.go as HERMES_BIN.

`worker run-job` starts it as it starts Hermes (`chat -q PROMPT --quiet --source tool
--max-turns N`, the agent's minimal environment with HERMES_HOME and HERMES_HOST_HOOKS_SOCKET).
It loads the plugin from $HERMES_HOME/plugins/hermes_host/ the way Hermes' loader does
(hermes_cli/plugins.py: imported as hermes_plugins.hermes_host, then register(ctx)), records
the ctx.register_hook calls, and runs the unittest cases below, which call the recorded hooks
as Hermes' call sites do (tools/delegate_tool.py for subagent_start/stop, the agent loop and
model_tools.handle_function_call for pre_tool_call and transform_tool_result) against the
worker's real hook socket. The Go test steers from the control store meanwhile: it sends the
message child a message and cancels the cancel child once each exists, so those cases poll
with a deadline.

Its exit status is the unittest's. On success it prints {"proposed": []} as its final
answer: the job is a product_ingest with no writes, whose gate accepts an empty list, so the
job completes; a failed case exits 1 and the job ends crashed. Either way the outcome is
decided by the tests alone.
"""

import importlib.util
import os
import re
import sys
import time
import types
import unittest

NAME = "hermes_host"
DEADLINE_SECONDS = 60

# Ids shaped as Hermes makes them (sessions: time and hex; subagents: "sa-<index>-<hex8>");
# worker/plugin_e2e_test.go names the same children.
PARENT_SESSION = "20260102_101500_a1b2c3"
DONE = ("sa-0-0d0e0f10", "20260102_101501_000001")
FAILED = ("sa-1-0d0e0f11", "20260102_101502_000002")
MESSAGED = ("sa-0-0d0e0f12", "20260102_101503_000003")
CANCELLED = ("sa-0-0d0e0f13", "20260102_101504_000004")
LONG_SUMMARY = "r" * 16100  # past the host's 16000 characters

HOOKS = {}  # hook name -> callbacks, as register(ctx) left them


class PluginContext:
    """The part of Hermes' PluginContext the plugin uses: register_hook appends the callback
    to the hook's list."""

    def register_hook(self, hook_name, callback):
        HOOKS.setdefault(hook_name, []).append(callback)


def load_plugin(home):
    """Import the plugin folder as Hermes' _load_directory_module does, and register it."""
    folder = os.path.join(home, "plugins", NAME)
    with open(os.path.join(folder, "plugin.yaml"), encoding="utf-8") as f:
        if not re.search(r"(?m)^name: %s$" % NAME, f.read()):
            raise SystemExit("plugin.yaml does not name the plugin " + NAME)
    if "hermes_plugins" not in sys.modules:
        ns = types.ModuleType("hermes_plugins")
        ns.__path__ = []
        ns.__package__ = "hermes_plugins"
        sys.modules["hermes_plugins"] = ns
    module_name = "hermes_plugins." + NAME
    spec = importlib.util.spec_from_file_location(
        module_name, os.path.join(folder, "__init__.py"), submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    module.__package__ = module_name
    module.__path__ = [folder]
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    module.register(PluginContext())
    return module


def invoke_hook(name, **kwargs):
    """As PluginManager.invoke_hook: every callback with the same kwargs (plus the telemetry
    version later releases add), the non-None results. Hermes would log and swallow an
    exception; here it fails the case, since the plugin must never raise."""
    kwargs.setdefault("telemetry_schema_version", 1)
    results = [cb(**kwargs) for cb in HOOKS.get(name, [])]
    return [r for r in results if r is not None]


def start(child, goal, parent_subagent=None, role="leaf"):
    return invoke_hook(
        "subagent_start", parent_session_id=PARENT_SESSION, parent_turn_id="turn-1",
        parent_subagent_id=parent_subagent, child_session_id=child[1], child_subagent_id=child[0],
        child_role=role, child_goal=goal)


def stop(child, status, summary, role="leaf"):
    return invoke_hook(
        "subagent_stop", parent_session_id=PARENT_SESSION, parent_turn_id="turn-1",
        child_session_id=child[1], child_role=role, child_summary=summary, child_status=status,
        duration_ms=1500)


def step(child, n, result):
    """One tool call of a child (or of the parent, with PARENT_SESSION): the pre_tool_call
    block as get_pre_tool_call_block_message reads it, else the result after
    transform_tool_result (first string wins)."""
    session, task = child[1], child[0]
    common = dict(tool_name="terminal", args={"command": "ls"}, task_id=task, session_id=session,
                  tool_call_id="call_%d" % n, turn_id="turn-1", api_request_id="req-%d" % n)
    for r in invoke_hook("pre_tool_call", middleware_trace=[], **common):
        if isinstance(r, dict) and r.get("action") == "block" and isinstance(r.get("message"), str) and r["message"]:
            return r, None
    for r in invoke_hook("transform_tool_result", result=result, duration_ms=20, status="ok",
                         error_type=None, error_message=None, **common):
        if isinstance(r, str):
            return None, r
    return None, result


class HookSocketTest(unittest.TestCase):
    """Named in the order they run: the Go side waits for each child in turn."""

    def test_1_the_plugin_registers_its_four_hooks(self):
        self.assertEqual(sorted(HOOKS), ["pre_tool_call", "subagent_start", "subagent_stop", "transform_tool_result"])

    def test_2_a_childs_start_and_stop_reach_the_host(self):
        self.assertEqual(start(DONE, "find the 2026 price list"), [])
        self.assertEqual(start(FAILED, "read the supplier's terms", parent_subagent=DONE[0]), [])
        self.assertEqual(stop(FAILED, "timeout", None), [])
        self.assertEqual(stop(DONE, "completed", LONG_SUMMARY), [])

    def test_3_an_operators_message_reaches_one_tool_result_once(self):
        start(MESSAGED, "compare the price lists")
        deadline, n, out = time.monotonic() + DEADLINE_SECONDS, 0, None
        while out is None and time.monotonic() < deadline:
            n += 1
            block, result = step(MESSAGED, n, '{"output": "step %d"}' % n)
            self.assertIsNone(block)
            if result != '{"output": "step %d"}' % n:
                out = result
            else:
                time.sleep(0.1)
        self.assertIsNotNone(out, "no message reached a tool result within %ds" % DEADLINE_SECONDS)
        self.assertTrue(out.startswith('{"output": "step %d"}' % n), out)
        self.assertEqual(out.count("use the 2026 list"), 1, out)
        self.assertIn("operator:ada", out)
        for m in range(n + 1, n + 4):
            self.assertEqual(step(MESSAGED, m, "later"), (None, "later"), "the message came again")
        stop(MESSAGED, "completed", "heard it")

    def test_4_a_cancel_blocks_the_childs_next_tool_call(self):
        start(CANCELLED, "draft the order")
        deadline, n, block = time.monotonic() + DEADLINE_SECONDS, 0, None
        while block is None and time.monotonic() < deadline:
            n += 1
            block, _ = step(CANCELLED, n, "ok")
            if block is None:
                time.sleep(0.1)
        self.assertIsNotNone(block, "no cancel blocked a tool call within %ds" % DEADLINE_SECONDS)
        self.assertEqual(set(block), {"action", "message"})
        self.assertIn("cancelled", block["message"])
        self.assertIn("wrong supplier", block["message"])
        self.assertEqual(step(CANCELLED, n + 1, "ok")[0], block, "a cancel is final")
        stop(CANCELLED, "interrupted", "stopped as asked")

    def test_5_the_parents_own_steps_are_untouched(self):
        parent = ("parent-task", PARENT_SESSION)
        self.assertEqual(step(parent, 1, "as it was"), (None, "as it was"))


def main():
    if len(sys.argv) < 2 or sys.argv[1] != "chat":
        print("usage: fake_hermes_chat.py chat -q PROMPT ...", file=sys.stderr)
        return 2
    if not os.environ.get("HERMES_HOST_HOOKS_SOCKET"):
        print("HERMES_HOST_HOOKS_SOCKET is not set: the worker serves no hooks", file=sys.stderr)
        return 1
    load_plugin(os.environ["HERMES_HOME"])
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(HookSocketTest)
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
    if not result.wasSuccessful():
        return 1
    print('{"proposed": []}')
    return 0


if __name__ == "__main__":
    sys.exit(main())
