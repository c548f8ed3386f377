// The command palette (Ctrl-K / ⌘K, or "/") and the page's keyboard shortcuts. The palette
// asks the server (/search/?format=json, console/palette.py), which answers only what the
// user may open. Without JavaScript, the "Search" link in the top bar opens the same search
// as a page. Shortcuts are listed on /search/#shortcuts; none act while a field or the
// terminal has the focus.
(function () {
  "use strict";

  const opener = document.getElementById("palette-open");
  if (!opener || !window.HTMLDialogElement) return;
  const searchUrl = opener.getAttribute("href");
  const isMac = /Mac|iPhone|iPad/.test(navigator.platform || "");
  const kbd = opener.querySelector("kbd");
  if (kbd && isMac) kbd.textContent = "⌘K";

  const KIND_WORDS = { page: "Page", space: "Space", session: "Session", config: "Config", skill: "Skill" };
  const GO = { d: "dashboard", s: "spaces", e: "sessions", k: "skills", j: "jobs" }; // g + key: a nav section

  let dialog = null;
  let input = null;
  let list = null;
  let status = null;
  let hits = [];
  let active = -1;
  let timer = null;
  let asked = 0;

  function build() {
    dialog = document.createElement("dialog");
    dialog.className = "palette";
    dialog.setAttribute("aria-label", "Command palette");
    const form = document.createElement("form");
    form.method = "get";
    form.action = searchUrl;
    form.setAttribute("role", "search");
    input = document.createElement("input");
    input.type = "search";
    input.name = "q";
    input.id = "palette-input";
    input.autocomplete = "off";
    input.placeholder = "Jump to a space, session, config, skill or page…";
    input.setAttribute("role", "combobox");
    input.setAttribute("aria-label", "Search");
    input.setAttribute("aria-expanded", "false");
    input.setAttribute("aria-controls", "palette-list");
    input.setAttribute("aria-autocomplete", "list");
    list = document.createElement("ul");
    list.id = "palette-list";
    list.setAttribute("role", "listbox");
    list.setAttribute("aria-label", "Results");
    status = document.createElement("p");
    status.className = "palette-status";
    status.setAttribute("role", "status");
    const help = document.createElement("p");
    help.className = "palette-help";
    help.textContent = "↑ ↓ to move · Enter to open · Esc to close · ";
    const more = document.createElement("a");
    more.href = searchUrl + "#shortcuts";
    more.textContent = "all shortcuts";
    help.appendChild(more);
    form.appendChild(input);
    dialog.appendChild(form);
    dialog.appendChild(list);
    dialog.appendChild(status);
    dialog.appendChild(help);
    document.body.appendChild(dialog);

    input.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(ask, 120);
    });
    input.addEventListener("keydown", function (event) {
      if (event.key === "ArrowDown" || event.key === "ArrowUp") {
        event.preventDefault();
        if (!hits.length) return;
        const step = event.key === "ArrowDown" ? 1 : -1;
        select((active + step + hits.length) % hits.length);
      } else if (event.key === "Enter" && active >= 0 && hits[active]) {
        event.preventDefault();
        window.location.assign(hits[active].url);
      }
    });
    list.addEventListener("click", function (event) {
      const item = event.target.closest("[role=option]");
      if (item) window.location.assign(hits[Number(item.dataset.index)].url);
    });
    dialog.addEventListener("click", function (event) {
      if (event.target === dialog) dialog.close(); // a click on the backdrop
    });
  }

  function select(index) {
    active = index;
    list.querySelectorAll("[role=option]").forEach(function (item, i) {
      item.setAttribute("aria-selected", i === index ? "true" : "false");
      if (i === index) item.scrollIntoView({ block: "nearest" });
    });
    if (index >= 0) input.setAttribute("aria-activedescendant", "palette-option-" + index);
    else input.removeAttribute("aria-activedescendant");
  }

  function show(results) {
    hits = results;
    list.textContent = "";
    results.forEach(function (hit, i) {
      const item = document.createElement("li");
      item.id = "palette-option-" + i;
      item.setAttribute("role", "option");
      item.dataset.index = String(i);
      const kind = document.createElement("span");
      kind.className = "palette-kind";
      kind.textContent = KIND_WORDS[hit.kind] || hit.kind;
      const label = document.createElement("span");
      label.className = "palette-label";
      label.textContent = hit.label;
      const detail = document.createElement("span");
      detail.className = "palette-detail";
      detail.textContent = hit.detail;
      item.appendChild(kind);
      item.appendChild(label);
      item.appendChild(detail);
      list.appendChild(item);
    });
    input.setAttribute("aria-expanded", results.length ? "true" : "false");
    status.textContent = results.length ? results.length + " results" : "Nothing you can open matches.";
    select(results.length ? 0 : -1);
  }

  async function ask() {
    const query = input.value;
    const mine = ++asked;
    try {
      const response = await fetch(searchUrl + "?format=json&q=" + encodeURIComponent(query), {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (mine !== asked) return; // a later keystroke asked again
      if (!response.ok) throw new Error("HTTP " + response.status);
      show((await response.json()).results || []);
    } catch (err) {
      if (mine === asked) status.textContent = "Search failed: " + err.message;
    }
  }

  function open() {
    if (!dialog) build();
    if (dialog.open) return;
    dialog.showModal();
    input.value = "";
    input.focus();
    ask();
  }

  opener.addEventListener("click", function (event) {
    if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey) return;
    event.preventDefault();
    open();
  });

  function typing(target) {
    if (!target || !target.closest) return false;
    // Just closed, the palette's input may keep the focus until the browser's next rendering
    // update: keys meant as shortcuts must not count as typing into it.
    if (dialog && !dialog.open && dialog.contains(target)) return false;
    return Boolean(target.closest("input, textarea, select, [contenteditable], .xterm"));
  }

  let leader = 0; // when "g" was pressed
  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented) return;
    if ((event.ctrlKey || event.metaKey) && !event.altKey && !event.shiftKey && event.key.toLowerCase() === "k") {
      if (event.target.closest && event.target.closest(".xterm")) return; // Ctrl-K is the shell's
      event.preventDefault();
      open();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || typing(event.target) || (dialog && dialog.open)) return;
    if (event.key === "/") {
      event.preventDefault();
      open();
    } else if (event.key === "?") {
      window.location.assign(searchUrl + "#shortcuts");
    } else if (event.key === "g") {
      leader = Date.now();
    } else if (leader && Date.now() - leader < 1500 && GO[event.key]) {
      leader = 0;
      const link = document.querySelector('.mainnav a[data-section="' + GO[event.key] + '"]');
      if (link) window.location.assign(link.href);
    } else {
      leader = 0;
    }
  });

  window.consolePalette = { open: open };
})();
