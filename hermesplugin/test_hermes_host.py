"""Unit tests of the hermes_host plugin against a fake of the worker's hook socket.

Run from the repository root (standard library only):

    PYTHONDONTWRITEBYTECODE=1 python3 -m unittest discover -s hermesplugin -t hermesplugin

The plugin with Hermes' hook arguments against the real socket served by `worker run-job` is
the end-to-end test worker/plugin_e2e_test.go (through testdata/fake_hermes_chat.py).
"""

import http.server
import json
import logging
import os
import re
import socket
import socketserver
import sys
import tempfile
import threading
import time
import unittest
from unittest import mock

sys.dont_write_bytecode = True  # no __pycache__ beside the plugin the binary embeds

import hermes_host  # noqa: E402

PARENT = "20260102_101500_a1b2c3"


def start_kwargs(child_id, session, parent_subagent=None, role="leaf", goal="find the 2026 price list"):
    """subagent_start's arguments as tools/delegate_tool.py passes them."""
    return dict(
        parent_session_id=PARENT, parent_turn_id="turn-1", parent_subagent_id=parent_subagent,
        child_session_id=session, child_subagent_id=child_id, child_role=role, child_goal=goal,
        telemetry_schema_version=1,
    )


def stop_kwargs(session, status="completed", summary="done it"):
    """subagent_stop's arguments: no subagent id, only the child's session."""
    return dict(
        parent_session_id=PARENT, parent_turn_id="turn-1", child_session_id=session, child_role="leaf",
        child_summary=summary, child_status=status, duration_ms=1200, telemetry_schema_version=1,
    )


def tool_kwargs(session, task_id, n=1):
    """pre_tool_call's arguments as the agent loop passes them for one step."""
    return dict(
        tool_name="terminal", args={"command": "ls"}, task_id=task_id, session_id=session,
        tool_call_id="call_%d" % n, turn_id="turn-1", api_request_id="req-1", middleware_trace=[],
        telemetry_schema_version=1,
    )


def result_kwargs(session, task_id, n=1, result='{"output": "a.txt"}'):
    """transform_tool_result's arguments (model_tools.handle_function_call)."""
    kw = tool_kwargs(session, task_id, n)
    del kw["middleware_trace"]
    kw.update(result=result, duration_ms=30, status="ok", error_type=None, error_message=None)
    return kw


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class FakeHooks:
    """The worker's hook socket as the plugin sees it: its four routes, as strict about bodies
    as worker/hooks.go (unknown fields refused), and a mailbox that redelivers every message
    until it is acknowledged. fail[route] makes a route answer (status, raw body) instead, or
    drop the connection unanswered when it is "drop"."""

    START_FIELDS = {"id", "session_id", "parent_session", "parent_subagent", "goal", "role"}

    def __init__(self, folder):
        self.path = os.path.join(folder, "hooks.sock")
        self.lock = threading.Lock()
        self.requests = []  # (method, path, body)
        self.children = {}  # id -> {"status", "cancel_reason", "start", "stop"}
        self.mailbox = {}  # id -> [{"id", "sender", "body", "acked"}]
        self.next_message = 1
        self.fail = {}
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                fake._serve(self, "GET")

            def do_POST(self):
                fake._serve(self, "POST")

        self.server = _Server(self.path, Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def send(self, child_id, sender, body):
        with self.lock:
            m = {"id": self.next_message, "sender": sender, "body": body, "acked": False}
            self.next_message += 1
            self.mailbox.setdefault(child_id, []).append(m)
            return m["id"]

    def cancel(self, child_id, reason):
        with self.lock:
            self.children[child_id].update(status="cancelling", cancel_reason=reason)

    def routes(self, method=None):
        with self.lock:
            return [(m, p, b) for m, p, b in self.requests if method is None or m == method]

    def _serve(self, h, method):
        n = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(n) if n else b""
        body = json.loads(raw) if raw else None
        with self.lock:
            self.requests.append((method, h.path, body))
        failure = self.fail.get(self._route_name(method, h.path))
        if failure == "drop":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        if failure is not None:
            status, data = failure
        else:
            _, status, answer = self._route(method, h.path, body)
            data = json.dumps(answer).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _route_name(method, path):
        if path == "/subagents":
            return "start"
        for suffix, name in (("/stop", "stop"), ("/mailbox/ack", "ack"), ("/mailbox?wait_ms=0", "mailbox")):
            if path.endswith(suffix):
                return name
        return "other"

    @staticmethod
    def _refuse(status, code, message):
        return status, {"error": code, "message": message}

    def _route(self, method, path, body):
        with self.lock:
            if method == "POST" and path == "/subagents":
                if not isinstance(body, dict) or set(body) - self.START_FIELDS or not body.get("id") or not body.get("goal"):
                    return ("start",) + self._refuse(400, "invalid", "not a start: %r" % (body,))
                self.children[body["id"]] = {"status": "running", "cancel_reason": "", "start": body, "stop": None}
                return "start", 201, dict(body, status="running")
            m = re.fullmatch(r"/subagents/([^/?]+)(/stop|/mailbox\?wait_ms=0|/mailbox/ack)", path)
            if m is None:
                return ("other",) + self._refuse(404, "not_found", "no such hook")
            child_id, rest = m.group(1), m.group(2)
            route = {"/stop": "stop", "/mailbox/ack": "ack"}.get(rest, "mailbox")
            child = self.children.get(child_id)
            if child is None:
                return (route,) + self._refuse(404, "not_found", "no such subagent of this job: " + child_id)
            if route == "stop":
                if not isinstance(body, dict) or set(body) - {"status", "summary"} or body.get("status") not in ("done", "failed"):
                    return (route,) + self._refuse(400, "invalid", "not a stop: %r" % (body,))
                child["stop"] = body
                child["status"] = "cancelled" if child["status"] == "cancelling" else body["status"]
                return route, 200, {"id": child_id, "status": child["status"]}
            box = self.mailbox.setdefault(child_id, [])
            if route == "ack":
                if not isinstance(body, dict) or set(body) != {"ids"}:
                    return (route,) + self._refuse(400, "invalid", "not an ack")
                acked = 0
                for m in box:
                    if m["id"] in body["ids"] and not m["acked"]:
                        m["acked"] = True
                        acked += 1
                return route, 200, {"acked": acked}
            return route, 200, {
                "status": child["status"], "stop": child["status"] != "running",
                "cancel_reason": child["cancel_reason"],
                "messages": [{"id": m["id"], "sender": m["sender"], "body": m["body"], "deliveries": 1}
                             for m in box if not m["acked"]],
            }


class RecordingContext:
    """The ctx Hermes hands register(): here it only records register_hook."""

    def __init__(self):
        self.hooks = {}

    def register_hook(self, name, callback):
        self.hooks.setdefault(name, []).append(callback)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


class PluginTest(unittest.TestCase):
    def setUp(self):
        folder = tempfile.TemporaryDirectory(prefix="hh-")  # short: a socket path is at most 108 bytes
        self.addCleanup(folder.cleanup)
        self.folder = folder.name
        self.fake = FakeHooks(self.folder)
        self.addCleanup(self.fake.close)
        self.client = hermes_host.HookClient(self.fake.path, timeout=2, backoff=0)
        self.logs = _Records()
        log = logging.getLogger("hermes_host")
        log.addHandler(self.logs)
        log.propagate = False
        self.addCleanup(lambda: (log.removeHandler(self.logs), setattr(log, "propagate", True)))

    def warnings(self):
        return [r.getMessage() for r in self.logs.records if r.levelno >= logging.WARNING]

    def start(self, child_id, session, **kw):
        self.assertIsNone(self.client.subagent_start(**start_kwargs(child_id, session, **kw)))

    def step(self, session, task_id, n=1, result='{"output": "a.txt"}'):
        """One tool call of a child: pre_tool_call, then (unless blocked) its result."""
        pre = self.client.pre_tool_call(**tool_kwargs(session, task_id, n))
        if pre is not None:
            return pre, None
        return None, self.client.transform_tool_result(**result_kwargs(session, task_id, n, result))


class RegisterTest(PluginTest):
    def test_registers_the_four_hooks_only_when_the_worker_serves_them(self):
        ctx = RecordingContext()
        with mock.patch.dict(os.environ, {}, clear=True):
            hermes_host.register(ctx)
        self.assertEqual(ctx.hooks, {})
        with mock.patch.dict(os.environ, {hermes_host.SOCKET_ENV: self.fake.path}):
            hermes_host.register(ctx)
        self.assertEqual(sorted(ctx.hooks), ["pre_tool_call", "subagent_start", "subagent_stop", "transform_tool_result"])
        for callbacks in ctx.hooks.values():
            self.assertEqual(len(callbacks), 1)
            self.assertTrue(callable(callbacks[0]))
        # The registered callbacks talk to the socket the variable names.
        ctx.hooks["subagent_start"][0](**start_kwargs("sa-0-0a1b2c3d", "20260102_101501_d4e5f6"))
        self.assertIn("sa-0-0a1b2c3d", self.fake.children)


class StartStopTest(PluginTest):
    def test_start_reports_the_child_as_the_hook_socket_takes_it(self):
        self.start("sa-0-0a1b2c3d", "20260102_101501_d4e5f6", parent_subagent=None, role="")
        self.start("sa-1-1a1b2c3d", "20260102_101502_d4e5f6", parent_subagent="sa-0-0a1b2c3d", role="orchestrator",
                   goal="g\x00" + "x" * 5000)
        starts = [b for m, p, b in self.fake.routes("POST") if p == "/subagents"]
        self.assertEqual(starts[0], {"id": "sa-0-0a1b2c3d", "session_id": "20260102_101501_d4e5f6",
                                     "parent_session": PARENT, "goal": "find the 2026 price list"})
        self.assertEqual(starts[1]["parent_subagent"], "sa-0-0a1b2c3d")
        self.assertEqual(starts[1]["role"], "orchestrator")
        self.assertEqual(len(starts[1]["goal"]), hermes_host.MAX_GOAL)
        self.assertTrue(starts[1]["goal"].startswith("gxxx"), "NUL characters, which the host refuses, are left out")
        self.assertEqual(self.warnings(), [])

    def test_stop_maps_hermes_status_words_to_done_or_failed(self):
        cases = [("completed", "done"), ("success", "done"), ("done", "done"), ("Completed", "done"),
                 ("failed", "failed"), ("error", "failed"), ("timeout", "failed"), ("interrupted", "failed"),
                 ("cancelled", "failed"), ("max_iterations", "failed"), ("", "failed"), (None, "failed")]
        for i, (word, want) in enumerate(cases):
            with self.subTest(word=word):
                child, session = "sa-%d-5e1f0a2b" % i, "20260102_1016%02d_abcdef" % i
                self.start(child, session)
                self.assertIsNone(self.client.subagent_stop(**stop_kwargs(session, status=word)))
                self.assertEqual(self.fake.children[child]["stop"], {"status": want, "summary": "done it"})

    def test_stop_clips_the_summary_to_the_hosts_limit(self):
        self.start("sa-0-0a1b2c3d", "s-long")
        self.client.subagent_stop(**stop_kwargs("s-long", summary="é" * (hermes_host.MAX_SUMMARY + 500)))
        self.assertEqual(self.fake.children["sa-0-0a1b2c3d"]["stop"]["summary"], "é" * hermes_host.MAX_SUMMARY)
        self.start("sa-1-0a1b2c3d", "s-none")
        self.client.subagent_stop(**stop_kwargs("s-none", status="failed", summary=None))
        self.assertEqual(self.fake.children["sa-1-0a1b2c3d"]["stop"], {"status": "failed", "summary": ""})

    def test_a_child_the_host_never_recorded_is_left_alone(self):
        self.client.subagent_stop(**stop_kwargs("20260102_999999_000000"))
        self.assertEqual(self.fake.routes(), [])
        self.fake.fail["start"] = (400, json.dumps({"error": "invalid", "message": "goal is empty"}).encode())
        self.start("sa-0-0a1b2c3d", "s-refused")
        self.start("sa-1-0a1b2c3d", "s-refused-too")
        self.assertEqual(self.step("s-refused", "sa-0-0a1b2c3d"), (None, None))
        self.client.subagent_stop(**stop_kwargs("s-refused"))
        self.assertEqual([p for _, p, _ in self.fake.routes()], ["/subagents", "/subagents"])
        self.assertEqual(len(self.warnings()), 1, "one refusal logged once: %s" % self.warnings())
        self.assertIn("invalid", self.warnings()[0])
        self.assertIn("goal is empty", self.warnings()[0])

    def test_a_childs_hooks_end_with_its_stop(self):
        self.start("sa-0-0a1b2c3d", "s-1")
        self.client.subagent_stop(**stop_kwargs("s-1"))
        before = len(self.fake.routes())
        self.assertEqual(self.step("s-1", "sa-0-0a1b2c3d"), (None, None))
        self.client.subagent_stop(**stop_kwargs("s-1"))
        self.assertEqual(len(self.fake.routes()), before)


class MailboxTest(PluginTest):
    CHILD, SESSION = "sa-0-0a1b2c3d", "20260102_101501_d4e5f6"

    def setUp(self):
        super().setUp()
        self.start(self.CHILD, self.SESSION)

    def test_the_parents_own_steps_are_left_alone(self):
        before = len(self.fake.routes())
        self.assertEqual(self.step(PARENT, "parent-task"), (None, None))
        self.assertEqual(self.step("", ""), (None, None))
        self.assertEqual(len(self.fake.routes()), before, "no socket call for a step that is not a child's")

    def test_a_message_reaches_exactly_one_tool_result_and_is_acknowledged(self):
        mid = self.fake.send(self.CHILD, "operator:ada", "use the 2026 list")
        # Drained before two steps' tools run: kept pending, once, although redelivered.
        self.assertIsNone(self.client.pre_tool_call(**tool_kwargs(self.SESSION, self.CHILD, 1)))
        self.assertIsNone(self.client.pre_tool_call(**tool_kwargs(self.SESSION, self.CHILD, 2)))
        out = self.client.transform_tool_result(**result_kwargs(self.SESSION, self.CHILD, 2))
        self.assertIsInstance(out, str)
        self.assertTrue(out.startswith('{"output": "a.txt"}'), out)
        self.assertEqual(out.count("use the 2026 list"), 1, out)
        self.assertIn("operator:ada", out)
        self.assertIn("operator", out.split('{"output": "a.txt"}', 1)[1].lower())
        self.assertEqual([b for _, p, b in self.fake.routes("POST") if p.endswith("/ack")], [{"ids": [mid]}])
        self.assertTrue(self.fake.mailbox[self.CHILD][0]["acked"])
        self.assertEqual(self.step(self.SESSION, self.CHILD, 3), (None, None))
        # A message first seen by transform_tool_result itself is delivered there.
        self.fake.send(self.CHILD, "operator:bob", "and the 2025 one")
        out = self.client.transform_tool_result(**result_kwargs(self.SESSION, self.CHILD, 4, result="plain text"))
        self.assertTrue(out.startswith("plain text") and "and the 2025 one" in out and "2026" not in out, out)

    def test_messages_are_delivered_in_order_into_non_string_results(self):
        self.fake.send(self.CHILD, "operator:ada", "first")
        self.fake.send(self.CHILD, "operator:ada", "second")
        out = self.client.transform_tool_result(**result_kwargs(self.SESSION, self.CHILD, result={"output": "x"}))
        self.assertTrue(out.startswith('{"output": "x"}'), out)
        self.assertLess(out.index("first"), out.index("second"))

    def test_a_child_is_known_by_its_task_id_too(self):
        self.fake.send(self.CHILD, "operator:ada", "by task")
        out = self.client.transform_tool_result(**result_kwargs("", self.CHILD))
        self.assertIn("by task", out)

    def test_an_acknowledgement_that_fails_is_retried_and_the_message_not_delivered_again(self):
        self.fake.send(self.CHILD, "operator:ada", "use the 2026 list")
        self.fake.fail["ack"] = "drop"
        self.assertIn("use the 2026 list", self.step(self.SESSION, self.CHILD, 1)[1])
        self.assertFalse(self.fake.mailbox[self.CHILD][0]["acked"])
        del self.fake.fail["ack"]
        # Redelivered by the mailbox, not by the plugin; the ack goes again before the drain.
        self.assertEqual(self.step(self.SESSION, self.CHILD, 2), (None, None))
        self.assertTrue(self.fake.mailbox[self.CHILD][0]["acked"])
        self.assertEqual(len(self.warnings()), 1, self.warnings())

    def test_a_cancel_blocks_every_later_step(self):
        self.assertEqual(self.step(self.SESSION, self.CHILD, 1), (None, None))
        self.fake.cancel(self.CHILD, "wrong supplier")
        block = self.client.pre_tool_call(**tool_kwargs(self.SESSION, self.CHILD, 2))
        self.assertEqual(set(block), {"action", "message"})
        self.assertEqual(block["action"], "block")
        self.assertIn("cancelled", block["message"])
        self.assertIn("operator", block["message"])
        self.assertIn("wrong supplier", block["message"])
        self.assertIn("Stop now", block["message"])
        drains = len(self.fake.routes("GET"))
        self.assertEqual(self.client.pre_tool_call(**tool_kwargs(self.SESSION, self.CHILD, 3)), block)
        self.assertEqual(len(self.fake.routes("GET")), drains, "a stop is final: no more draining")
        self.client.subagent_stop(**stop_kwargs(self.SESSION, status="interrupted", summary="stopped as asked"))
        self.assertEqual(self.fake.children[self.CHILD]["status"], "cancelled")

    def test_a_cancel_seen_after_the_tool_ran_is_told_in_its_result(self):
        self.assertIsNone(self.client.pre_tool_call(**tool_kwargs(self.SESSION, self.CHILD, 1)))
        self.fake.cancel(self.CHILD, "")
        out = self.client.transform_tool_result(**result_kwargs(self.SESSION, self.CHILD, 1))
        self.assertIn("cancelled", out)
        self.assertNotIn("Reason given", out)
        self.assertIsNone(self.client.transform_tool_result(**result_kwargs(self.SESSION, self.CHILD, 2)))
        self.assertEqual(self.client.pre_tool_call(**tool_kwargs(self.SESSION, self.CHILD, 3))["action"], "block")

    def test_odd_answers_never_raise(self):
        for failure in [(500, b"not json"), (200, b"not json"), (200, b"[]"),
                        (200, json.dumps({"stop": "yes", "messages": [{"id": "7", "body": "x"}, {"id": True},
                                                                      {"id": 3}, 5, None]}).encode())]:
            with self.subTest(failure=failure):
                self.fake.fail["mailbox"] = failure
                pre, out = self.step(self.SESSION, self.CHILD)
                self.assertIsNone(pre)
                self.assertTrue(out is None or "[message 3 from operator]" in out, out)


class DeadSocketTest(PluginTest):
    def test_a_missing_socket_never_raises_and_is_logged_once(self):
        client = hermes_host.HookClient(os.path.join(self.folder, "gone.sock"), timeout=1, backoff=0)
        for n in range(3):
            self.assertIsNone(client.subagent_start(**start_kwargs("sa-0-0a1b2c3d", "s-dead")))
            self.assertIsNone(client.pre_tool_call(**tool_kwargs("s-dead", "sa-0-0a1b2c3d", n)))
            self.assertIsNone(client.transform_tool_result(**result_kwargs("s-dead", "sa-0-0a1b2c3d", n)))
            self.assertIsNone(client.subagent_stop(**stop_kwargs("s-dead")))
        self.assertEqual(len(self.warnings()), 1, self.warnings())
        self.assertIn("cannot be reached", self.warnings()[0])

    def test_a_socket_that_dies_mid_run_is_logged_once_and_the_steps_go_on(self):
        self.start("sa-0-0a1b2c3d", "s-1")
        self.fake.close()
        os.unlink(self.fake.path)
        for n in range(3):
            self.assertEqual(self.step("s-1", "sa-0-0a1b2c3d", n), (None, None))
        self.client.subagent_stop(**stop_kwargs("s-1"))
        self.assertEqual(len(self.warnings()), 1, self.warnings())

    def test_a_socket_that_never_answers_times_out(self):
        path = os.path.join(self.folder, "mute.sock")
        mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.addCleanup(mute.close)
        mute.bind(path)
        mute.listen(8)  # connections queue; nothing ever answers
        client = hermes_host.HookClient(path, timeout=0.3, backoff=60)
        began = time.monotonic()
        self.assertIsNone(client.subagent_start(**start_kwargs("sa-0-0a1b2c3d", "s-mute")))
        self.assertLess(time.monotonic() - began, 2)
        self.assertEqual(len(self.warnings()), 1, self.warnings())

    def test_steps_back_off_after_a_failure(self):
        self.start("sa-0-0a1b2c3d", "s-1")
        client = self.client
        client.backoff = 60
        self.fake.fail["mailbox"] = "drop"
        self.step("s-1", "sa-0-0a1b2c3d", 1)
        drains = len(self.fake.routes("GET"))
        del self.fake.fail["mailbox"]
        for n in range(2, 5):
            self.assertEqual(self.step("s-1", "sa-0-0a1b2c3d", n), (None, None))
        self.assertEqual(len(self.fake.routes("GET")), drains, "no drain while backing off")

    def test_hooks_take_whatever_they_are_passed(self):
        for hook in self.client.hooks().values():
            self.assertIsNone(hook())
            self.assertIsNone(hook(child_subagent_id=5, child_session_id=["x"], session_id={}, task_id=3.5,
                                   child_goal=object(), child_summary=b"bytes", result=None, unknown="new"))


class StatusWordsTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(hermes_host.status_for("completed"), "done")
        self.assertEqual(hermes_host.status_for(" SUCCESS "), "done")
        for word in ("failed", "error", "timeout", "interrupted", "cancelled", 1, None):
            self.assertEqual(hermes_host.status_for(word), "failed")


if __name__ == "__main__":
    unittest.main()
