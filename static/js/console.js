// The console's own small script: copy buttons. Pages work without it (the buttons stay hidden).
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

  document.addEventListener("DOMContentLoaded", function () { reveal(document); });
  document.addEventListener("htmx:load", function (event) { reveal(event.target); });
})();
