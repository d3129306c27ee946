// The dashboards' one script of their own. A row that both an action's answer and the live
// stream swap (a subagent's: Cancel, Send message) carries the version of what it shows on
// an element inside it (data-version, the handle's last change). The two race: the stream
// may deliver the subagent's next change (it stopped) before the answer to the action that
// caused it (the cancel) arrives, and the older answer would then stay on the row for good.
// A swap whose content is older than what its target shows is refused, whichever way it came.
(function () {
  "use strict";

  function shown(target) {
    var v = target && target.querySelector ? target.querySelector("[data-version]") : null;
    return v ? Number(v.getAttribute("data-version")) : NaN;
  }

  function carried(html) {
    var m = /data-version="(\d+)"/.exec(typeof html === "string" ? html : "");
    return m ? Number(m[1]) : NaN;
  }

  // older is true only when both are known and the new content is behind.
  function older(target, html) {
    var have = shown(target), got = carried(html);
    return !isNaN(have) && !isNaN(got) && got < have;
  }

  // An action's answer (hx-post from the row's forms).
  document.addEventListener("htmx:beforeSwap", function (e) {
    if (older(e.detail.target, e.detail.serverResponse)) {
      e.detail.shouldSwap = false;
    }
  });

  // A live update (htmx's SSE extension: the event's target is the row it swaps into).
  document.addEventListener("htmx:sseBeforeMessage", function (e) {
    if (older(e.target, e.detail && e.detail.data)) {
      e.preventDefault();
    }
  });
})();
