// The console's own small script: copy buttons, times in the reader's zone, the folding top
// bar. Pages work without it (the buttons stay hidden, times read UTC, the groups stay open).
(function () {
  "use strict";

  function reveal(root) {
    (root || document).querySelectorAll(".copy-button[hidden]").forEach(function (button) {
      button.hidden = false;
    });
  }

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    // Plain http on another host: the older way, through a selected text area.
    return new Promise(function (resolve, reject) {
      var area = document.createElement("textarea");
      area.value = text;
      area.setAttribute("readonly", "");
      area.style.position = "fixed";
      area.style.opacity = "0";
      document.body.appendChild(area);
      area.select();
      var ok = false;
      try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
      document.body.removeChild(area);
      if (ok) { resolve(); } else { reject(new Error("copy refused")); }
    });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest(".copy-button");
    if (!button) { return; }
    var label = button.textContent;
    copyText(button.getAttribute("data-copy") || "").then(function () {
      button.textContent = "Copied";
      button.classList.add("copied");
    }, function () {
      button.textContent = "Select and copy";
    });
    setTimeout(function () { button.textContent = label; button.classList.remove("copied"); }, 1500);
  });

  // Times: <time class="when" datetime> from the `when` filter (console/templatetags) reads
  // "3 min ago", its title the absolute time in the reader's own zone.
  var relative = window.Intl && Intl.RelativeTimeFormat ? new Intl.RelativeTimeFormat(undefined, { numeric: "auto" }) : null;
  var absolute = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
  });
  var STEPS = [["second", 60], ["minute", 60], ["hour", 24], ["day", 7], ["week", 4.35], ["month", 12], ["year", Infinity]];

  function ago(moment, now) {
    var amount = (moment - now) / 1000;
    if (Math.abs(amount) < 45) { return amount > 0 ? "in a few seconds" : "just now"; }
    for (var i = 0; i < STEPS.length; i += 1) {
      if (Math.abs(amount) < STEPS[i][1]) { return relative.format(Math.round(amount), STEPS[i][0]); }
      amount /= STEPS[i][1];
    }
    return "";
  }

  function localTimes(root) {
    if (!relative) { return; }
    var now = Date.now();
    (root || document).querySelectorAll("time.when[datetime]").forEach(function (node) {
      var moment = new Date(node.getAttribute("datetime"));
      if (isNaN(moment)) { return; }
      if (!node.dataset.utc) { node.dataset.utc = node.textContent; }
      node.textContent = ago(moment.getTime(), now);
      node.title = absolute.format(moment) + " (" + node.dataset.utc.replace(/ UTC$/, "") + " UTC)";
    });
  }

  // The top bar on a narrow screen: the groups fold under "Menu".
  function foldingNav() {
    var toggle = document.getElementById("nav-toggle");
    var nav = document.getElementById("topnav");
    if (!toggle || !nav) { return; }
    document.documentElement.classList.add("nav-folds");
    toggle.hidden = false;
    toggle.addEventListener("click", function () {
      var open = toggle.getAttribute("aria-expanded") !== "true";
      toggle.setAttribute("aria-expanded", open ? "true" : "false");
      nav.classList.toggle("open", open);
    });
    // One drop-down open at a time; a click elsewhere or Esc closes them.
    document.addEventListener("click", function (event) {
      document.querySelectorAll("details.navdrop[open]").forEach(function (drop) {
        if (!drop.contains(event.target)) { drop.open = false; }
      });
    });
    document.addEventListener("keydown", function (event) {
      if (event.key !== "Escape") { return; }
      document.querySelectorAll("details.navdrop[open]").forEach(function (drop) {
        drop.open = false;
        drop.querySelector("summary").focus();
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    reveal(document);
    localTimes(document);
    foldingNav();
    setInterval(function () { localTimes(document); }, 30000);
  });
  document.addEventListener("htmx:load", function (event) { reveal(event.target); localTimes(event.target); });
})();
