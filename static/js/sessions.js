// The sessions list's live refresh: every few seconds the results are fetched again (the
// URL the page shows, filters and page included), but only while the tab is visible and
// the user is not choosing rows there (a ticked box).
// Without JavaScript the page has a Refresh link instead.
(function () {
  "use strict";

  function busy(results) {
    return results.querySelector("input[name=session]:checked") !== null;
  }

  function refresh(results) {
    if (document.visibilityState !== "visible" || busy(results) || !window.htmx) { return; }
    window.htmx.ajax("GET", window.location.pathname + window.location.search, {
      target: "#session-results", swap: "innerHTML", headers: { "HX-Target": "session-results" }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var results = document.getElementById("session-results");
    if (!results) { return; }
    var seconds = parseInt(results.getAttribute("data-live-refresh"), 10) || 10;
    document.querySelectorAll(".live-status").forEach(function (note) { note.hidden = false; });
    var timer = null;
    function start() { if (timer === null) { timer = setInterval(function () { refresh(results); }, seconds * 1000); } }
    function stop() { if (timer !== null) { clearInterval(timer); timer = null; } }
    document.addEventListener("visibilitychange", function () {
      if (document.visibilityState === "visible") { refresh(results); start(); } else { stop(); }
    });
    if (document.visibilityState === "visible") { start(); }
  });
})();
