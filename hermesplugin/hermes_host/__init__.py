"""Hermes Agent Host's plugin: the subagents Hermes delegates, reported to the host and steered by it.

Hermes loads this folder from ``$HERMES_HOME/plugins/hermes_host/`` (the host installs it there
and lists it in config.yaml ``plugins.enabled``) and calls ``register(ctx)`` inside its own
Python process, where delegated children run too. The host's worker serves the hooks on a
unix socket named by ``HERMES_HOST_HOOKS_SOCKET`` (HTTP/1.1, see worker/hooks.go):

- ``subagent_start`` records the child (``POST /subagents``);
- ``subagent_stop`` ends it as done or failed with its summary (``POST /subagents/{id}/stop``);
- between a running child's steps, ``pre_tool_call`` drains its mailbox
  (``GET /subagents/{id}/mailbox``) and blocks the tool once the child must stop, and
  ``transform_tool_result`` appends the operator's messages to the tool's result, then
  acknowledges them (``POST /subagents/{id}/mailbox/ack``).

Standard library only: it runs in whatever Python the Hermes release ships. No hook ever
raises into Hermes (a raising ``pre_tool_call`` would block the tool in later releases), and
an unreachable socket is logged once while the run goes on.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.parse

logger = logging.getLogger("hermes_host")

# SOCKET_ENV names the worker's hook socket; the worker sets it only when it serves hooks.
SOCKET_ENV = "HERMES_HOST_HOOKS_SOCKET"

# TIMEOUT_SECONDS bounds each socket call, well inside Hermes' own 30 s hook timeout.
TIMEOUT_SECONDS = 5.0

# BACKOFF_SECONDS: after the socket failed, the per-step calls (mailbox, ack) wait this long
# before trying again, so a hung socket does not slow every step of a child by a timeout.
BACKOFF_SECONDS = 10.0

# The host's limits (hermeshost/subagent: MaxGoalLen, MaxRoleLen, MaxSummaryLen, in
# characters): it refuses longer text, so the text is clipped here rather than lost.
MAX_GOAL = 4000
MAX_ROLE = 200
MAX_SUMMARY = 16000

# MAX_ACK is how many message ids one acknowledgement may name (subagent.MaxPending).
MAX_ACK = 1000

# Hermes' delegate_task ends a child "completed" when it produced a summary; every other word
# it uses ("failed", "error", "timeout", "interrupted") is a failure to the host. A child the
# operator cancelled is recorded as cancelled by the host whatever it reports.
DONE_STATUSES = frozenset({"completed", "complete", "success", "succeeded", "done"})


def status_for(hermes_status):
    """The host's stop status (done or failed) for Hermes' child_status."""
    if isinstance(hermes_status, str) and hermes_status.strip().lower() in DONE_STATUSES:
        return "done"
    return "failed"


def _text(value, limit):
    """value as the host takes text: a string without NUL characters, clipped to limit."""
    if value is None:
        return ""
    if not isinstance(value, str):
        value = str(value)
    return value.replace("\x00", "")[:limit]


def _name(value):
    """value when it is a non-empty string (an id), else None."""
    return value if isinstance(value, str) and value else None


def stop_text(status, reason):
    """What a blocked tool tells a child that must stop."""
    if status == "cancelling":
        text = "The operator running this job has cancelled this subagent"
    else:
        text = "The host has ended this subagent (its status is %s)" % (status or "unknown")
    if isinstance(reason, str) and reason:
        text += ". Reason given: " + reason
    return text + (
        ". Stop now: do not call any more tools. Reply at once with a short report of what"
        " you have done so far and what is left undone."
    )


def _as_text(result):
    """A tool's result as the string Hermes hands the model."""
    if isinstance(result, str):
        return result
    if result is None:
        return ""
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


def render_messages(messages):
    """The operator's messages, marked off from the tool's own output."""
    lines = [
        "",
        "",
        "--- Messages from the operator running this job (sent to this subagent while it"
        " worked; they are not part of the tool's output) ---",
    ]
    for m in messages:
        lines.append("[message %d from %s]" % (m["id"], m["sender"]))
        lines.append(m["body"])
    lines.append("--- end of the operator's messages ---")
    return "\n".join(lines)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 to a unix socket: the worker's hook socket is one."""

    def __init__(self, path, timeout):
        super().__init__("hermes-host-hooks", timeout=timeout)
        self._socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self._socket_path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _Child:
    """A child the host recorded, and what this process knows of its mailbox."""

    def __init__(self, child_id, session):
        self.id = child_id
        self.session = session
        self.pending = []  # drained, not yet in a tool result
        self.seen = set()  # ids ever taken into pending: the mailbox redelivers until acked
        self.unacked = []  # in a tool result, acknowledgement not yet accepted
        self.stop = None  # the block text, once the child must stop
        self.stop_told = False  # the stop was appended to a result already


class HookClient:
    """The four hooks, carried to the hook socket at path."""

    def __init__(self, path, timeout=TIMEOUT_SECONDS, backoff=BACKOFF_SECONDS):
        self.path = path
        self.timeout = timeout
        self.backoff = backoff
        self._lock = threading.Lock()
        self._by_session = {}
        self._by_id = {}
        self._down = False
        self._retry_at = 0.0
        self._refusals = set()

    def hooks(self):
        """Hook name -> callback, for ctx.register_hook."""
        return {
            "subagent_start": self.subagent_start,
            "subagent_stop": self.subagent_stop,
            "pre_tool_call": self.pre_tool_call,
            "transform_tool_result": self.transform_tool_result,
        }

    # -- the hooks: each catches everything, since Hermes must never see a plugin's error --

    def subagent_start(self, **kwargs):
        try:
            self._start(kwargs)
        except Exception:
            logger.exception("hermes_host: subagent_start failed")
        return None

    def subagent_stop(self, **kwargs):
        try:
            self._stop(kwargs)
        except Exception:
            logger.exception("hermes_host: subagent_stop failed")
        return None

    def pre_tool_call(self, **kwargs):
        try:
            return self._pre_tool_call(kwargs)
        except Exception:
            logger.exception("hermes_host: pre_tool_call failed")
            return None

    def transform_tool_result(self, **kwargs):
        try:
            return self._transform(kwargs)
        except Exception:
            logger.exception("hermes_host: transform_tool_result failed")
            return None

    # -- what they do --

    def _start(self, kw):
        child_id = _name(kw.get("child_subagent_id"))
        if child_id is None:
            logger.warning("hermes_host: subagent_start without a child_subagent_id; the child goes unreported")
            return
        body = {"id": child_id, "goal": _text(kw.get("child_goal"), MAX_GOAL)}
        for field, kwarg in (
            ("session_id", "child_session_id"),
            ("parent_session", "parent_session_id"),
            ("parent_subagent", "parent_subagent_id"),
        ):
            value = _name(kw.get(kwarg))
            if value is not None:
                body[field] = value
        role = _text(kw.get("child_role"), MAX_ROLE)
        if role:
            body["role"] = role
        status, _ = self._call("POST", "/subagents", body, "start")
        if not 200 <= status < 300:
            return
        child = _Child(child_id, body.get("session_id"))
        with self._lock:
            self._by_id[child_id] = child
            if child.session is not None:
                self._by_session[child.session] = child

    def _stop(self, kw):
        session = _name(kw.get("child_session_id"))
        with self._lock:
            child = self._by_session.pop(session, None) if session is not None else None
            if child is not None:
                self._by_id.pop(child.id, None)
        if child is None:
            return  # not a child the host recorded
        self._flush_acks(child, force=True)
        body = {"status": status_for(kw.get("child_status")), "summary": _text(kw.get("child_summary"), MAX_SUMMARY)}
        self._call("POST", self._route(child, "/stop"), body, "stop")

    def _pre_tool_call(self, kw):
        child = self._child_for(kw)
        if child is None:
            return None  # the parent's own step, or a child the host does not know
        if child.stop is None:
            self._flush_acks(child)
            self._drain(child)
        if child.stop is not None:
            with self._lock:
                child.stop_told = True
            return {"action": "block", "message": child.stop}
        return None

    def _transform(self, kw):
        child = self._child_for(kw)
        if child is None:
            return None
        self._flush_acks(child)
        if child.stop is None:
            self._drain(child)
        with self._lock:
            deliver, child.pending = child.pending, []
            child.unacked.extend(m["id"] for m in deliver)
            tell_stop = child.stop is not None and not child.stop_told
            if tell_stop:
                child.stop_told = True
        if not deliver and not tell_stop:
            return None
        text = _as_text(kw.get("result"))
        if deliver:
            text += render_messages(deliver)
        if tell_stop:
            text += "\n\n--- The host ---\n" + child.stop
        # Acknowledged now: this result is what Hermes hands the model next.
        self._flush_acks(child)
        return text

    def _child_for(self, kw):
        """The child a tool call is a step of: its session, or its task (a child's task id is
        its subagent id in Hermes' delegate_task)."""
        session = _name(kw.get("session_id"))
        task = _name(kw.get("task_id"))
        with self._lock:
            if session is not None and session in self._by_session:
                return self._by_session[session]
            if task is not None:
                return self._by_id.get(task)
        return None

    def _drain(self, child):
        if self._backing_off():
            return
        status, box = self._call("GET", self._route(child, "/mailbox?wait_ms=0"), None, "mailbox")
        if not 200 <= status < 300 or not isinstance(box, dict):
            return
        messages = box.get("messages")
        with self._lock:
            for m in messages if isinstance(messages, list) else []:
                mid = m.get("id") if isinstance(m, dict) else None
                if not isinstance(mid, int) or isinstance(mid, bool) or mid in child.seen:
                    continue
                child.seen.add(mid)
                sender, body = m.get("sender"), m.get("body")
                child.pending.append({
                    "id": mid,
                    "sender": sender if isinstance(sender, str) and sender else "operator",
                    "body": body if isinstance(body, str) else "",
                })
            if box.get("stop") is True and child.stop is None:
                child.stop = stop_text(box.get("status"), box.get("cancel_reason"))

    def _flush_acks(self, child, force=False):
        """Acknowledge what reached a tool result; kept for the next step while the socket
        cannot be reached, dropped when the host refuses it."""
        if not force and self._backing_off():
            return
        with self._lock:
            ids, child.unacked = child.unacked, []
        while ids:
            batch = ids[:MAX_ACK]
            status, _ = self._call("POST", self._route(child, "/mailbox/ack"), {"ids": batch}, "ack")
            if status == 0:
                with self._lock:
                    child.unacked = ids + child.unacked
                return
            ids = ids[MAX_ACK:]

    @staticmethod
    def _route(child, rest):
        return "/subagents/" + urllib.parse.quote(child.id, safe="") + rest

    def _backing_off(self):
        with self._lock:
            return self._down and time.monotonic() < self._retry_at

    def _call(self, method, path, body, what):
        """One request; (status, decoded answer). Status 0: the socket could not be reached."""
        conn = _UnixConnection(self.path, self.timeout)
        try:
            headers = {}
            payload = None
            if body is not None:
                payload = json.dumps(body).encode("utf-8")
                headers["Content-Type"] = "application/json"
            conn.request(method, path, body=payload, headers=headers)
            resp = conn.getresponse()
            status, raw = resp.status, resp.read()
        except Exception as exc:
            self._unreachable(exc)
            return 0, None
        finally:
            conn.close()
        self._reached()
        try:
            answer = json.loads(raw.decode("utf-8")) if raw else None
        except ValueError:
            answer = None
        if 200 <= status < 300:
            return status, answer
        self._refused(what, status, answer)
        return status, None

    def _unreachable(self, exc):
        with self._lock:
            first = not self._down
            self._down = True
            self._retry_at = time.monotonic() + self.backoff
        if first:
            logger.warning(
                "hermes_host: the host's hook socket %s cannot be reached (%s); subagents go"
                " unreported and unsteered until it answers", self.path, exc)

    def _reached(self):
        with self._lock:
            was_down, self._down = self._down, False
        if was_down:
            logger.info("hermes_host: the host's hook socket %s answers again", self.path)

    def _refused(self, what, status, answer):
        code, message = "", ""
        if isinstance(answer, dict):
            err = answer.get("error")
            if isinstance(err, dict):  # {"error": {"code", "message"}}
                code, message = str(err.get("code", "")), str(err.get("message", ""))
            elif err is not None:  # {"error": code, "message": ...}, the host's own shape
                code, message = str(err), str(answer.get("message", ""))
        key = (what, status, code)
        with self._lock:
            if key in self._refusals:
                return
            self._refusals.add(key)
        logger.warning("hermes_host: the host refused the %s hook: %d %s %s", what, status, code, message)


def register(ctx):
    """Hermes' entry point. Without the worker's hook socket the plugin does nothing."""
    try:
        path = os.environ.get(SOCKET_ENV, "")
        if not path:
            return
        for name, callback in HookClient(path).hooks().items():
            ctx.register_hook(name, callback)
    except Exception:
        logger.exception("hermes_host: could not register its hooks")
